"""Serving a WSGI app (the metrics, the UI) from a daemon thread, on waitress: a production WSGI server."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waitress.server import create_server

from gitops.errors import GitopsError

WSGIApp = Callable[..., Any]


@dataclass
class Server:
    """A running server: `address` is host:port as bound (a port 0 asked becomes the one given)."""

    address: str
    _server: Any

    def close(self) -> None:
        self._server.close()


def start(app: WSGIApp, address: str, name: str, threads: int = 4) -> Server:
    """Serve `app` on `host:port` from a daemon thread named `name`."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        server = create_server(app, host=host, port=int(port), threads=threads, ident="gitops",
                               clear_untrusted_proxy_headers=True)
    except (OSError, ValueError) as err:
        raise GitopsError(f"cannot listen on {address}: {err}") from None
    bound_host, bound_port = server.socket.getsockname()[:2]
    threading.Thread(target=server.run, name=name, daemon=True).start()
    return Server(f"{bound_host}:{bound_port}" if ":" not in bound_host else f"[{bound_host}]:{bound_port}", server)
