"""`gitops reconcile`, `gitops watch` and `gitops status`: the controller and its status branch."""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import signal
import threading
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gitops import logs
from gitops.cli.secrets import read_identity
from gitops.units import human_age, human_size
from gitops.controller import Controller, ControllerConfig, CoordinationFlags
from gitops.errors import GitopsError
from gitops.gitrepo import as_repo, as_url
from gitops.metrics import serve
from gitops.source import SignaturePolicy
from gitops.status.backups import BACKUPS_DIR
from gitops.cli.trust import reader_options, reader_verifier
from gitops.status.trust import Signers, generation_of
from gitops.status.reader import StatusReader, branch_of_checkout, signers_of_checkout
from gitops.status.report import Result
from gitops.ui.views import rollout_view

log = logging.getLogger("gitops.controller")


def parse_duration(text: str) -> float:
    """`30s`, `5m`, `1h` or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 5m or 1h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def controller_options(f):
    options = [
        click.option("--repo", required=True, help="Infra repo: local path, file://, ssh or https URL."),
        click.option("--branch", default="main", show_default=True, help="Branch to follow."),
        click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
                     default=lambda: os.environ.get("GITOPS_WORKDIR", ".gitops-controller"), show_default=True,
                     help="Where the controller keeps its clones and local state cache ($GITOPS_WORKDIR)."),
        click.option("--identity", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                     default=lambda: os.environ.get("GITOPS_IDENTITY"),
                     help="The controller's age identity (age-keygen output; $GITOPS_IDENTITY): seals its "
                          "state on the status branch."),
        click.option("--insecure-plaintext-secrets", is_flag=True,
                     help="LABS ONLY: write CA keys and kubeconfigs to the status branch unencrypted."),
        click.option("--allowed-signers", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                     help="Require commits signed by a key in this ssh allowed-signers file."),
        click.option("--gpg-home", type=click.Path(file_okay=False, exists=True, path_type=Path),
                     help="Require commits signed by a key in this GnuPG home."),
        click.option("--status-branch", help="Override gitops.yaml's statusBranch."),
        click.option("--status-signing-key", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                     help="SSH private key that signs status commits (default: WORKDIR/status-signing-key, made "
                          "if missing); list its public key in spec.status.signers."),
        click.option("--insecure-unverified-status", is_flag=True,
                     help="Read the status branch without verifying its signatures (labs only; loud)."),
        click.option("--allow-mass-delete", is_flag=True, help="Allow removing more pods than prune.maxDeletes."),
        click.option("--log-format", type=click.Choice(["json", "text"]), default="json", show_default=True),
        click.option("--coordination", "coordination_mode", type=click.Choice(["leader", "shards"]),
                     help="Several controllers through Kubernetes Leases (overrides spec.coordination.mode)."),
        click.option("--coordination-kubeconfig", type=click.Path(dir_okay=False, exists=True),
                     help="Kubeconfig of the cluster holding the Leases (spec.coordination.kubeconfig)."),
        click.option("--coordination-namespace", help="Namespace of the Leases (spec.coordination.namespace)."),
        click.option("--shards", type=click.IntRange(1, 1024), help="Shard count (spec.coordination.shards)."),
        click.option("--replica-id", help="This replica's Lease holder identity (default: the workdir's "
                                          "controller id, hostname/random)."),
        click.option("--lease-duration", type=click.IntRange(2, 3600), help="Seconds (leaseDurationSeconds)."),
        click.option("--renew-deadline", type=click.IntRange(1, 3600), help="Seconds (renewDeadlineSeconds)."),
        click.option("--retry-period", type=click.IntRange(1, 600), help="Seconds (retryPeriodSeconds)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build(repo: str, branch: str, workdir: Path, identity: Path | None, insecure_plaintext_secrets: bool,
          allowed_signers: Path | None, gpg_home: Path | None, status_branch: str | None,
          allow_mass_delete: bool, log_format: str, interval: float = 30.0, coordination_mode: str | None = None,
          coordination_kubeconfig: str | None = None, coordination_namespace: str | None = None,
          shards: int | None = None, replica_id: str | None = None, lease_duration: int | None = None,
          renew_deadline: int | None = None, retry_period: int | None = None,
          status_signing_key: Path | None = None, insecure_unverified_status: bool = False) -> Controller:
    logs.setup(log_format)
    if insecure_plaintext_secrets:
        log.warning("INSECURE: --insecure-plaintext-secrets writes private keys to git in plaintext; labs only")
    signatures = SignaturePolicy(allowed_signers, gpg_home) if (allowed_signers or gpg_home) else None
    repo = as_url(repo)
    config = ControllerConfig(
        repo=repo, workdir=workdir.absolute(), branch=branch,
        identity=read_identity(identity) if identity else None,
        insecure_plaintext_secrets=insecure_plaintext_secrets, signatures=signatures,
        allow_mass_delete=allow_mass_delete, interval=interval, status_branch=status_branch,
        status_signing_key=status_signing_key.absolute() if status_signing_key else None,
        insecure_unverified_status=insecure_unverified_status,
        coordination=CoordinationFlags(
            mode=coordination_mode, namespace=coordination_namespace, shards=shards, replica_id=replica_id,
            kubeconfig=str(Path(coordination_kubeconfig).absolute()) if coordination_kubeconfig else None,
            lease_duration=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period))
    return Controller(config)


@click.command()
@controller_options
@click.option("--once", is_flag=True, default=True, help="Reconcile one time and exit (the default).")
def reconcile(once: bool, **options) -> None:
    """Reconcile the branch tip once: verify, validate, apply, publish status. Exit 1 unless applied (or standing
    by: one of several replicas holding no Lease)."""
    controller = build(**options)
    try:
        outcome = controller.reconcile_once()
    finally:
        controller.release()
    click.echo(f"{outcome.result.value}: {outcome.message}")
    if outcome.result not in (Result.APPLIED, Result.STANDING_BY):
        raise SystemExit(1)


@click.command()
@controller_options
@click.option("--interval", default="30s", show_default=True, help="Poll interval (30s, 5m, ...).")
@click.option("--metrics-address", default="127.0.0.1:9100", show_default=True, envvar="GITOPS_METRICS_ADDRESS",
              help="host:port for /metrics and /healthz ($GITOPS_METRICS_ADDRESS); empty to disable.")
@click.option("--watch-local/--no-watch-local", default=True, show_default=True,
              help="When --repo is a local working copy, reconcile as soon as a commit lands (debounced).")
@click.option("--exit-watch", default="1s", show_default=True,
              help="How often each hypervisor is asked for exited API servers, controller-managers, schedulers "
                   "and ingress containers; one wakes the controller at once (its plan restarts it, backed off "
                   "for one that keeps failing). 0 turns it off (restarts wait for the poll).")
@click.option("--ui", "with_ui", is_flag=True,
              help="Also serve the read-only web UI (as `gitops ui`): beside /metrics when --metrics-address is on "
                   "loopback, else on --ui-address.")
@click.option("--ui-address", default="", envvar="GITOPS_UI_ADDRESS",
              help="host:port of the UI ($GITOPS_UI_ADDRESS; default: beside /metrics on a loopback "
                   "--metrics-address, else 127.0.0.1:8080). The UI leaves loopback only when this says so.")
@click.option("--ui-allowed-host", "ui_allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              envvar="GITOPS_UI_ALLOWED_HOSTS",
              help="Host header names the UI also answers (as `gitops ui --ui-allowed-host`); repeatable.")
def watch(interval: str, metrics_address: str, watch_local: bool, exit_watch: str, with_ui: bool, ui_address: str,
          ui_allowed_hosts: tuple[str, ...], **options) -> None:
    """Run the controller: reconcile every --interval until SIGTERM (which finishes the current action)."""
    seconds = parse_duration(interval)
    controller = build(**options, interval=seconds)
    fallback = ui_server = server = None
    if with_ui:
        from gitops.cli.ui import watch_ui  # here: the web framework loads only when asked for

        config = controller.config
        # the UI trusts what the controller does: its own key, and spec.status.signers on the main branch
        fallback, ui_server = watch_ui(config.repo, config.branch, config.status_branch or "",
                                       config.workdir / "ui-mirror", metrics_address, ui_address, ui_allowed_hosts,
                                       Signers((controller.signing_key.signer,)), config.insecure_unverified_status)
    if metrics_address:
        server = serve(controller.metrics, metrics_address, stale_after=max(3 * seconds, 300), fallback=fallback)
        log.info("serving /metrics and /healthz" + (" and the UI" if fallback else ""),
                 extra={"address": server.address})
    if with_ui:
        log.info("serving the UI", extra={"address": (ui_server or server).address})  # type: ignore[union-attr]
        click.echo(f"gitops ui: http://{(ui_server or server).address}/", err=True)  # type: ignore[union-attr]
    trigger = controller.trigger

    def stop(signum, _frame) -> None:
        log.info("signal received: finishing the current action, then stopping", extra={"signal": signum})
        controller.stop.set()
        trigger.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    local = Path(controller.config.repo)
    if watch_local and (local / ".git").is_dir():
        threading.Thread(target=_watch_local, args=(local, trigger, controller.stop), daemon=True,
                         name="watch-local").start()
    exits = controller.watch_exits(parse_duration(exit_watch)) if exit_watch not in ("0", "0s") else None
    try:
        controller.run(trigger)
    finally:
        if exits is not None:
            exits.stop()
        controller.release()


#: how often a working copy's refs are polled when the kernel gives no inotify watch for them
REFS_POLL_MS = 500


def _watch_local(path: Path, trigger: threading.Event, stop: threading.Event) -> None:
    """Fire `trigger` when the working copy's git refs change (a commit), debounced. The refs the
    controller writes there itself (its status branch, its apply lease under refs/gitops/, the commits'
    outcome notes under refs/notes/) are not commits to reconcile: reacting to them would reconcile
    again after every status commit. When the kernel refuses an inotify instance or watch (its per-user
    limits, fs.inotify.max_user_instances and max_user_watches, spent by other programs), the refs are
    polled every REFS_POLL_MS instead, and that is logged: a commit is still seen within about 1.5 s."""
    from watchfiles import watch as watch_files
    from watchfiles._rust_notify import WatchfilesRustInternalError

    own = (f"/refs/heads/{branch_of_checkout(path)}", "/refs/gitops", "/refs/notes")

    def is_commit(_change: object, name: str) -> bool:
        ref = name.replace(os.sep, "/")
        if os.path.isdir(name) or ref.endswith(("/FETCH_HEAD", "/ORIG_HEAD")):
            return False  # a ref's directory appearing, or git noting a fetch: not a commit
        return ("/refs/" in ref or ref.endswith("HEAD")) and not any(mark in ref for mark in own)

    def fire_on_commits(*paths: Path, **polling: object) -> None:
        for _changes in watch_files(*paths, stop_event=stop, debounce=1000, recursive=True, watch_filter=is_commit,
                                    **polling):
            log.info("local commit detected; reconciling now", extra={"path": str(path), "polled": bool(polling)})
            trigger.set()

    git = path / ".git"
    try:
        return fire_on_commits(git)
    except (WatchfilesRustInternalError, OSError) as err:
        log.warning("cannot watch the working copy with inotify; polling its refs instead (the per-user "
                    "limits fs.inotify.max_user_instances and max_user_watches are spent)",
                    extra={"path": str(path), "error": str(err), "poll_ms": REFS_POLL_MS})
    # the refs alone (a commit moves a loose ref; HEAD and packed-refs for the rest): polling all of .git
    # would walk every loose object twice a second
    fire_on_commits(*(p for p in (git / "refs", git / "HEAD", git / "packed-refs") if p.exists()),
                    force_polling=True, poll_delay_ms=REFS_POLL_MS)


def clusters_table(clusters: dict[str, dict], backups: dict[str, dict]) -> Table:
    """One row per Cluster status document, with its last backup."""
    table = Table("CLUSTER", "PHASE", "REASON", "API", "NODES READY", "WORKERS READY", "LAST BACKUP", "SOURCE")
    now = dt.datetime.now(dt.timezone.utc)
    for name, doc in clusters.items():
        st = doc["status"]
        ready = sum(1 for p in st.get("nodes", {}).values() if p == "Ready")
        workers = st.get("workers") or {}
        joined = f"{workers['ready']}/{workers['total']}" if workers.get("observed") else "?"
        table.add_row(name, st["phase"], st["conditions"][0]["reason"], st.get("endpoints", {}).get("api", ""),
                      f"{ready}/{len(st.get('nodes', {}))}", joined, last_backup(backups.get(name), now),
                      str(st.get("observedSourceSHA", ""))[:12])
    return table


def last_backup(doc: dict | None, now: dt.datetime) -> str:
    """`ID, AGE ago, SIZE` of the cluster's last snapshot, and `failed` when the last attempt failed."""
    if not doc:
        return "-"
    status = doc.get("status", {})
    last = status.get("lastSnapshot")
    text = "none"
    if last:
        age = int((now - dt.datetime.fromisoformat(last["time"])).total_seconds())
        text = f"{last['id'][:8]}, {human_age(age)} ago, {human_size(last['bytes'])}"
    ok = next((c for c in status.get("conditions", ()) if c.get("type") == "BackedUp"), {})
    return text + (" (last attempt failed)" if ok.get("status") == "False" else "")


