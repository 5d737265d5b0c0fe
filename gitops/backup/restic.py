"""restic, run against one backup target: init on first use, back up, list, forget, dump.

restic gets an environment of its own (`environment`), never the controller's whole one: only that
reaches restic and the ssh it runs for an sftp target. The password reaches restic through
`--password-file /proc/self/fd/N`, a pipe restic reads to its end before it opens the repository:
never in an environment (restic hands its own to ssh), on a command line or on disk.

Snapshots of a cluster carry the tags `gitops`, `cluster=NAME`, `revision=N`, `bytes=N` and
`member=NODE`, so listing them needs no repository walk (restic 0.14 keeps no size).
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from gitops.backup.snapshot import Snapshot
from gitops.backup.targets import kind_of
from gitops.errors import GitopsError
from gitops.model.config import BackupTarget
from gitops.redact import redact

RESTIC = "restic"
#: restic's words for "no repository here yet" (then gitops initialises it)
NOT_INITIALISED = ("Is there a repository at the following location?", "unable to open config file")
#: a restic call longer than this is stuck (a snapshot of a full 8 GiB etcd takes minutes, not hours)
TIMEOUT = 3600.0
#: the controller's environment variables every restic run gets (`PREFIX*`: each that starts so); a target's
#: kind adds its own (`targets.TargetKind.env`). restic's tuning knobs only: no RESTIC_PASSWORD*, no repository.
ENVIRONMENT = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "RESTIC_PACK_SIZE", "RESTIC_COMPRESSION",
               "RESTIC_READ_CONCURRENCY")
#: the longest password: what any pipe holds before restic reads it (one page, PIPE_BUF)
MAX_PASSWORD = 4096


class BackupError(GitopsError):
    pass


def stored_name(cluster: str) -> str:
    """The file name a cluster's snapshots are stored under in the repository."""
    return f"{cluster}-etcd.db"


