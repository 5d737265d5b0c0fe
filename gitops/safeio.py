"""The one way gitops reads a file it is given (the repo's YAML, gitops.yaml, state, saved plans,
identities) and writes one of its own (`write_atomic`).

Regular files only (a FIFO, a device, a socket or a directory is refused, nothing waits on
it), checked with `fstat` on the descriptor that is then read; at most `limit` bytes (the
read stops at `limit + 1`, so a huge or sparse file costs no memory); a symlink loop, a
dangling link or a link out of `inside` is a one-line `FileRefused`, never a traceback.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import tempfile

from gitops.errors import GitopsError
from gitops.printable import printable

MiB = 1024 * 1024
_CHUNK = MiB


class FileRefused(GitopsError):
    """A file that is not read: `reason` says why (without the path, for diagnostics that carry it)."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{printable(self.path)}: {reason}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit >= MiB and limit % MiB == 0 else f"{limit} bytes"


def within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether `path`, every symlink resolved (a loop left as is, never raising), lies under `root`."""
    return _under(os.path.realpath(path), os.path.realpath(root))


def _under(real: str, base: str) -> bool:
    return real == base or real.startswith(base.rstrip("/") + "/")


def read_bytes(path: str | os.PathLike[str], limit: int, *, inside: str | os.PathLike[str] | None = None,
               name: str | None = None, resolved: bool = False) -> bytes:
    """The content of the regular file `path`, at most `limit` bytes, or `FileRefused`.

    With `inside`, the file (symlinks resolved) must lie under that directory; `resolved`: the
    caller found `path` under `inside` (itself resolved) with no link in it, listing directories
    without following any, so it is not resolved again: a link put in the file's place since is
    refused by the open, one put in a directory's place by checking where the open file lies.
    `name` is how errors call the file (default: `path`).
    """
    shown = name if name is not None else str(path)
    try:
        info = os.lstat(path) if resolved else os.stat(path)
    except OSError as err:
        raise FileRefused(shown, _why(path, err)) from None
    real = ""  # (resolved once: checked here, opened below)
    if inside is not None:
        real = os.fspath(path) if resolved else os.path.realpath(path)
        if not resolved and not _under(real, os.path.realpath(inside)):
            raise FileRefused(shown, "symlink points outside the repo; refusing to read it")
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(shown, f"is {_kind(info.st_mode)}, not a regular file; refusing to read it")
    if info.st_size > limit:
        raise FileRefused(shown, f"file is larger than {_size(limit)} ({info.st_size} bytes); refusing to read it")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if inside is not None:  # open what was checked: the resolved name, whose last part is no link by now
        path, flags = real, flags | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise FileRefused(shown, _why(path, err)) from None
    try:
        if resolved and inside is not None and not _opened_under(fd, os.fspath(inside)):
            raise FileRefused(shown, "symlink points outside the repo; refusing to read it")
        info = os.fstat(fd)  # what is read, whatever the name points at by now
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(shown, f"is {_kind(info.st_mode)}, not a regular file; refusing to read it")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileRefused(shown, f"file is larger than {_size(limit)}; refusing to read it")
        return b"".join(chunks)
    except OSError as err:
        raise FileRefused(shown, _why(path, err)) from None
    finally:
        os.close(fd)


def _opened_under(fd: int, base: str) -> bool:
    """Whether the open file `fd` lies under the resolved directory `base`: a directory of its path
    replaced by a link after the caller listed it is caught here (where /proc tells, as on Linux)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return True
    return _under(real, base)


def read_text(path: str | os.PathLike[str], limit: int, *, inside: str | os.PathLike[str] | None = None,
              name: str | None = None) -> str:
    """`read_bytes` decoded as UTF-8; a file that is not UTF-8 is `FileRefused` too."""
    data = read_bytes(path, limit, inside=inside, name=name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise FileRefused(name if name is not None else str(path), f"not UTF-8 text (line {line})") from None


def _why(path: str | os.PathLike[str], err: OSError) -> str:
    """A one-line reason for an `OSError` on `path`, naming symlink loops and dangling links."""
    if err.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links); refusing to read it"
    if err.errno == errno.ENOENT and os.path.islink(path):
        return f"dangling symlink (points to {printable(os.readlink(path))!s}, which does not exist)"
    if err.errno == errno.ENOENT:
        return "no such file"
    return f"cannot read: {err.strerror or err}"


__all__ = ["FileRefused", "MiB", "read_bytes", "read_text", "within", "write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o600) -> None:
    """Replace `path` with `data` whole or not at all: written to a temporary file beside it (a hidden
    `.NAME.PID.*.tmp`, mode `mode`), fsynced, renamed over it, then the directory fsynced so the rename
    itself survives a power loss. On any failure the temporary file is removed and `path` is left as it
    was; OSError is raised for the caller to word. What a killed writer left of `path` (its process gone)
    is removed first: such a file may hold the same secrets."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    _sweep(directory or ".", name)
    fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    descriptor = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sweep(directory: str, name: str) -> None:
    """Remove the `.NAME.PID.*.tmp` files of `write_atomic` whose process no longer runs (killed mid-write)."""
    mine = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[A-Za-z0-9_]+\.tmp")  # mkstemp's part: letters, digits, _
    try:
        entries = [(e, found) for e in os.scandir(directory) if (found := mine.fullmatch(e.name))]
    except OSError:
        return
    for entry, found in entries:
        if not _running(int(found.group(1))):
            try:
                os.unlink(entry.path)
            except OSError:
                pass


def _running(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