@click.command()
@click.option("--repo", "repo", default=".", show_default=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="A clone of the infra repo.")
@click.option("--ref", default=None, help="Status ref (default: origin/<statusBranch>, else <statusBranch>).")
@click.option("--cluster", help="Show one cluster and its nodes.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@reader_options
def status(repo: Path, ref: str | None, cluster: str | None, output: str, status_signers: Path | None,
           insecure_unverified_status: bool, status_min_generation: int) -> None:
    """Show the controller's status branch: clusters, or one cluster's nodes (its tip verified against
    spec.status.signers of the clone's gitops.yaml and --status-signers)."""
    verifier = reader_verifier(signers_of_checkout(repo), status_signers, insecure_unverified_status,
                               status_min_generation)
    reader = StatusReader.for_clone(repo, ref, verifier)
    ref = reader.ref
    generation = generation_of(repo, as_repo(repo).commit_of(ref))  # (for --status-min-generation next time)
    src = reader.source()
    docs = {kind: reader.documents(kind) for kind in ("Cluster", "Node", "Hypervisor", "SIPCluster", "Shard")}
    backups = reader.documents_in(BACKUPS_DIR)
    if cluster is not None and cluster not in docs["Cluster"]:
        raise GitopsError(f"no status for Cluster {cluster!r} on {ref} (known: {', '.join(docs['Cluster']) or 'none'})")
    if output == "json":
        data = {"ref": ref, "generation": generation, "source": src.status, "rollout": reader.rollout(),
                "clusters": {n: d["status"] for n, d in docs["Cluster"].items() if cluster in (None, n)},
                "nodes": {n: d["status"] for n, d in docs["Node"].items()
                          if cluster is None or d.get("spec", {}).get("cluster") == cluster},
                "sipClusters": {n: d["status"] for n, d in docs["SIPCluster"].items() if cluster is None},
                "shards": {n: d["status"] for n, d in docs["Shard"].items() if cluster is None},
                "backups": {n: d["status"] for n, d in backups.items() if cluster in (None, n)}}
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    console = Console(highlight=False, width=None if Console().is_terminal else 160)
    console.print(f"source: {src.result or '?'}  seen {src.last_seen_sha[:12]}  in force {src.applied_sha[:12]}  "
                  f"status generation {generation}")
    for error in src.errors:
        console.print(f"  [red]{error}[/red]")
    rollout = reader.rollout()
    if rollout is not None and cluster is None:
        console.print(rollout_table(rollout))
    if cluster is None:
        table = clusters_table(docs["Cluster"], backups)
    else:
        table = Table("NODE", "PHASE", "HYPERVISOR", "COMPONENTS", "MESSAGE")
        for name, doc in docs["Node"].items():
            if doc.get("spec", {}).get("cluster") != cluster:
                continue
            st = doc["status"]
            states = st.get("components", {})
            bad = [f"{c} {s}" for c, s in states.items() if s != "running"]
            components = f"{len(states) - len(bad)}/{len(states)} running" + (f" ({', '.join(bad)})" if bad else "")
            table.add_row(name, st["phase"], st.get("hypervisor", ""), components, st["conditions"][0]["message"])
    console.print(table)
    if cluster is not None:
        workers = docs["Cluster"][cluster]["status"].get("workers") or {}
        if workers.get("observed"):
            joined = Table("WORKER", "READY", "ADDRESS", "KUBELET")
            for name, w in sorted(workers.get("nodes", {}).items()):
                joined.add_row(name, "yes" if w["ready"] else "no", w.get("address", ""), w.get("kubeletVersion", ""))
            console.print(joined)
        else:
            console.print(f"workers: unknown ({workers.get('reason', 'not observed')})")
    if cluster is None and docs["SIPCluster"]:
        sip = Table("SIPCLUSTER", "PHASE", "HOSTS (active / standby)", "MESSAGE")
        for name, doc in docs["SIPCluster"].items():
            st = doc["status"]
            hosts = "; ".join(f"{role}: {len(h['active'])}/{len(h['standby'])}" for role, h in st["hosts"].items())
            sip.add_row(name, st["phase"], hosts, st["conditions"][0]["message"])
        console.print(sip)
    if cluster is None and docs["Shard"]:
        shards = Table("SHARD", "HOLDER", "CLUSTERS", "RESULT", "ACTIONS", "SOURCE")
        for name, doc in sorted(docs["Shard"].items(), key=lambda item: _shard_order(item[0])):
            st = doc["status"]
            shards.add_row(name, st.get("holder", ""), ", ".join(st.get("clusters", [])) or "-",
                           st.get("result", ""), str(st.get("actions", 0)), str(st.get("observedSourceSHA", ""))[:12])
        console.print(shards)


def rollout_table(rollout: dict) -> Table:
    """The last rollout through spec.rollout.waves: each wave started, its clusters' figures, a halt's reason."""
    halted = rollout.get("halted") or {}
    title = f"rollout of {str(rollout.get('commit', ''))[:12]}: {rollout.get('phase', '?')}"
    if halted:
        title += f" at wave {halted.get('wave')} (cluster {halted.get('cluster')}: {halted.get('reason')})"
    table = Table("WAVE", "PHASE", "CLUSTER", "PROBED", "FAILED", "SUCCESS", "READY WORKERS", title=title,
                  title_justify="left")
    view = rollout_view(rollout)
    for r in view.rows if view is not None else ():
        table.add_row(r.wave, r.phase, r.cluster, r.probed, r.failed, r.success, r.workers)
    return table


def _shard_order(name: str) -> tuple[int, str]:
    """gitops-shard-<i>-of-<n> by i (10 after 9), others by name."""
    match = re.fullmatch(r"gitops-shard-(\d+)-of-\d+", name)
    return (int(match.group(1)), name) if match else (-1, name)


COMMANDS: list[click.Command] = [reconcile, watch, status]
