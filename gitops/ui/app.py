"""The read-only web UI: Flask routes over a `StatusSource`, pages rendered by Jinja2 on the server.

Every page has a stable URL and works without JavaScript: `/` the fleet (`?phase=`, `?q=`),
`/clusters/<name>`, `/applies` and `/applies/<status commit>`, `/shards`, `/plan?ref=<branch>` (the
branch's offline plan against the status branch, as `gitops plan CLONE --against-status` prints it).
Nothing secret is read: kubeconfigs and the sealed state stay on the branch, encrypted.

The repo and its status branch are untrusted input, and the pages must not starve `/healthz`:

* a request whose Host is not allowed (`guard.Hosts`) is answered 400 (DNS rebinding); /healthz is exempt;
* at most `PAGES_AT_ONCE` pages are served at once, `PLANS_AT_ONCE` plans among them; one more is answered
  503 with Retry-After at once, so a server of `httpserve.THREADS` threads always has some left for /healthz;
* with `isolate`, a plan and the parsing of status records run in a process of their own (`isolate.py`): their
  CPU never holds this process's interpreter lock, which /healthz needs too;
* a plan is kept by (branch commit, status commit), looked up before anything is checked out; an apply's row
  and page by status commit (immutable), so a page load parses no record twice;
* an error answers with its status and a message without credentials (`gitops.redact`), never a traceback.
"""
from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, render_template, request
from werkzeug.exceptions import HTTPException

from gitops.errors import GitopsError
from gitops.memo import Memo
from gitops.redact import redact
from gitops.status.backups import BACKUPS_DIR
from gitops.status.reader import ROLLOUT
from gitops.ui import views
from gitops.ui.guard import BadRequest, Busy, Hosts, NotFound, PageError, Refused, Slots
from gitops.ui.isolate import run_isolated
from gitops.ui.source import LogEntry, StatusSource

log = logging.getLogger(__name__)

#: how many status commits the applies page and the timelines read
HISTORY = 100
#: branch plans kept, by (branch commit, status commit)
PLANS_KEPT = 16
#: pages served at once (plans among them; the others mostly wait on the mirror), fewer than the server has threads
#: (`httpserve.THREADS`): one more is answered 503 at once
PAGES_AT_ONCE = 12
#: plans made at once (each takes a core for seconds on a large fleet)
PLANS_AT_ONCE = 2
#: apply pages kept, by status commit (their rows: all of the history's)
APPLY_PAGES_KEPT = 32
#: the longest a branch's plan may take in its own process (a full cold plan of 10,000 clusters: ~190 s)
PLAN_TIMEOUT = 900.0
#: the longest parsing some of the history's records may take in its own process
PARSE_TIMEOUT = 900.0
#: records parsed at once: read from git, then parsed, by chunks of about this many bytes
PARSE_CHUNK_BYTES = 32 * 2**20
_COMMIT_ID = re.compile(r"[0-9a-f]{7,40}")

Planner = Callable[[Path, Path, str], object]
WSGIApp = Callable[..., Iterable[bytes]]


