"""Process and mount bookkeeping: start daemons detached, stop exactly those (PID + start time), undo
mounts under a directory. The lab and a joined worker both use it."""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gitops.logs import event
from gitops.errors import GitopsError


class ProcError(GitopsError):
    """A process could not be started, stopped, or its mounts undone."""


log = logging.getLogger(__name__)

_MNT_DETACH = 2


@dataclass(frozen=True)
class Proc:
    """A process the lab started: PID plus kernel start time, so a reused PID is never killed."""

    role: str
    hypervisor: str
    pid: int
    start_time: int
    argv: tuple[str, ...]
    log: str

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Proc:
        return cls(role=str(d["role"]), hypervisor=str(d["hypervisor"]), pid=int(d["pid"]),  # type: ignore[call-overload]
                   start_time=int(d["start_time"]), argv=tuple(d["argv"]),  # type: ignore[call-overload,arg-type]
                   log=str(d["log"]))

    def alive(self) -> bool:
        return start_time(self.pid) == self.start_time


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces; everything after the last ')' is space-separated.
    return raw[raw.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone (or a zombie)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def spawn(role: str, hypervisor: str, argv: list[str], log_path: Path, cwd: Path) -> Proc:
    """Start `argv` in its own session (it outlives the CLI), output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 cwd=cwd, start_new_session=True, close_fds=True)
        except OSError as err:
            raise ProcError(f"cannot start {argv[0]}: {err}") from err
    st = None
    for _ in range(100):
        st = start_time(p.pid)
        if st is not None:
            break
        time.sleep(0.01)
    if st is None:
        raise ProcError(f"{argv[0]} exited immediately; see {log_path}")
    event(log, logging.INFO, "started", role=role, hypervisor=hypervisor, pid=p.pid)
    return Proc(role, hypervisor, p.pid, st, tuple(argv), str(log_path))


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def children_map() -> dict[int, list[int]]:
    """parent PID -> child PIDs, for every live process."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    kids = children_map() if kids is None else kids
    out, todo = [], list(kids.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(kids.get(child, []))
    return out


#: programs a lab starts, directly or through containerd: only these are ever leftovers
LAB_PROGRAMS = ("containerd", "containerd-shim", "containerd-shim-runc-v1", "containerd-shim-runc-v2",
                "runc", "haproxy", "ctr")


def ancestors(pid: int) -> list[int]:
    """Parent, grandparent, ... of `pid` (up to init)."""
    out = []
    fields = _stat(pid)
    while fields is not None and int(fields[1]) > 0:
        parent = int(fields[1])
        out.append(parent)
        fields = _stat(parent)
    return out


def pids_referencing(path: Path, programs: tuple[str, ...] | None = None) -> list[int]:
    """Live processes whose command line mentions `path` (e.g. containerd shims of a lab).

    This process and its ancestors (sudo, time, a shell running `... --dir PATH`) are
    never listed; with `programs`, only processes whose argv[0] base name is one of them.
    """
    needle = str(path).encode()
    mine = {os.getpid(), *ancestors(os.getpid())}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle not in raw or start_time(int(entry)) is None:
            continue
        if programs is not None and os.path.basename(raw.split(b"\0", 1)[0].decode(errors="replace")) not in programs:
            continue
        found.append(int(entry))
    return sorted(found)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def shim_socket(argv: list[str]) -> Path | None:
    """Where a containerd-shim-runc-v2 (from its argv) listens: containerd 1.6 puts shim
    sockets in /run/containerd/s/, named sha256(<containerd address>/<namespace>/<id>).
    A killed shim leaves its socket behind."""
    if not argv or not os.path.basename(argv[0]).startswith("containerd-shim"):
        return None
    opts = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("-")}
    if not {"-namespace", "-id", "-address"} <= set(opts):
        return None
    key = os.path.join(opts["-address"], opts["-namespace"], opts["-id"])
    return Path("/run/containerd/s") / hashlib.sha256(key.encode()).hexdigest()


def terminate(pids: list[tuple[int, int | None]], timeout: float = 10.0) -> None:
    """SIGTERM each (pid, start_time) still matching, then SIGKILL whatever is left after `timeout`.

    With `timeout` 0, SIGKILL right away.
    """
    def alive(pid: int, st: int | None) -> bool:
        now = start_time(pid)
        return now is not None and (st is None or now == st)

    stages = ([(signal.SIGTERM, timeout)] if timeout > 0 else []) + [(signal.SIGKILL, 5.0)]
    for sig, wait in stages:
        targets = [(p, st) for p, st in pids if alive(p, st)]
        for pid, _ in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        while time.monotonic() < end:
            for pid, _ in targets:
                _reap(pid)
            if not any(alive(p, st) for p, st in targets):
                return
            time.sleep(0.05)
    left = [p for p, st in pids if alive(p, st)]
    if left:
        raise ProcError(f"processes did not exit: {left}")


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, deepest first."""
    root = str(path.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_under(path: Path) -> list[str]:
    """Lazily unmount everything at or below `path`; returns what was unmounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    done = []
    for _ in range(5):  # stacked mounts need several passes
        points = mounts_under(path)
        if not points:
            break
        for point in points:
            if libc.umount2(point.encode(), _MNT_DETACH) == 0:
                done.append(point)
            else:
                event(log, logging.WARNING, "umount failed", path=point, errno=ctypes.get_errno())
    left = mounts_under(path)
    if left:
        raise ProcError(f"cannot unmount {left}")
    return done