def environment(target: BackupTarget, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """restic's whole environment for `target`: of `environ` (default: the controller's), only the variables
    of ENVIRONMENT and of the target's kind; PATH at least the system default. Never a password."""
    environ = os.environ if environ is None else environ
    wanted = (*ENVIRONMENT, *kind_of(target).env)
    env = {name: value for name, value in environ.items()
           if any(fnmatch.fnmatchcase(name, pattern) for pattern in wanted)}
    env.setdefault("PATH", os.defpath)
    return env


def _password_pipe(target: BackupTarget) -> int:
    """The read end of a pipe holding the target's password whole (its write end closed), for restic's
    `--password-file /proc/self/fd/N`: read once, before the repository (and an sftp target's ssh) opens."""
    if target.password != target.password.strip():  # restic trims a password file's whitespace
        raise BackupError(f"backup target {target.name}: its password begins or ends with whitespace, which "
                          "restic cuts off a password file; use one without (`restic key passwd` changes it)")
    if len(target.password.encode()) > MAX_PASSWORD:
        raise BackupError(f"backup target {target.name}: its password is longer than {MAX_PASSWORD} bytes")
    return _pipe(target, target.password.encode(), "password")


def _repository_pipe(target: BackupTarget) -> int:
    """The read end of a pipe holding the target's repository, for restic's `--repository-file
    /proc/self/fd/N`: a rest: URL's user and password never reach restic's command line, which anyone on the
    host can read in /proc/PID/cmdline."""
    return _pipe(target, target.repository.strip().encode(), "repository")


def _pipe(target: BackupTarget, data: bytes, what: str) -> int:
    read, write = os.pipe()
    try:
        os.set_blocking(write, False)  # (it fits a pipe's buffer: a pipe that is smaller fails, never waits)
        if os.write(write, data) != len(data):
            raise BlockingIOError
    except OSError:
        os.close(read)
        raise BackupError(f"backup target {target.name}: its {what} does not fit a pipe to restic") from None
    finally:
        os.close(write)
    return read


class Restic:
    def __init__(self, target: BackupTarget, binary: str = RESTIC):
        self.target = target
        self._argv = [binary, "--no-cache", *kind_of(target).options(target)]

    def _run(self, *args: str, stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        password = _password_pipe(self.target)
        try:
            repository = _repository_pipe(self.target)
        except BackupError:
            os.close(password)
            raise
        try:
            done = subprocess.run([*self._argv, "--repository-file", f"/proc/self/fd/{repository}",
                                   "--password-file", f"/proc/self/fd/{password}", *args],
                                  stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                  stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=environment(self.target), pass_fds=(password, repository), timeout=TIMEOUT,
                                  check=False)
        except FileNotFoundError:
            raise BackupError("restic is not installed (Debian: apt install restic)") from None
        except subprocess.TimeoutExpired:
            raise BackupError(f"backup target {self.target.name}: restic {args[0]} took over {TIMEOUT:.0f}s") from None
        finally:
            os.close(password)
            os.close(repository)
        if check and done.returncode != 0:
            raise BackupError(f"backup target {self.target.name}: restic {args[0]} failed: {self._why(done)}")
        return done

    @staticmethod
    def _why(done: subprocess.CompletedProcess) -> str:
        lines = [ln for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
        return redact("; ".join(lines[-3:])) or f"exit {done.returncode}"  # (a rest: URL's user and password)

    def ensure_repository(self) -> None:
        """Initialise the repository unless it exists (a wrong password is an error, never a new one)."""
        probe = self._run("cat", "config", check=False)
        if probe.returncode == 0:
            return
        if not any(word in probe.stderr.decode(errors="replace") for word in NOT_INITIALISED):
            raise BackupError(f"backup target {self.target.name}: cannot open its restic repository: "
                              f"{self._why(probe)}")
        self._run("init")

    def backup(self, snapshot_file: Path, cluster: str, revision: int, member: str) -> Snapshot:
        """Store `snapshot_file` as the cluster's snapshot; returns it as listed."""
        size = snapshot_file.stat().st_size
        with snapshot_file.open("rb") as data:
            done = self._run("backup", "--json", "--host", "gitops", "--stdin", "--stdin-filename",
                             stored_name(cluster), "--tag", "gitops", "--tag", f"cluster={cluster}",
                             "--tag", f"revision={revision}", "--tag", f"bytes={size}", "--tag", f"member={member}",
                             stdin=data)
        summary = [json.loads(ln) for ln in done.stdout.decode().splitlines() if '"summary"' in ln]
        if not summary or not summary[-1].get("snapshot_id"):
            raise BackupError(f"backup target {self.target.name}: restic backup printed no snapshot id")
        wanted = summary[-1]["snapshot_id"]  # restic 0.14 prints the short id, later ones the full id
        listed = self.snapshots(cluster)
        for snap in listed:
            if snap.id.startswith(wanted):
                return snap
        raise BackupError(f"backup target {self.target.name}: snapshot {wanted[:8]} is not listed after backup "
                          f"(listed: {', '.join(s.short_id for s in listed) or 'none'})")

    def snapshots(self, cluster: str) -> list[Snapshot]:
        """The cluster's snapshots, oldest first."""
        done = self._run("snapshots", "--json", "--tag", f"cluster={cluster}")
        out = [parse_snapshot(raw) for raw in json.loads(done.stdout or b"[]")]
        return sorted((s for s in out if s is not None and s.cluster == cluster), key=lambda s: (s.time, s.id))

    def forget(self, cluster: str, keep: int) -> None:
        """Keep the cluster's `keep` newest snapshots, prune the rest's data."""
        self._run("forget", "--tag", f"cluster={cluster}", "--keep-last", str(keep), "--prune")

    def dump(self, snapshot_id: str, cluster: str, out: IO[bytes]) -> None:
        """Write the stored etcd snapshot of `snapshot_id` to `out`."""
        self._run("dump", snapshot_id, f"/{stored_name(cluster)}", stdout=out)


def parse_snapshot(raw: dict) -> Snapshot | None:
    """One `restic snapshots --json` entry; None when gitops did not make it (no `cluster=` tag). One of
    gitops's that does not parse is an error, never silently left out."""
    tags = dict(t.split("=", 1) for t in raw.get("tags") or () if "=" in t)
    if "cluster" not in tags:
        return None
    try:
        return Snapshot(id=raw["id"], time=dt.datetime.fromisoformat(_seconds(raw["time"])),
                        cluster=tags["cluster"], revision=int(tags.get("revision", 0)),
                        bytes=int(tags.get("bytes", 0)), member=tags.get("member", ""))
    except (KeyError, ValueError, TypeError) as err:
        raise BackupError(f"restic snapshot {str(raw.get('id', '?'))[:8]} does not read as gitops's: {err}") from None


def _seconds(stamp: str) -> str:
    """restic's RFC 3339 time (Go's: 0-9 fraction digits, trailing zeros cut; `Z` or an offset), as
    fromisoformat reads it (exactly 6 fraction digits)."""
    match = _RFC3339.fullmatch(stamp.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    head, fraction, zone = match.groups()
    return f"{head}.{(fraction or '').ljust(6, '0')[:6]}{'+00:00' if zone in ('Z', 'z') else zone}"


_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})")