def create_app(source: StatusSource, planner: Planner | None = None, hosts: Hosts | None = None,
               isolate: bool = False) -> Flask:
    """The UI's WSGI app. `planner(files, mirror, status_commit)` returns the `Plan` of a checkout's files
    against a status commit of the mirror (`gitops.ui.plans.branch_plan`, given here so that this module
    plans nothing). `hosts`: the Host header values answered (default: the loopback names). `isolate`: plans
    and record parsing run in processes of their own (then `planner` must be importable by name)."""
    app = Flask(__name__)
    app.jinja_env.trim_blocks = app.jinja_env.lstrip_blocks = True
    plans: Memo[tuple[str, str], views.PlanPage] = Memo(PLANS_KEPT)
    rows: Memo[str, views.ApplyRow] = Memo(4 * HISTORY)
    apply_pages: Memo[str, views.ApplyPage] = Memo(APPLY_PAGES_KEPT)
    planning = Slots(PLANS_AT_ONCE, "plans")
    parsing = threading.Lock()  # one history parse at a time: a page asking meanwhile then finds its rows kept
    app.wsgi_app = _guarded(app.wsgi_app, hosts or Hosts(), Slots(PAGES_AT_ONCE, "page loads"))  # type: ignore

    def now() -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc)

    def work(fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        return run_isolated(fn, args, timeout) if isolate else fn(*args)

    @app.errorhandler(PageError)
    def _page_error(err: PageError):  # type: ignore[no-untyped-def]
        return _error_page(err.status, str(err), err.retry_after)

    @app.errorhandler(GitopsError)
    def _gitops_error(err: GitopsError):  # type: ignore[no-untyped-def]
        return _error_page(503, str(err))

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException):  # type: ignore[no-untyped-def]
        return _error_page(err.code or 500, err.description or err.name)

    @app.errorhandler(Exception)
    def _unexpected(err: Exception):  # type: ignore[no-untyped-def]
        log.error("page %s failed: %s", request.path, redact(traceback.format_exc()))
        return _error_page(500, "this page failed; the UI's log says why")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/")
    def fleet() -> str:
        reader = source.reader()
        src = reader.source()
        applied = source.last_apply_time()  # (one `git log`, not the history's records)
        page = views.fleet(src, reader.documents("Cluster"), reader.documents("Node"), reader.documents("Hypervisor"),
                           reader.documents_in(BACKUPS_DIR), now(), request.args.get("phase", ""),
                           request.args.get("q", "").strip(),
                           dt.datetime.fromtimestamp(applied, dt.timezone.utc) if applied else None)
        return render_template("fleet.html", page=page, phase=request.args.get("phase", ""),
                               q=request.args.get("q", ""), shards=bool(reader.documents("Shard")),
                               rollout=views.rollout_view(views.load_record(reader.read(ROLLOUT))))

    @app.get("/clusters/<name>")
    def cluster(name: str) -> str:
        reader = source.reader()
        docs = reader.documents("Cluster")
        if name not in docs:
            abort(404, f"no Cluster {name} on the status branch")
        page = views.cluster_page(name, docs[name], reader.documents("Node"),
                                  reader.documents_in(BACKUPS_DIR).get(name), now())
        history = history_rows()
        return render_template("cluster.html", page=page, timeline=views.timeline(history, name),
                               applies=[r for r in history if name in r.clusters][:10])

    @app.get("/applies")
    def applies() -> str:
        history = history_rows()
        return render_template("applies.html", rows=history, timeline=views.timeline(history))

    @app.get("/applies/<sha>")
    def apply(sha: str) -> str:
        if not _COMMIT_ID.fullmatch(sha):
            raise BadRequest(f"{sha[:60]!r} is not a status commit id (7 to 40 lower-case hex digits)")
        found = next((e for e in source.log(HISTORY) if e.sha.startswith(sha)), None)
        if found is None:
            raise NotFound(f"no status commit {sha} among the last {HISTORY}")
        page = apply_pages.peek(found.sha)
        if page is None:
            row = history_rows([found])[0]
            record = source.records(found.sha)[1] if found.applied_here else None
            page = apply_pages.put(found.sha, work(views.apply_page, row, record, timeout=PARSE_TIMEOUT))
        return render_template("apply.html", page=replace(page, row=views.aged(page.row, now())))

    @app.get("/shards")
    def shards() -> str:
        docs = source.reader().documents("Shard")
        return render_template("shards.html", shards=[(n, d.get("status") or {}) for n, d in sorted(docs.items())])

    @app.get("/plan")
    def branch_plan():  # type: ignore[no-untyped-def]
        ref = request.args.get("ref", "").strip()
        source.fetch()
        branches = tuple(source.branches())
        if not ref:
            return render_template("plan.html", page=None, branches=branches, ref="")
        if planner is None:
            abort(404, "this UI plans no branch")
        status, retry = 200, 0
        try:
            page = replace(plan_of(ref), ref=ref, branches=branches)
        except PageError as err:
            page, status, retry = views.plan_error(ref, redact(str(err)), branches), err.status, err.retry_after
        except GitopsError as err:  # the mirror or the status branch, not the branch
            page, status = views.plan_error(ref, redact(str(err)), branches), 503
        answer = Response(render_template("plan.html", page=page, branches=branches, ref=ref), status)
        if retry:
            answer.headers["Retry-After"] = str(retry)
        return answer

    def plan_of(ref: str) -> views.PlanPage:
        """The plan page of branch `ref` at its commit, against the status branch's commit: kept by both, looked
        up before anything is checked out; made (at most `PLANS_AT_ONCE` at once) when not kept."""
        assert planner is not None
        commit = source.branch_commit(ref)
        status_commit = source.commit_of(source.status_ref())
        source.verify_tip(status_commit)  # (the plan reads that commit only: verified here, once)
        key = (commit, status_commit)
        page = plans.peek(key)
        if page is None:
            with planning.take():
                page = plans.peek(key)  # (made by another request meanwhile)
                if page is None:
                    with source.checkout(commit, ref) as files:
                        try:
                            page = work(plan_page, planner, files, source.cache, status_commit, commit,
                                        timeout=PLAN_TIMEOUT)
                        except GitopsError as err:  # the branch's own errors (an invalid repo): as `gitops plan`
                            raise Refused(str(err)) from None
                    plans.put(key, page)
        return page

    def parse(items: list[tuple[str, int, str, bytes | None, bytes | None, bool]]) -> None:
        """Keep the rows of `items` (then emptied)."""
        for row in work(views.apply_rows, items, timeout=PARSE_TIMEOUT) if items else ():
            rows.put(row.status_sha, row)
        items.clear()

    def history_rows(entries: list[LogEntry] | None = None) -> list[views.ApplyRow]:
        """The rows of `entries` (default: the history's), aged now. A status commit never changes: its row
        is parsed once, those not kept yet all at once."""
        entries = source.log(HISTORY) if entries is None else entries
        if any(rows.peek(e.sha) is None for e in entries):
            with parsing:
                items: list[tuple[str, int, str, bytes | None, bytes | None, bool]] = []
                for entry in (e for e in entries if rows.peek(e.sha) is None):
                    try:
                        src, record = source.records(entry.sha, with_apply=entry.applied_here)
                        items.append((entry.sha, entry.time, entry.subject, src, record, entry.applied_here))
                    except PageError as err:
                        rows.put(entry.sha, views.unreadable_row(entry.sha, entry.time, entry.subject, str(err)))
                    if sum(len(i[3] or b"") + len(i[4] or b"") for i in items) > PARSE_CHUNK_BYTES:
                        parse(items)  # (records held at once: at most a chunk's)
                parse(items)
        at = now()
        return [views.aged(rows.peek(e.sha) or views.unreadable_row(e.sha, e.time, e.subject, "not kept"), at)
                for e in entries]

    return app


