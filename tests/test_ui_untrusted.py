"""Issue #42 point 4: the repo and its status branch are untrusted input, and the web UI leaks nothing.

Real git repos (bare, in a temp dir), the UI served by waitress (in this process, or `gitops ui` and `gitops
watch` as processes): no credential of the repo's URL on any page, log or startup line; the Host header
checked against an allow-list; /plan takes branch names only (400 otherwise), refuses a branch too large before
archiving it and a link out of its files (422), and keeps its plans by commit, looked up before any checkout;
`gitops watch --ui` keeps the UI on loopback unless asked. The helpers here serve `test_ui_load.py` too.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import http.server
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_ui import get
from test_controller_status import git as status_git

from gitops.httpserve import Server, start
from gitops.plan.actions import Plan
from gitops.redact import redact
from gitops.ui.app import create_app
from gitops.status.trust import Signers, ensure_key
from gitops.ui.guard import Hosts
from gitops.ui.source import StatusSource

GITOPS = str(Path(sys.executable).parent / "gitops")
REPO_ROOT = Path(__file__).resolve().parents[1]
TOKEN = "s3cr3t-T0KEN"


def git(cwd: Path, *args: str) -> str:
    return status_git(cwd, *args).stdout.strip()


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A temp dir removed after the test (pytest's tmp_path outlives the run)."""
    path = Path(tempfile.mkdtemp(prefix="gitops-test-ui-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------ a repo and a served UI

@dataclass
class Origin:
    """A bare repo (`bare`), its main branch (a README) and its status branch, and a work clone to push from."""

    bare: Path
    work: Path
    #: the controller's status signing key: status commits are signed with it, and the UI pins it
    key: Path | None = None

    def push(self, message: str, branch: str, sign: bool = False) -> str:
        git(self.work, "add", "-A")
        signing = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={self.key}", "commit", "-S"] if sign else ["commit"]
        git(self.work, *signing, "-q", "--allow-empty", "-m", message)
        git(self.work, "push", "-q", "-f", "origin", f"HEAD:{branch}")
        git(self.bare, "update-server-info")  # (for the dumb HTTP remote of the credentials test)
        return git(self.work, "rev-parse", "HEAD")

    def branch(self, name: str, files: dict[str, bytes] | None = None, links: dict[str, str] | None = None,
               start: str = "main") -> str:
        """Branch `name` off `start` with `files` written and symbolic `links` (path -> target) made; its commit."""
        git(self.work, "checkout", "-q", "-B", name, start)
        for rel, data in (files or {}).items():
            (self.work / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.work / rel).write_bytes(data)
        for rel, target in (links or {}).items():
            (self.work / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, self.work / rel)
        commit = self.push(f"branch {name}", name)
        git(self.work, "checkout", "-q", "main")
        return commit

    def status_commit(self, files: dict[str, str], message: str = "applied abc", sign: bool = True) -> str:
        """One more commit on the status branch writing `files`, signed with `key` (unless not `sign`)."""
        if git(self.work, "symbolic-ref", "--short", "HEAD") != "status":
            git(self.work, "checkout", "-q", "status")
        for rel, text in files.items():
            (self.work / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.work / rel).write_text(text)
        commit = self.push(message, "gitops/status", sign=sign)
        git(self.work, "checkout", "-q", "main")
        return commit


def make_origin(base: Path) -> Origin:
    origin = Origin(base / "origin.git", base / "work", ensure_key(base / "status-signing-key", "ctl@test").path)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin.bare)], check=True)
    origin.work.mkdir()
    git(origin.work, "init", "-q", "-b", "main")
    git(origin.work, "remote", "add", "origin", str(origin.bare))
    (origin.work / "README").write_text("the infra repo\n")
    origin.push("the repo", "main")
    git(origin.work, "checkout", "-q", "--orphan", "status")
    git(origin.work, "rm", "-rqf", "--cached", ".")
    (origin.work / "README").unlink()
    origin.status_commit({"status/source.yaml": "status:\n  result: Applied\n"}, "first status")
    return origin


