"""`gitops ui`: the read-only web UI over a repo's status branch."""
from __future__ import annotations

import signal
import tempfile
import threading
from pathlib import Path

import click

from gitops.httpserve import start
from gitops.ui.app import create_app
from gitops.ui.plans import branch_plan
from gitops.ui.source import StatusSource

#: served on loopback unless told otherwise: put it behind a reverse proxy (TLS, sign-in) to share it
DEFAULT_ADDRESS = "127.0.0.1:8080"


def ui_app(repo: str, branch: str, status_branch: str, cache: Path, refresh: float = 5.0, strict: bool = True):
    """The UI's WSGI app over `repo` (a URL or a clone), mirrored into `cache`. `strict`: the repo must be
    fetchable now (else the pages say why until it is)."""
    cache.mkdir(parents=True, exist_ok=True)
    source = StatusSource(repo, cache, branch=branch, status_branch=status_branch, refresh=refresh)
    if strict:
        source.fetch(force=True)
    return create_app(source, planner=branch_plan)


@click.command()
@click.option("--repo", "repo", required=True, metavar="URL|CLONE",
              help="The infra repo: a URL git can fetch, or a local clone (its status branch and branches are "
                   "read from there).")
@click.option("--branch", default="main", show_default=True, help="The repo's main branch (its gitops.yaml names "
                                                                  "the status branch).")
@click.option("--status-branch", default="", help="The status branch (default: statusBranch of gitops.yaml).")
@click.option("--address", default=DEFAULT_ADDRESS, show_default=True,
              help="host:port to listen on. Loopback by default: to share the UI, put it behind a reverse proxy "
                   "that adds TLS and sign-in.")
@click.option("--refresh", default=5.0, show_default=True, help="Fetch the repo again at most every N seconds.")
def ui(repo: str, branch: str, status_branch: str, address: str, refresh: float) -> None:
    """Serve the status branch as a read-only web UI: the fleet, each cluster, the applies, a branch's plan."""
    with tempfile.TemporaryDirectory(prefix="gitops-ui-mirror-") as cache:
        app = ui_app(repo, branch, status_branch, Path(cache), refresh)
        server = start(app, address, "ui")
        click.echo(f"gitops ui: http://{server.address}/ (Ctrl-C or SIGTERM stops it)")
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        signal.signal(signal.SIGINT, lambda *_: done.set())
        done.wait()
        server.close()


COMMANDS: list[click.Command] = [ui]
