"""What keeps the UI answering, and answering only whom it should: the errors a page answers with (each with its
HTTP status, never a 500), the Host allow-list (DNS rebinding), bounded slots (a page or a plan more than they
allow is refused at once, never queued on a server thread). (Bounded memos: `gitops.memo.Memo`.)"""
from __future__ import annotations

import contextlib
import ipaddress
import threading
from collections.abc import Iterable, Iterator

from gitops.errors import GitopsError


#: the names a browser on this machine reaches a loopback listener by
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class PageError(GitopsError):
    """A request answered with `status` and this message."""

    status = 400
    retry_after = 0


class BadRequest(PageError):
    status = 400


class NotFound(PageError):
    status = 404


class Refused(PageError):
    """Content the UI will not read (a branch too large, a link out of its files)."""

    status = 422


class Busy(PageError):
    """Every slot is taken: 503, try again after `retry_after` seconds."""

    status = 503
    retry_after = 2


# ------------------------------------------------------------------------------ Host

def _split_host(value: str) -> tuple[str, str]:
    """`name:port` (or `[v6]:port`, or without a port) as (name, port), the name lower-case, without a final dot."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name, port = name + "]", rest.removeprefix(":")
    else:
        name, colon, port = value.rpartition(":")
        if not colon or not port.isdigit():
            name, port = value, ""
    return name.rstrip("."), port


def _as_host(name: str) -> str:
    """A listen host as a Host header writes it (an IPv6 address in brackets); "" for 0.0.0.0 and ::, which
    name no host a browser should ask for."""
    name = name.strip("[]")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name.lower()
    return "" if address.is_unspecified else f"[{name}]" if address.version == 6 else name


class Hosts:
    """The Host header values the UI answers (anything else is a DNS rebinding attempt, or a name nobody
    allowed): the listen host and the loopback names at the port the request came in on, and `allowed` (a
    name: at any port; `name:port`: at that port only)."""

    def __init__(self, listen_host: str = "", allowed: Iterable[str] = ()):
        self.names = {_as_host(n) for n in (listen_host, *LOOPBACK_NAMES)} - {""}
        self.allowed = {_split_host(a) for a in allowed if a.strip()}

    def allows(self, host: str, server_port: str) -> bool:
        name, port = _split_host(host)
        if not name:
            return False
        if name in self.names and (port or "80") == server_port:
            return True
        return (name, "") in self.allowed or (name, port) in self.allowed


# ------------------------------------------------------------------------------ slots and memos

class Slots:
    """At most `count` holders at once. One more is refused at once (`Busy`), never made to wait: a waiting
    request would hold one of the server's threads, which /healthz needs."""

    def __init__(self, count: int, what: str):
        self.count, self.what = count, what
        self._free = threading.BoundedSemaphore(count)

    @contextlib.contextmanager
    def take(self) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            raise Busy(f"{self.count} {self.what} are under way already, the most this UI runs at once; "
                       f"try again in a few seconds")
        try:
            yield
        finally:
            self._free.release()
