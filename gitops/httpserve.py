"""Serving a WSGI app (the metrics, the UI) from a daemon thread, on waitress: a production WSGI server."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waitress.server import create_server

from gitops.errors import GitopsError
from gitops.hostport import host_port

WSGIApp = Callable[..., Any]

#: waitress's worker threads: the UI serves at most 12 pages at once (`gitops.ui.app.PAGES_AT_ONCE`, answering
#: more with 503 at once), so at least 4 stay free for /healthz and /metrics however slow its pages are
THREADS = 16


@dataclass
class Server:
    """A running server: `address` is host:port as bound (a port 0 asked becomes the one given)."""

    address: str
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        """Stop listening and close every connection, from the server's own loop (a socket closed under its
        `select` breaks it), then stop the worker threads (a request under way has 5 seconds to end)."""
        try:
            self._server.trigger.pull_trigger(lambda: [channel.close() for channel in list(self._server._map.values())])
        except OSError:  # its trigger is closed already: the loop ended and closed its channels, or is ending
            for channel in list(self._server._map.values()):
                channel.close()
        self._thread.join(timeout=5)
        self._server.task_dispatcher.shutdown(timeout=5)


def start(app: WSGIApp, address: str, name: str, threads: int = THREADS) -> Server:
    """Serve `app` on `host:port` from a daemon thread named `name`."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        server = create_server(app, host=host, port=int(port), threads=threads, ident="gitops",
                               clear_untrusted_proxy_headers=True)
    except (OSError, ValueError) as err:
        raise GitopsError(f"cannot listen on {address}: {err}") from None
    bound_host, bound_port = server.socket.getsockname()[:2]
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    return Server(host_port(bound_host, bound_port), server, thread)
