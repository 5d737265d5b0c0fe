"""The read-only web UI: Flask routes over a `StatusSource`, pages rendered by Jinja2 on the server.

Every page has a stable URL and works without JavaScript: `/` the fleet (`?phase=`, `?q=`),
`/clusters/<name>`, `/applies` and `/applies/<status commit>`, `/shards`, `/plan?ref=<branch>` (the
branch's offline plan against the status branch, as `gitops plan CLONE --against-status` prints it).
Nothing secret is read: kubeconfigs and the sealed state stay on the branch, encrypted.
"""
from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from flask import Flask, Response, abort, render_template, request

from gitops.errors import GitopsError
from gitops.status.backups import BACKUPS_DIR
from gitops.ui import views
from gitops.ui.source import StatusSource

#: how many status commits the applies page and the timelines read
HISTORY = 100
#: branch plans kept, by (branch commit, status commit)
PLANS_KEPT = 16



def create_app(source: StatusSource, planner: Callable[[Path, Path, str], object] | None = None) -> Flask:
    """The UI's WSGI app. `planner(files, mirror, status_ref)` returns the `Plan` of a checkout's files against
    a status ref of the mirror (`gitops.ui.plans.branch_plan`, given here so that this module plans nothing)."""
    app = Flask(__name__)
    app.jinja_env.trim_blocks = app.jinja_env.lstrip_blocks = True
    plans: OrderedDict[tuple[str, str], views.PlanPage] = OrderedDict()
    planning = threading.Lock()

    def now() -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc)

    @app.errorhandler(GitopsError)
    def _gitops_error(err: GitopsError):  # type: ignore[no-untyped-def]
        return render_template("error.html", message=str(err)), 503

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
                               q=request.args.get("q", ""), shards=bool(reader.documents("Shard")))

    @app.get("/clusters/<name>")
    def cluster(name: str) -> str:
        reader = source.reader()
        docs = reader.documents("Cluster")
        if name not in docs:
            abort(404, f"no Cluster {name} on the status branch")
        page = views.cluster_page(name, docs[name], reader.documents("Node"),
                                  reader.documents_in(BACKUPS_DIR).get(name), now())
        rows = _rows(source, now())
        return render_template("cluster.html", page=page, timeline=views.timeline(rows, name),
                               applies=[r for r in rows if name in r.clusters][:10])

    @app.get("/applies")
    def applies() -> str:
        rows = _rows(source, now())
        return render_template("applies.html", rows=rows, timeline=views.timeline(rows))

    @app.get("/applies/<sha>")
    def apply(sha: str) -> str:
        found = next((c for c in source.history(HISTORY) if c.sha == sha or c.sha.startswith(sha)), None)
        if found is None or len(sha) < 7:
            abort(404, f"no status commit {sha} among the last {HISTORY}")
        row = views.apply_row(found.sha, found.time, found.subject, found.source, found.apply, found.applied_here,
                              now())
        return render_template("apply.html", page=views.apply_page(row, found.apply if found.applied_here else None))

    @app.get("/shards")
    def shards() -> str:
        docs = source.reader().documents("Shard")
        return render_template("shards.html", shards=[(n, d.get("status") or {}) for n, d in sorted(docs.items())])

    @app.get("/plan")
    def branch_plan() -> str:
        ref = request.args.get("ref", "").strip()
        source.fetch()
        branches = tuple(source.branches())
        if not ref:
            return render_template("plan.html", page=None, branches=branches, ref="")
        if planner is None:
            abort(404, "this UI plans no branch")
        status_ref = source.status_ref()
        status_sha = source.commit_of(status_ref)
        try:
            with source.checkout(ref) as (files, commit):
                key = (commit, status_sha)
                with planning:  # one plan at a time: a plan of a large fleet takes a core for seconds
                    page = plans.get(key)
                    if page is None:
                        plan = planner(files, source.cache, status_ref)
                        page = views.plan_page(ref, commit, plan, branches)  # type: ignore[arg-type]
                        plans[key] = page
                        while len(plans) > PLANS_KEPT:
                            plans.popitem(last=False)
        except GitopsError as err:
            page = views.plan_error(ref, str(err), branches)
        return render_template("plan.html", page=page, branches=branches, ref=ref)

    return app


def _rows(source: StatusSource, now: dt.datetime) -> list[views.ApplyRow]:
    return [views.apply_row(c.sha, c.time, c.subject, c.source, c.apply, c.applied_here, now)
            for c in source.history(HISTORY)]