def plan_page(planner: Planner, files: Path, mirror: Path, status_commit: str, commit: str) -> views.PlanPage:
    """The page of a branch's plan (without its name): made where the plan is, so that only the page (text)
    comes back from a process of its own, not the plan and its payloads."""
    return views.plan_page("", commit, planner(files, mirror, status_commit))  # type: ignore[arg-type]


def _error_page(status: int, message: str, retry_after: int = 0) -> Response:
    answer = Response(render_template("error.html", message=redact(message), status=status), status)
    if retry_after:
        answer.headers["Retry-After"] = str(retry_after)
    return answer


def _guarded(app: WSGIApp, hosts: Hosts, pages: Slots) -> WSGIApp:
    """`app` behind the Host allow-list and the page slots (/healthz passes both)."""
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            return app(environ, start_response)
        host = environ.get("HTTP_HOST", "")
        if not hosts.allows(host, str(environ.get("SERVER_PORT", ""))):
            return _plain(start_response, "400 Bad Request",
                          f"Host {host[:100]!r} is not a name this UI answers to (DNS rebinding?); to reach it by "
                          "that name, start it with --ui-allowed-host NAME\n")
        try:
            with pages.take():
                body = app(environ, start_response)
                try:
                    return list(body)  # (rendered before the slot is given back)
                finally:
                    getattr(body, "close", lambda: None)()
        except Busy as err:
            return _plain(start_response, "503 Service Unavailable", f"{err}\n",
                          [("Retry-After", str(err.retry_after))])

    return guarded


def _plain(start_response: Callable[..., Any], status: str, text: str,
           headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                            *(headers or [])])
    return [body]