def empty_plan(_files: Path, _mirror: Path, _status: str) -> Plan:
    return Plan()


@dataclass
class Served:
    base: str
    port: int
    source: StatusSource
    server: Server


@contextlib.contextmanager
def serve_ui(origin: Path | str, base: Path, planner: Callable[[Path, Path, str], object] | None = empty_plan,
             hosts: Hosts | None = None, source_class: type[StatusSource] = StatusSource,
             wrap: Callable[[object], object] = lambda app: app, **limits: int) -> Iterator[Served]:
    """The UI over `origin` served by waitress in this process, on a free loopback port (`wrap`: what
    serves it, given the UI's app, e.g. the metrics app of `gitops watch`). It pins `base`'s status signing key
    (`make_origin`'s)."""
    pinned = base / "status-signing-key.pub"
    signers = Signers.from_file(pinned) if pinned.exists() else Signers()
    source = source_class(str(origin), Path(tempfile.mkdtemp(prefix="mirror-", dir=base)), refresh=0,
                          signers=signers, **limits)
    server = start(wrap(create_app(source, planner, hosts)), "127.0.0.1:0", "ui-test")
    try:
        yield Served(f"http://{server.address}/", int(server.address.rpartition(":")[2]), source, server)
    finally:
        server.close()


def ask(port: int, path: str, host: str | None = None) -> tuple[int, str, dict[str, str]]:
    """GET `path` with the Host header `host` (None: none at all, over HTTP/1.0)."""
    if host is None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.decode().partition("\r\n\r\n")
        return int(head.split()[1]), body, {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host})
        answer = conn.getresponse()
        return answer.status, answer.read().decode(), dict(answer.getheaders())
    finally:
        conn.close()


def plan_of(served: Served, ref: str) -> tuple[int, str]:
    return get(served.base + "plan?ref=" + urllib.parse.quote(ref, safe=""))


# ------------------------------------------------------------------------------ credentials

def test_redact_strips_the_userinfo_of_every_url_in_a_text():
    assert redact("https://user:tok@git.example.com/infra.git") == "https://git.example.com/infra.git"
    assert redact("fatal: unable to access 'http://u:p@ss@h:8/r.git/': 403, then ssh://git@h/r") == \
        "fatal: unable to access 'http://h:8/r.git/': 403, then ssh://h/r"
    for kept in ("https://h/x?a=b@c", "git@github.com:o/r.git", "mail ops@example.com, see https://h/"):
        assert redact(kept) == kept
    # git before 2.37 (and a server's own messages) quote the URL as given
    said = f"fatal: repository 'https://deploy:{TOKEN}@git.example.com/infra.git/' not found"
    assert redact(said) == "fatal: repository 'https://git.example.com/infra.git/' not found"


class _BasicAuth(http.server.SimpleHTTPRequestHandler):
    """A dumb-HTTP git remote that wants `user:TOKEN` (basic auth) for every file."""

    def do_GET(self) -> None:
        wanted = "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode()
        if self.headers.get("Authorization") != wanted:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *_args: object) -> None:
        pass


