"""A git server over HTTP on 127.0.0.1 for tests: git's own `git http-backend` (smart HTTP) behind Basic auth,
or a server that accepts connections and answers nothing (a fetch that hangs); and what /proc shows of the
machine's command lines."""
from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class GitHTTP:
    """Serves the bare repos under `root` at http://127.0.0.1:PORT/NAME.git to `user`:`password` only; with
    `hang`, accepts and holds every connection without a byte back until `stop`."""

    def __init__(self, root: Path, user: str, password: str, hang: bool = False):
        self.root, self.hang = root, hang
        self._expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self._release = threading.Event()
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def do_GET(self) -> None:
                outer._serve(self)

            def do_POST(self) -> None:
                outer._serve(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, name: str, credentials: str = "") -> str:
        return f"http://{credentials + '@' if credentials else ''}127.0.0.1:{self.port}/{name}"

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        self.requests.append(request.path)
        if self.hang:
            self._release.wait(60)
            request.close_connection = True
            return
        if request.headers.get("Authorization") != self._expected:
            request.send_response(401)
            request.send_header("WWW-Authenticate", 'Basic realm="git"')
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        path, _, query = request.path.partition("?")
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        env = {**os.environ, "GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path,
               "QUERY_STRING": query, "REQUEST_METHOD": request.command, "REMOTE_USER": "test",
               "CONTENT_TYPE": request.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body))}
        if request.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = request.headers["Content-Encoding"]
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        headers = [line.split(":", 1) for line in head.decode().split("\r\n") if ":" in line]
        status = next((int(v.split()[0]) for k, v in headers if k.lower() == "status"), 200)
        request.send_response(status)
        for key, value in headers:
            if key.lower() != "status":
                request.send_header(key, value.strip())
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


def command_lines(needle: str) -> list[str]:
    """The command lines (`/proc/PID/cmdline`) of every process on this machine that mention `needle`."""
    return [line for _pid, line in processes(needle)]


def processes(needle: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process on this machine whose command line mentions `needle`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in line:
                found.append((int(proc.name), line))
    return found
