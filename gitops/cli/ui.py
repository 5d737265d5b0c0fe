"""`gitops ui`: the read-only web UI over a repo's status branch (and the UI of `gitops watch --ui`)."""
from __future__ import annotations

import ipaddress
import signal
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import click

from gitops.httpserve import Server, WSGIApp, start
from gitops.redact import redact
from gitops.ui.app import create_app
from gitops.ui.guard import Hosts
from gitops.ui.plans import branch_plan
from gitops.cli.trust import reader_options
from gitops.status.trust import Signers
from gitops.ui.source import MAX_BRANCH_BYTES, MAX_MIRROR_BYTES, MAX_MIRROR_REFS, StatusSource

#: served on loopback unless told otherwise: put it behind a reverse proxy (TLS, sign-in) to share it
DEFAULT_ADDRESS = "127.0.0.1:8080"

#: `--ui-allowed-host`, shared by `gitops ui` and `gitops watch --ui`
allowed_host_option = click.option(
    "--ui-allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]", envvar="GITOPS_UI_ALLOWED_HOSTS",
    help="Also answer requests whose Host header is NAME (at any port, or at PORT only), e.g. the name a reverse "
         "proxy forwards; repeatable ($GITOPS_UI_ALLOWED_HOSTS, space-separated). Other names are refused "
         "(DNS rebinding): by default only the listen address and localhost, 127.0.0.1, [::1] at its port.")


def ui_app(repo: str, branch: str, status_branch: str, cache: Path, refresh: float = 5.0, strict: bool = True,
           listen: str = DEFAULT_ADDRESS, allowed_hosts: Iterable[str] = (),
           max_branch_bytes: int = MAX_BRANCH_BYTES, signers: Signers = Signers(), insecure: bool = False,
           max_refs: int = MAX_MIRROR_REFS, max_fetch_bytes: int = MAX_MIRROR_BYTES, min_generation: int = 0):
    """The UI's WSGI app over `repo` (a URL or a clone), mirrored into `cache`, answering the Host names of
    `listen` and `allowed_hosts`, showing status commits signed by `signers` or spec.status.signers.
    `strict`: the repo must be fetchable now (else the pages say why until it is)."""
    cache.mkdir(parents=True, exist_ok=True)
    source = StatusSource(repo, cache, branch=branch, status_branch=status_branch, refresh=refresh,
                          max_branch_bytes=max_branch_bytes, signers=signers, insecure=insecure, max_refs=max_refs,
                          max_fetch_bytes=max_fetch_bytes, min_generation=min_generation)
    if strict:
        source.fetch(force=True)
    return create_app(source, planner=branch_plan, hosts=Hosts(listen.rpartition(":")[0], allowed_hosts),
                      isolate=True)


def on_loopback(address: str) -> bool:
    """Whether `host:port` listens on loopback only."""
    host = address.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def watch_ui(repo: str, branch: str, status_branch: str, cache: Path, metrics_address: str, ui_address: str,
             allowed_hosts: Iterable[str], signers: Signers = Signers(),
             insecure: bool = False) -> tuple[WSGIApp | None, Server | None]:
    """The UI of `gitops watch --ui`, never beyond loopback unless asked: (the app to serve beside /metrics,
    None) when `ui_address` is the metrics address, or is not given and the metrics address is on loopback;
    else (None, a server of its own on `ui_address`, by default `DEFAULT_ADDRESS`): the image serves /metrics
    on 0.0.0.0, and the UI must not follow it there."""
    beside = ui_address == metrics_address if ui_address else bool(metrics_address) and on_loopback(metrics_address)
    listen = metrics_address if beside else ui_address or DEFAULT_ADDRESS
    app = ui_app(repo, branch, status_branch, cache, refresh=5.0, strict=False, listen=listen,
                 allowed_hosts=allowed_hosts, signers=signers, insecure=insecure)
    return (app, None) if beside else (None, start(app, listen, "ui"))


@click.command()
@click.option("--repo", "repo", required=True, metavar="URL|CLONE",
              help="The infra repo: a URL git can fetch, or a local clone (its status branch and branches are "
                   "read from there).")
@click.option("--branch", default="main", show_default=True, help="The repo's main branch (its gitops.yaml names "
                                                                  "the status branch).")
@click.option("--status-branch", default="", help="The status branch (default: statusBranch of gitops.yaml).")
@click.option("--address", default=DEFAULT_ADDRESS, show_default=True, envvar="GITOPS_UI_ADDRESS",
              help="host:port to listen on ($GITOPS_UI_ADDRESS). Loopback by default: to share the UI, put it "
                   "behind a reverse proxy that adds TLS and sign-in.")
@allowed_host_option
@click.option("--refresh", default=5.0, show_default=True, help="Fetch the repo again at most every N seconds.")
@click.option("--plan-max-mib", default=MAX_BRANCH_BYTES // 2**20, show_default=True, type=click.IntRange(1),
              help="The largest branch /plan checks out: MiB of files (the sum of its blobs), checked before "
                   "anything is archived.")
@click.option("--mirror-max-refs", default=MAX_MIRROR_REFS, show_default=True, type=click.IntRange(1),
              help="The most branches (and notes refs) the UI's mirror fetches: a repo with more is refused "
                   "before anything is fetched.")
@click.option("--mirror-max-mib", default=MAX_MIRROR_BYTES // 2**20, show_default=True, type=click.IntRange(1),
              help="The most MiB one fetch of the UI's mirror brings (the pack it receives; the first fetch is the "
                   "whole repo): a fetch that passes it is stopped and nothing of it kept.")
@reader_options
def ui(repo: str, branch: str, status_branch: str, address: str, allowed_hosts: tuple[str, ...], refresh: float,
       plan_max_mib: int, mirror_max_refs: int, mirror_max_mib: int, status_signers: Path | None,
       insecure_unverified_status: bool, status_min_generation: int) -> None:
    """Serve the status branch as a read-only web UI: the fleet, each cluster, the applies, a branch's plan
    (status commits signed by spec.status.signers of --branch's gitops.yaml, or by --status-signers)."""
    if insecure_unverified_status:
        click.echo("WARNING: --insecure-unverified-status: the UI shows the status branch WITHOUT verifying its "
                   "signatures; anyone who can push there decides what it shows", err=True)
    signers = Signers.from_file(status_signers) if status_signers else Signers()
    with tempfile.TemporaryDirectory(prefix="gitops-ui-mirror-") as cache:
        app = ui_app(repo, branch, status_branch, Path(cache), refresh, listen=address, allowed_hosts=allowed_hosts,
                     max_branch_bytes=plan_max_mib * 2**20, signers=signers, insecure=insecure_unverified_status,
                     max_refs=mirror_max_refs, max_fetch_bytes=mirror_max_mib * 2**20,
                     min_generation=status_min_generation)
        server = start(app, address, "ui")
        click.echo(f"gitops ui: http://{server.address}/ (repo {redact(repo)}; Ctrl-C or SIGTERM stops it)")
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        signal.signal(signal.SIGINT, lambda *_: done.set())
        while not done.wait(0.5):  # (a wait with no end would not wake for a signal another thread receives: its
            pass                   # handler runs in this thread once it runs Python again)
        server.close()


COMMANDS: list[click.Command] = [ui]