def test_no_credential_of_the_repo_url_on_a_page_a_log_or_the_startup_line(scratch: Path):
    origin = make_origin(scratch)
    remote = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_BasicAuth, directory=str(scratch)))
    threading.Thread(target=remote.serve_forever, daemon=True).start()
    shown = f"http://127.0.0.1:{remote.server_address[1]}/origin.git"
    url = shown.replace("http://", f"http://user:{TOKEN}@")
    ui = subprocess.Popen([GITOPS, "-v", "ui", "--repo", url, "--address", "127.0.0.1:0", "--refresh", "0",
                           "--ui-allowed-host", "ui.example.com", "--status-signers",
                           str(scratch / "status-signing-key.pub")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ui.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found and f"repo {shown};" in line, line
        base, port = found.group(0), int(found.group(1))
        pages = {path: get(base + path) for path in ("", "applies", "shards", "plan", "plan?ref=nope",
                                                     "plan?ref=main%3Agitops.yaml", "nowhere")}
        assert pages[""][0] == 200 and pages["plan"][0] == 200
        assert pages["plan?ref=nope"][0] == 404 and f"no branch &#39;nope&#39; in {shown}" in pages["plan?ref=nope"][1]
        assert pages["plan?ref=main%3Agitops.yaml"][0] == 400 and pages["nowhere"][0] == 404
        # the allow-list as `gitops ui --ui-allowed-host` sets it
        assert ask(port, "/", "ui.example.com")[0] == 200 and ask(port, "/", "evil.example.com")[0] == 400

        remote.shutdown()
        remote.server_close()  # the remote gone: every page says why, quoting git
        code, page = get(base)
        assert code == 503 and f"cannot fetch {shown}: fatal: unable to access" in page, page
        pages["(remote gone)"] = (code, page)
        pages["(remote gone) plan"] = get(base + "plan?ref=main")
        for path, (_code, body) in pages.items():
            assert TOKEN not in body and "user:" not in body, path
    finally:
        ui.terminate()
        out, err = ui.communicate(timeout=30)
        remote.server_close()
    assert TOKEN not in line + out + err


def test_a_page_that_fails_logs_its_traceback_without_credentials(scratch: Path, caplog: pytest.LogCaptureFixture):
    origin = make_origin(scratch)
    origin.branch("feature")

    def failing(_files: Path, _mirror: Path, _status: str) -> Plan:
        raise RuntimeError(f"cannot reach https://deploy:{TOKEN}@git.example.com/infra.git")

    with caplog.at_level(logging.ERROR), serve_ui(origin.bare, scratch, failing) as served:
        code, page = plan_of(served, "feature")
    assert code == 500 and "the UI&#39;s log says why" in page and TOKEN not in page
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "https://git.example.com/infra.git" in logged and "RuntimeError" in logged and TOKEN not in logged


# ------------------------------------------------------------------------------ the Host header

def test_the_host_header_is_checked_against_the_allow_list(scratch: Path):
    origin = make_origin(scratch)
    with serve_ui(origin.bare, scratch, hosts=Hosts("127.0.0.1", ["ui.example.com", "proxy.local:8443"])) as served:
        port = served.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST.:{port}", f"[::1]:{port}",
                     "ui.example.com", "ui.example.com:443", "proxy.local:8443"):
            assert ask(port, "/", host)[0] == 200, host
        for host in (f"evil.example.com:{port}", "evil.example.com", f"127.0.0.1:{port + 1}", "localhost",
                     "proxy.local:9999", f"127.0.0.1.evil.example.com:{port}", ""):
            code, body, _ = ask(port, "/plan?ref=main", host)
            assert code == 400 and "--ui-allowed-host" in body, (host, code, body)
        assert ask(port, "/", None)[0] == 400  # no Host at all (no browser sends that)
        assert ask(port, "/healthz", "evil.example.com")[:2] == (200, "ok\n")  # (exempt)


# ------------------------------------------------------------------------------ /plan: names, size, links, cache

BAD_NAMES = ("main:gitops.yaml", "main:", "..", "a..b", "refs/heads/main", "HEAD", "@", "main@{1}", "@{-1}",
             "main~1", "main^", "ma in", "tab\there", "ctl\x01", "del\x7f", "-main", "/main", "main/", "a//b",
             "main.", "main.lock", "x/.hidden", ".hidden", "a*", "a?", "a[b", "back\\slash",
             "0123abc", "e83c5163316f89bfbde7d9ab23ca2e25604af290", "x" * 256, "é" * 128)


def test_plan_takes_branch_names_only_and_answers_400_with_why(scratch: Path):
    origin = make_origin(scratch)
    origin.branch("feature/ok")
    origin.branch("fix-ü")
    with serve_ui(origin.bare, scratch) as served:
        for name in BAD_NAMES:
            code, page = plan_of(served, name)
            assert code == 400 and "is not a branch name: " in page, (name, code, page[-800:])
        assert plan_of(served, "feature/ok")[0] == 200
        assert plan_of(served, "fix-ü")[0] == 200
        assert plan_of(served, "x" * 255)[0] == 404  # (at most 255 bytes: a name, but no such branch)
        assert get(served.base + "applies/not-hex")[0] == 400
        assert get(served.base + "applies/" + "a" * 40)[0] == 404


def test_a_branch_over_the_size_limit_is_refused_before_it_is_archived(scratch: Path):
    origin = make_origin(scratch)
    origin.branch("big", {"blob.bin": b"\0" * (2 * 2**20)})
    origin.branch("many", {f"f/{i}.txt": b"x" for i in range(40)})
    origin.branch("small", {"a.txt": b"y" * 1000})
    with serve_ui(origin.bare, scratch, max_branch_bytes=2**20, max_branch_files=30) as served:
        extracted = []
        original = served.source._extract
        served.source._extract = lambda *args: (extracted.append(args[1]), original(*args))[1]  # type: ignore
        code, page = plan_of(served, "big")
        assert code == 422 and "more than 1.0 MiB of files, over the UI&#39;s limit for a plan" in page, page
        code, page = plan_of(served, "many")
        assert code == 422 and "more than 30 files" in page, page
        assert extracted == []
        assert plan_of(served, "small")[0] == 200 and extracted == ["small"]


def test_the_mirror_fetches_no_more_refs_or_bytes_than_its_bounds(scratch: Path):
    """Issue #60.4: the UI's mirror fetched every branch, whatever its size or number, before /plan checked one.
    Past its bounds a fetch is refused (refs: listed first; bytes: the pack stopped by the kernel as it comes)
    and nothing of it is kept; within them it is the remote's branches exactly, deleted ones pruned."""
    from gitops.errors import GitopsError

    origin = make_origin(scratch)
    for i in range(9):
        git(origin.bare, "update-ref", f"refs/heads/many-{i}", "main")
    refs = lambda source: source.repo.run("for-each-ref", "--format=%(refname)").split()  # noqa: E731
    few = StatusSource(str(origin.bare), scratch / "few", max_refs=10)
    with pytest.raises(GitopsError, match=r"more than 10 branches and notes refs \(--mirror-max-refs\); nothing"):
        few.fetch(force=True)
    assert refs(few) == [] and not list((scratch / "few" / "objects" / "pack").iterdir())
    origin.branch("big", {"blob.bin": os.urandom(3 * 2**20)})
    small = StatusSource(str(origin.bare), scratch / "small", max_fetch_bytes=2**20)
    with pytest.raises(GitopsError, match=r"sends more than 1.0 MiB at once \(--mirror-max-mib\); nothing was kept"):
        small.fetch(force=True)
    assert refs(small) == [] and not list((scratch / "small" / "objects" / "pack").iterdir())
    within = StatusSource(str(origin.bare), scratch / "within", max_refs=12, max_fetch_bytes=8 * 2**20)
    within.fetch(force=True)
    assert refs(within) == sorted(git(origin.bare, "for-each-ref", "--format=%(refname)").split())
    git(origin.bare, "update-ref", "-d", "refs/heads/many-0")
    within.fetch(force=True)
    assert "refs/heads/many-0" not in refs(within) and "refs/heads/many-1" in refs(within)


def test_a_branch_with_a_link_out_of_its_files_is_refused_not_a_500(scratch: Path):
    origin = make_origin(scratch)
    origin.branch("absolute", links={"clusters/secret.yaml": "/etc/passwd"})
    origin.branch("outside", links={"clusters/deep/up.yaml": "../../../outside.yaml"})
    origin.branch("inside", {"clusters/a.yaml": b"a: 1\n"}, links={"clusters/b.yaml": "a.yaml"})
    leftovers = set(Path(tempfile.gettempdir()).glob("gitops-ui-*"))
    with serve_ui(origin.bare, scratch) as served:
        code, page = plan_of(served, "absolute")
        assert code == 422 and "clusters/secret.yaml&#39; (a link to &#39;/etc/passwd&#39;) leads out" in page, page
        code, page = plan_of(served, "outside")
        assert code == 422 and "(a link to &#39;../../../outside.yaml&#39;) leads out" in page, page
        assert plan_of(served, "inside")[0] == 200
    assert set(Path(tempfile.gettempdir()).glob("gitops-ui-*")) == leftovers  # every checkout removed


def test_plans_are_kept_by_commit_and_looked_up_before_any_checkout(scratch: Path):
    origin = make_origin(scratch)
    commit = origin.branch("one", {"a.txt": b"a"})
    git(origin.work, "push", "-q", "origin", f"{commit}:refs/heads/same")
    planned: list[str] = []

    def counting(files: Path, _mirror: Path, status: str) -> Plan:
        planned.append(status)
        return Plan(source=f"files {sorted(p.name for p in files.iterdir())}")

    with serve_ui(origin.bare, scratch, counting) as served:
        extracted = []
        original = served.source._extract
        served.source._extract = lambda *args: (extracted.append(args[1]), original(*args))[1]  # type: ignore
        first = plan_of(served, "one")
        assert first[0] == 200 and "files [&#39;README&#39;, &#39;a.txt&#39;]" in first[1]
        again = plan_of(served, "one")
        same = plan_of(served, "same")  # another branch at the same commit: the same plan, under its own name
        assert again[0] == same[0] == 200 and "branch same at" in same[1]
        assert len(planned) == 1 and extracted == ["one"]
        status = origin.status_commit({"status/source.yaml": "status:\n  result: Applied\n  lastSeenSHA: x\n"})
        assert plan_of(served, "one")[0] == 200  # a new status commit: planned again, against it
        assert planned[1:] == [status] and extracted == ["one", "one"]
        origin.branch("one", {"b.txt": b"b"})  # the branch moved: planned again
        assert "b.txt" in plan_of(served, "one")[1] and len(planned) == 3


# ------------------------------------------------------------------------------ exposure

def test_watch_keeps_the_ui_on_loopback_unless_asked(scratch: Path, monkeypatch: pytest.MonkeyPatch):
    import gitops.cli.ui as cli_ui

    origin = make_origin(scratch)
    monkeypatch.setattr(cli_ui, "DEFAULT_ADDRESS", "127.0.0.1:0")
    place = functools.partial(cli_ui.watch_ui, str(origin.bare), "main", "", scratch / "mirror", allowed_hosts=())
    app, server = place("127.0.0.1:9100", "")
    assert app is not None and server is None  # beside a loopback /metrics
    app, server = place("[::1]:9100", "")
    assert app is not None and server is None
    app, server = place("0.0.0.0:9100", "")  # /metrics on every address: the UI on loopback, apart
    assert app is None and server is not None and server.address.startswith("127.0.0.1:")
    server.close()
    app, server = place("0.0.0.0:9100", "0.0.0.0:9100")  # asked for: beside it
    assert app is not None and server is None
    app, server = place("", "")  # no /metrics at all
    assert app is None and server is not None and server.address.startswith("127.0.0.1:")
    server.close()

    # the image: /metrics on 0.0.0.0, the UI's address loopback, exposed only as 9100
    docker = (REPO_ROOT / "Dockerfile").read_text()
    env = dict(re.findall(r"(GITOPS_\w+)=(\S+)", docker))
    assert env["GITOPS_METRICS_ADDRESS"] == "0.0.0.0:9100" and env["GITOPS_UI_ADDRESS"] == "127.0.0.1:8080"
    assert re.findall(r"^EXPOSE (.*)$", docker, re.M) == ["9100"]
    assert 'ENTRYPOINT ["gitops", "watch"]' in docker


def test_gitops_watch_ui_with_the_images_settings_serves_the_ui_on_loopback_only(scratch: Path):
    """`gitops watch --ui` as the image runs it (its address settings from the environment; ports free)."""
    origin = make_origin(scratch)
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        metrics_port = probe.getsockname()[1]
    env = {**os.environ, "GITOPS_METRICS_ADDRESS": f"0.0.0.0:{metrics_port}", "GITOPS_UI_ADDRESS": "127.0.0.1:0"}
    watch = subprocess.Popen([GITOPS, "watch", "--repo", str(origin.bare), "--workdir", str(scratch / "controller"),
                              "--insecure-plaintext-secrets", "--interval", "1h", "--log-format", "text", "--ui"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        deadline, lines = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            line = watch.stderr.readline()  # type: ignore[union-attr]
            lines.append(line)
            if not line or line.startswith("gitops ui: "):
                break
        found = re.search(r"gitops ui: http://127\.0\.0\.1:(\d+)/", lines[-1])
        assert found, "".join(lines)
        ui_port = int(found.group(1))
        assert ui_port != metrics_port
        assert get(f"http://127.0.0.1:{ui_port}/plan")[0] in (200, 503)  # (503 until the status branch is read)
        assert get(f"http://127.0.0.1:{metrics_port}/healthz")[0] == 200
        assert get(f"http://127.0.0.1:{metrics_port}/")[0] == 404  # no UI where /metrics listens on 0.0.0.0
        assert get(f"http://127.0.0.1:{metrics_port}/plan")[0] == 404
    finally:
        os.killpg(watch.pid, signal.SIGTERM)
        try:
            watch.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(watch.pid, signal.SIGKILL)
            watch.communicate()


def test_the_ui_shows_only_status_commits_a_pinned_key_signed(scratch: Path):
    """Issue #42.1: an unsigned status commit pushed over the controller's is not shown (every page says
    why, 503, the applies page too: the history below it is its pusher's choice); with no key pinned at all,
    the pages say so."""
    origin = make_origin(scratch)
    signed = origin.status_commit({"status/apply.yaml": "status: {}\n"}, "applied signed")
    with serve_ui(origin.bare, scratch) as served:
        assert get(served.base)[0] == 200
        forged = origin.status_commit({"status/source.yaml": "status:\n  result: Forged\n"}, "forged", sign=False)
        code, page = get(served.base)
        assert code == 503 and "status commit of" in page and "is not trusted: unsigned" in page, page
        assert "Forged" not in page
        code, page = get(served.base + "applies")  # the history below an untrusted tip is its pusher's choice
        assert code == 503 and f"status commit {forged[:12]} is not trusted: unsigned" in page, page
        assert signed[:7] not in page  # (no row of the history below it)
    (scratch / "status-signing-key.pub").rename(scratch / "elsewhere.pub")
    with serve_ui(origin.bare, scratch) as served:
        code, page = get(served.base)
        assert code == 503 and "no status signer is pinned" in page, page


def test_the_ui_refuses_a_status_tip_older_than_one_it_read(scratch: Path):
    """Issue #60.5: a reader without a workdir could not notice the status branch put back to an older signed
    commit. Signed status commits carry a generation (`Status-Generation:`); the UI remembers the newest tip it
    read (and starts from --status-min-generation) and refuses an older one, 503 with the reason."""
    origin = make_origin(scratch)
    older = origin.status_commit({"status/source.yaml": "status:\n  result: Applied\n"},
                                 "applied old\n\nStatus-Generation: 3")
    origin.status_commit({"status/source.yaml": "status:\n  result: Applied\n"}, "applied new\n\nStatus-Generation: 5")
    with serve_ui(origin.bare, scratch, min_generation=4) as served:
        assert get(served.base)[0] == 200 and served.source.min_generation == 5
        git(origin.bare, "update-ref", "refs/heads/gitops/status", older)
        served.source.fetch(force=True)
        code, page = get(served.base)
        assert code == 503 and "is generation 3, older than generation 5 already seen" in page, page
        assert get(served.base + "applies")[0] == 503
