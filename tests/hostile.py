"""Running `gitops` on hostile input, measured: exit code, output, wall time and peak RSS of the command.

Each case runs the installed console script as a child process (no lab, no root needed),
through a small launcher that waits for it with `os.wait4` (which gives that child's own peak
RSS); a command still running after `KILL_AFTER` seconds is killed, so a hang fails the test
instead of stalling the suite.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

GITOPS = Path(sys.executable).parent / "gitops"
#: a child still running after this is killed (a hang): the case fails, the suite goes on
KILL_AFTER = 60.0
#: the bounds each case asserts unless it says otherwise: the time bound is loose (the machine may be
#: busy), it tells a refusal from a hang or minutes of work; the RSS bound is the tight one
MAX_SECONDS = 20.0
MAX_RSS_MIB = 300


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float
    rss_mib: float
    killed: bool

    @property
    def output(self) -> str:
        return self.out + self.err


#: runs the command and writes its peak RSS (KiB) to the file named first. A child's peak RSS counts
#: the process it was forked from (its pages, until exec), so the command is forked from this small
#: interpreter rather than from pytest, whose size would be a floor under every figure
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


def run_gitops(args: list[str], cwd: Path, *, stdin: str = "", env: dict[str, str] | None = None) -> Ran:
    """Run `gitops ARGS` in `cwd`; its output, input and RSS figure go through unnamed or self-deleting
    temporary files (nothing left behind); killed with its launcher after `KILL_AFTER` seconds."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("GITOPS_")}
    child_env.update(env or {})
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp, \
            tempfile.NamedTemporaryFile("r", prefix="gitops-rss-") as rss:
        inp.write(stdin.encode())
        inp.seek(0)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER, rss.name, str(GITOPS), *args], cwd=cwd,
                                stdin=inp, stdout=out, stderr=err, env=child_env, start_new_session=True)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the command

        timer = threading.Timer(KILL_AFTER, kill)
        timer.start()
        try:
            proc.wait()
        finally:
            timer.cancel()
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        figure = rss.read().strip()
        return Ran(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                   seconds, int(figure) / 1024 if figure else float("inf"), killed.is_set())


@dataclass
class Case:
    """One hostile input: `setup(tmp_path)` builds it and returns the command's arguments."""

    id: str
    setup: Callable[[Path], list[str]]
    code: int
    #: every fragment must appear in stdout+stderr
    says: tuple[str, ...]
    #: none of these may appear
    never: tuple[str, ...] = ()
    max_seconds: float = MAX_SECONDS
    max_rss_mib: float = MAX_RSS_MIB
    #: at most this many lines of output (None: not checked)
    max_lines: int | None = None
    stdin: str = ""
    check: Callable[[Path, Ran], None] | None = field(default=None)


#: cases of a table run this many at a time (each is mostly the interpreter starting)
WORKERS = 4


def assert_table(cases: list[Case], tmp_path: Path) -> None:
    """Run every case of a table, a few at a time, each in its own directory under `tmp_path`;
    fail with every case that broke its promises (by id), not only the first."""
    assert len({c.id for c in cases}) == len(cases), "case ids must be unique"

    def one(case: Case) -> str:
        directory = tmp_path / case.id
        directory.mkdir()
        try:
            assert_case(case, directory)
        except AssertionError as err:
            return f"[{case.id}] {err}"
        return ""

    with ThreadPoolExecutor(WORKERS) as pool:
        failures = [f for f in pool.map(one, cases) if f]
    assert not failures, "\n\n".join(failures)


def assert_case(case: Case, tmp_path: Path) -> Ran:
    """Build the case in `tmp_path`, run it, and assert everything it promises."""
    args = case.setup(tmp_path)
    ran = run_gitops(args, tmp_path, stdin=case.stdin)
    shown = ran.output[-3000:]
    assert not ran.killed, f"gitops {args} still running after {KILL_AFTER}s (a hang): {shown}"
    assert "Traceback" not in ran.output, shown
    assert ran.code == case.code, f"exit {ran.code}, expected {case.code}: {shown}"
    for fragment in case.says:
        assert fragment in ran.output, f"{fragment!r} not in: {shown}"
    for fragment in case.never:
        assert fragment not in ran.output, f"{fragment!r} in: {shown}"
    assert ran.seconds < case.max_seconds, f"took {ran.seconds:.1f}s (bound {case.max_seconds}s)"
    assert ran.rss_mib < case.max_rss_mib, f"peak RSS {ran.rss_mib:.0f} MiB (bound {case.max_rss_mib} MiB)"
    if case.max_lines is not None:
        lines = ran.output.count("\n")
        assert lines <= case.max_lines, f"{lines} lines of output (bound {case.max_lines})"
    if case.check is not None:
        case.check(tmp_path, ran)
    return ran


HYPERVISOR = """\
apiVersion: gitops.infra/v1alpha1
kind: Hypervisor
metadata:
  name: {name}
spec:
  ipAddress: {ip}
  portRange: {{low: 30000, high: 30100}}
  localCRIEndpoint:
    criEndpointPath: /run/{name}.sock
"""


def repo_with(tmp_path: Path, files: dict[str, str | bytes] | None = None, config: str | None = None) -> Path:
    """tmp_path/repo holding `files` (and gitops.yaml when `config` is given)."""
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    if config is not None:
        (repo / "gitops.yaml").write_text(config)
    for rel, content in (files or {}).items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return repo


def config_yaml(spec: str) -> str:
    return "apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n" + spec
