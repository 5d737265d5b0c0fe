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
        return _read_open(fd, limit, shown)
    except OSError as err:
        raise FileRefused(shown, _why(path, err)) from None
    finally:
        os.close(fd)


def _read_open(fd: int, limit: int, shown: str) -> bytes:
    """What the open `fd` holds, at most `limit` bytes, checked with `fstat` to be a regular file (what is
    read, whatever its name points at by now); the read stops at `limit + 1`, so a huge file costs nothing."""
    info = os.fstat(fd)
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


def read_regular(path: str | os.PathLike[str], limit: int, *, name: str | None = None) -> bytes:
    """The content of `path`, at most `limit` bytes, when it is itself a regular file, or `FileRefused`:
    a symlink is never followed (`lstat`, then `O_NOFOLLOW`), a FIFO, device, socket or directory is
    never opened, and what is opened is checked again with `fstat` (`O_NONBLOCK`: nothing waits). For
    a directory gitops owns whose entries anyone may have put there (a spool)."""
    shown = name if name is not None else str(path)
    try:
        info = os.lstat(path)
    except OSError as err:
        raise FileRefused(shown, _why(path, err)) from None
    if stat.S_ISLNK(info.st_mode):
        raise FileRefused(shown, "is a symlink; refusing to follow it")
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(shown, f"is {_kind(info.st_mode)}, not a regular file; refusing to read it")
    if info.st_size > limit:
        raise FileRefused(shown, f"file is larger than {_size(limit)} ({info.st_size} bytes); refusing to read it")
    flags = (os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_NOCTTY", 0))
    try:
        fd = os.open(path, flags)
    except OSError as err:
        reason = "is a symlink; refusing to follow it" if err.errno == errno.ELOOP else _why(path, err)
        raise FileRefused(shown, reason) from None
    try:
        return _read_open(fd, limit, shown)  # (fstat: whatever was put in the name's place since the lstat)
    except OSError as err:
        raise FileRefused(shown, _why(path, err)) from None
    finally:
        os.close(fd)


def _why(path: str | os.PathLike[str], err: OSError) -> str:
    """A one-line reason for an `OSError` on `path`, naming symlink loops and dangling links."""
    if err.errno == errno.ELOOP:
        return "symlink loop (too many levels of symbolic links); refusing to read it"
    if err.errno == errno.ENOENT and os.path.islink(path):
        return f"dangling symlink (points to {printable(os.readlink(path))!s}, which does not exist)"
    if err.errno == errno.ENOENT:
        return "no such file"
    return f"cannot read: {err.strerror or err}"


__all__ = ["FileRefused", "MiB", "read_bytes", "read_regular", "read_text", "within", "write_atomic"]


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


# ---------------------------------------------------------------------------- files under a root
# A tree someone else wrote (a checkout of the status branch) is read and written only through these:
# each directory of `rel` is opened with O_NOFOLLOW relative to the one before it (no name is resolved
# twice), so a symlink, a FIFO or any non-regular entry anywhere on the way is refused with its path
# named and nothing is read or written through it.


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or rel.startswith("/"):
        raise FileRefused(rel, "not a plain relative path; refusing it")
    return parts


def _open_dir(root: str | os.PathLike[str], parts: list[str], rel: str, create: bool) -> int | None:
    """A descriptor of the directory `root/parts...` (None when a part is missing and not `create`)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(root, flags)
    try:
        for i, part in enumerate(parts):
            where = "/".join(parts[: i + 1])
            try:
                info = os.lstat(part, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                info = os.lstat(part, dir_fd=fd)
            if stat.S_ISLNK(info.st_mode):
                raise FileRefused(where, f"is a symlink (in {rel}); refusing to follow it")
            if not stat.S_ISDIR(info.st_mode):
                raise FileRefused(where, f"is {_kind(info.st_mode)}, not a directory (in {rel}); refusing it")
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as err:
                raise FileRefused(where, f"cannot open: {err.strerror or err}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _entry(dir_fd: int, name: str, rel: str) -> os.stat_result | None:
    """The entry `name` of the directory, None when there is none; a link or a non-regular file is refused."""
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise FileRefused(rel, "is a symlink; refusing to follow it")
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(rel, f"is {_kind(info.st_mode)}, not a regular file; refusing it")
    return info


def read_under(root: str | os.PathLike[str], rel: str, limit: int) -> bytes | None:
    """The regular file `root/rel` (at most `limit` bytes), None when it is not there; `FileRefused` for a
    link or a non-regular entry anywhere on the way, or a file larger than `limit`."""
    *dirs, name = _parts(rel)
    dir_fd = _open_dir(root, dirs, rel, create=False)
    if dir_fd is None:
        return None
    try:
        if _entry(dir_fd, name, rel) is None:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
        except OSError as err:
            raise FileRefused(rel, _why(rel, err)) from None
    finally:
        os.close(dir_fd)
    try:
        return _read_open(fd, limit, rel)
    except OSError as err:
        raise FileRefused(rel, f"cannot read: {err.strerror or err}") from None
    finally:
        os.close(fd)


def write_under(root: str | os.PathLike[str], rel: str, data: bytes, mode: int = 0o644) -> None:
    """Write `root/rel` whole (its directories made as needed), never through a link: a link or a
    non-regular entry on the way, or in the file's place, is `FileRefused` and nothing is written."""
    *dirs, name = _parts(rel)
    dir_fd = _open_dir(root, dirs, rel, create=True)
    assert dir_fd is not None
    tmp = f".{name}.{os.getpid()}.gitops.tmp"
    try:
        _entry(dir_fd, name, rel)
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode,
                     dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # (a rename replaces a link, never follows it)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(dir_fd)


def remove_under(root: str | os.PathLike[str], rel: str) -> None:
    """Remove the entry `root/rel` if it is there (a link itself, never what it points at); directories on
    the way are not followed through links."""
    *dirs, name = _parts(rel)
    dir_fd = _open_dir(root, dirs, rel, create=False)
    if dir_fd is None:
        return
    try:
        try:
            info = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            raise FileRefused(rel, "is a directory; refusing to remove it as a file")
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def files_under(root: str | os.PathLike[str], rel: str) -> list[str]:
    """The names of the regular files in the directory `root/rel`, sorted ([] when it is not there); a link
    or a non-regular entry in it is `FileRefused`, as is one on the way."""
    dir_fd = _open_dir(root, _parts(rel), rel, create=False)
    if dir_fd is None:
        return []
    try:
        names = []
        for name in os.listdir(dir_fd):
            info = os.lstat(name, dir_fd=dir_fd)
            if stat.S_ISDIR(info.st_mode):
                continue
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
                raise FileRefused(f"{rel}/{name}", ("is a symlink" if stat.S_ISLNK(info.st_mode) else
                                                    f"is {_kind(info.st_mode)}") + "; refusing it")
            names.append(name)
        return sorted(names)
    finally:
        os.close(dir_fd)


__all__ += ["files_under", "read_under", "remove_under", "write_under"]
