"""`gitops plan`, `gitops apply` and `gitops kubeconfig`."""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from gitops.cli.secrets import identity_option, read_identity
from gitops.compile import compile_desired
from gitops.engine import ApplyResult, apply_plan, make_plan, observe_all
from gitops.errors import GitopsError
from gitops.kubeconfig import admin_kubeconfig, person_kubeconfig
from gitops.model.resources import ApiServerOIDC
from gitops.model.validate import InvalidRepo, validate_repo
from gitops.plan import converged
from gitops.plan.actions import Action, Plan, UnknownKind
from gitops.plan.render import (COLOUR, describe, headline, render_json, render_markdown, render_text, safe,
                                unknown_lines)
from gitops.plan.saved import SavedPlan, StalePlan, observed_digest, repo_digest, state_digest
from gitops.printable import printable
from gitops.secrets import load_identities, public_recipient
from gitops.state import LocalDirStore
from gitops.state.records import ClusterRecord
from gitops.cli.trust import reader_options, reader_verifier
from gitops.status.against import plan_against_status
from gitops.status.commit import converged_records
from gitops.status.snapshot import live_fingerprints

STATE_ENV = "GITOPS_STATE_DIR"


def state_store(repo: Path, state_dir: Path | None) -> LocalDirStore:
    """The state directory: --state-dir, $GITOPS_STATE_DIR, or REPO/.gitops-state (git-ignored)."""
    directory = state_dir or (Path(os.environ[STATE_ENV]) if os.environ.get(STATE_ENV) else repo / ".gitops-state")
    if directory.resolve() == repo.resolve():
        raise GitopsError(f"{printable(str(directory))}: the state directory is the repo itself, where its CA keys "
                          "would be committed; use a directory of its own (default REPO/.gitops-state)")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        raise GitopsError(f"{printable(str(directory))}: cannot use as the state directory: "
                          f"{err.strerror or err}") from None
    ignore = directory / ".gitignore"
    if not os.path.lexists(ignore):
        try:
            ignore.write_text("# gitops state: CA keys and allocations. Never commit this directory.\n*\n")
        except OSError:
            pass  # a read-only state directory still plans; saving state into it says why it cannot
    return LocalDirStore(directory)


def load(repo: Path, identity: Path | None = None, *, sealed_ok: bool = False):
    """The validated repo, secret fields decrypted in memory with `identity` (else $GITOPS_IDENTITY)."""
    result = validate_repo(repo, read_identity(identity), sealed_ok=sealed_ok)
    if result.model is None:
        raise InvalidRepo(result.diagnostics)
    return result


repo_argument = click.argument("repo", default=".", type=click.Path(file_okay=False, exists=True, path_type=Path))
def _state_dir(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Path | None:
    """An empty `--state-dir ""` is an error, not the current directory."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("must name a directory (an empty value would be the current directory)")
    return Path(value)


state_option = click.option("--state-dir", type=click.Path(file_okay=False), callback=_state_dir,
                            help=f"Recorded state (CAs, placements); default ${STATE_ENV} or REPO/.gitops-state.")


@click.command()
@repo_argument
@state_option
@click.option("--format", "fmt", type=click.Choice(["text", "markdown"]), default="text", show_default=True,
              help="markdown: a pull-request comment.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", help="json: for machines.")
@click.option("--detailed-exitcode", is_flag=True,
              help="Exit 0 with no changes, 2 with changes, 3 when the plan is incomplete (a hypervisor or the "
                   "BareMetalHosts could not be observed; with or without changes), 1 on error.")
@click.option("--against-status", "status_ref", metavar="REF",
              help="Plan against the observed snapshot and state on this status-branch ref of REPO's git "
                   "(e.g. origin/gitops/status): no hypervisor is contacted. For pull requests.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="Save the plan to FILE (JSON, mode 0600): `gitops apply FILE` executes exactly it, or refuses "
                   "if the repo, the state or the live state moved since.")
@identity_option
@reader_options
def plan(repo: Path, state_dir: Path | None, fmt: str, output: str, detailed_exitcode: bool,
         status_ref: str | None, out: Path | None, identity: Path | None, status_signers: Path | None,
         insecure_unverified_status: bool, status_min_generation: int) -> None:
    """Show what `gitops apply` would change on the hypervisors."""
    # against a snapshot no hypervisor is contacted: encrypted client keys may stay encrypted
    result = load(repo, identity, sealed_ok=bool(status_ref))
    model = result.model
    if status_ref and out:
        raise click.UsageError("--out needs the live state: it cannot be used with --against-status")
    if status_ref:
        verifier = reader_verifier(result.repo.config.status_signers, status_signers, insecure_unverified_status,
                                   status_min_generation)
        planned = plan_against_status(model, result.repo.config, repo, status_ref, verifier=verifier)
    else:
        store = state_store(repo, state_dir)
        state = store.load()
        observed = observe_all(model, result.repo.config, state)
        now = dt.datetime.now(dt.timezone.utc)
        # a plan to show leaves out the clusters whose last converged plan had the same inputs; one to save
        # (--out) has them all, as apply does
        skipped = frozenset() if out is not None else converged.leave_out(
            model, result.repo.config, state, converged.from_json(store.load_converged()), observed,
            live_fingerprints(observed), now)
        planned = make_plan(model, result.repo.config, state, converged.observed_without(observed, skipped),
                            now=now, unchanged=skipped)
    show(planned.plan, fmt, output)
    if out is not None:
        identity_text = read_identity(identity)
        recipient = public_recipient(load_identities(identity_text)[0]) if identity_text else ""
        SavedPlan(planned.plan, repo_digest(result.repo.root, result.repo.files), state_digest(state),
                  observed_digest(observed), planned.state, recipient).write(out)
        click.echo(f"Saved the plan to {out}: `gitops apply {out}` executes exactly these "
                   f"{len(planned.plan.actions)} action(s).", err=output == "json")
        if not recipient:
            click.echo("Its private keys (new clusters' CAs) are in plaintext: pass --identity (or "
                       "$GITOPS_IDENTITY) to seal them to that age identity.", err=True)
    if detailed_exitcode:
        code = detailed_exit_code(planned.plan)
        if code:
            sys.exit(code)


#: `gitops plan --detailed-exitcode`: 0 no changes, 1 error (as Terraform), and:
EXIT_CHANGES = 2
#: something could not be observed: CI must not read the plan as complete, changes or not
EXIT_INCOMPLETE = 3


def detailed_exit_code(the_plan: Plan) -> int:
    if not the_plan.complete:
        return EXIT_INCOMPLETE
    return EXIT_CHANGES if the_plan.actions else 0


def show(the_plan: Plan, fmt: str, output: str) -> None:
    if output == "json":
        click.echo(render_json(the_plan))
    elif fmt == "markdown":
        click.echo(render_markdown(the_plan))
    else:
        render_text(the_plan, Console(highlight=False, soft_wrap=True))


#: unknowns that leave a part of the fleet unapplied until it is reachable again: apply exits EXIT_INCOMPLETE
#: (a files agent that was not running is not one: the apply itself starts it)
UNSEEN_MACHINES = (UnknownKind.HYPERVISOR,)


#: `gitops apply FILE`: the saved plan is stale (the repo, the state or the live state moved); nothing applied
EXIT_STALE = 4


@click.command()
@click.argument("target", default=".", type=click.Path(exists=True, path_type=Path), metavar="REPO|PLANFILE")
@state_option
@click.option("--repo", "repo_option", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="With a PLANFILE: the repo it was made from (default: the current directory).")
@click.option("--allow-mass-delete", is_flag=True, help="Allow removing more pods than prune.maxDeletes.")
@identity_option
def apply(target: Path, state_dir: Path | None, repo_option: Path | None, allow_mass_delete: bool,
          identity: Path | None) -> None:
    """Apply REPO (plan, then execute that plan), or execute a saved PLANFILE exactly.

    A saved plan is refused (exit 4, nothing changed) when the repo, the recorded
    state or the live state moved since `gitops plan --out` made it. When something
    could not be observed (a hypervisor partitioned or powered off), what could be
    checked is applied, nothing on the unobserved part is touched, and apply exits 3
    naming it: the fleet is not as the repo says until it is back.
    """
    saved = SavedPlan.read(target, read_identity(identity)) if not target.is_dir() else None
    repo = (repo_option or Path(".")) if saved is not None else target
    result = load(repo, identity)
    model, config = result.model, result.repo.config
    store = state_store(repo, state_dir)
    recorded = store.load()
    observed = observe_all(model, config, recorded)
    if saved is not None:
        try:
            saved.check(repo_digest(result.repo.root, result.repo.files), state_digest(recorded),
                        observed_digest(observed))
            fresh = make_plan(model, config, recorded, observed)
            again = make_plan(model, config, saved.planned_state, observed)
            saved.verify(recorded, fresh.state, (again.plan, again.state))
        except StalePlan as err:
            click.echo(f"Error: {err}", err=True)
            sys.exit(EXIT_STALE)
        the_plan, state, planned = saved.plan, saved.planned_state, None
    else:
        planned = make_plan(model, config, recorded, observed)
        the_plan, state = planned.plan, planned.state
    console = Console(highlight=False, soft_wrap=True, stderr=False)
    started: dict[int, float] = {}

    def progress(index: int, total: int, action: Action, status: str) -> None:
        if status == "start":
            started[index] = time.monotonic()
            return
        took = time.monotonic() - started.get(index, time.monotonic())
        colour = COLOUR[action.symbol]
        mark = "done" if status == "done" else "[bold red]FAILED[/bold red]"
        console.print(f"[{index + 1}/{total}] [{colour}]{action.symbol} {action.subject}[/{colour}] "
                      f"{safe(describe(action))} ... {mark} ({took:.1f}s)")

    try:
        outcome = apply_plan(the_plan, state, model, config, store, allow_mass_delete=allow_mass_delete,
                             progress=progress, planned=planned)
    except BaseException:
        with contextlib.suppress(GitopsError):  # (records that cannot be replaced match nothing that ran)
            store.save_converged({})  # what ran changed the live state: the next plan compares everything
        raise
    try:
        record_converged(store, outcome, model, config)
    except GitopsError as err:  # it only saves the next plan work: the apply itself is done
        click.echo(f"warning: {err}", err=True)
    report_apply(outcome, console)
    unseen = [u for u in outcome.plan.unknowns if u.kind in UNSEEN_MACHINES]
    if unseen:
        names = "; ".join(u.describe() for u in unseen)
        click.echo(f"error: incomplete apply: {names}. Nothing there was changed; apply again once it is "
                   "reachable", err=True)
        sys.exit(EXIT_INCOMPLETE)


def record_converged(store: LocalDirStore, outcome: ApplyResult, model, config) -> None:
    """Keep, in the state dir, what the plan after the apply says of each cluster with nothing left to do
    (`gitops.plan.converged`): the next `gitops plan` leaves those out while nothing they depend on moved."""
    after = outcome.after
    if after is None:
        store.save_converged({})
        return
    store.save_converged(converged.to_json(converged_records(after, model, config, store.load(),
                                                             live_fingerprints(after.observed))))


def report_apply(outcome: ApplyResult, console: Console) -> None:
    """Unknowns, warnings, the closing line (scripts read `Apply complete: N action(s)`), the follow-up."""
    for line in unknown_lines(outcome.plan):
        console.print(f"[bold magenta]? {safe(line)}[/bold magenta]")
    for warning in outcome.plan.warnings:
        console.print(f"[bold yellow]! {safe(warning)}[/bold yellow]")
    for note in outcome.plan.notes:
        console.print(f"[bold cyan]» {safe(note)}[/bold cyan]")
    if not outcome.executed:
        console.print(safe(headline(outcome.plan)) if outcome.plan.unknowns
                      else "No changes. The live state matches the repo.")
    else:
        console.print(f"Apply complete: {len(outcome.executed)} action(s), exactly as planned.")
    if outcome.follow_up is not None:
        for surprise in outcome.surprises:
            console.print(f"[bold yellow]! {safe(surprise)}[/bold yellow]")
        console.print(f"[bold yellow]Follow-up plan: {len(outcome.follow_up.actions)} action(s) that could not be "
                      "known before this apply (not applied; run `gitops apply` again):[/bold yellow]")
        render_text(outcome.follow_up, console)


@click.command()
@repo_argument
@state_option
@click.option("--cluster", required=True, help="Cluster name.")
@click.option("--endpoint-host-override", help="Put this host in the server URL instead of the ingress IP.")
@click.option("--oidc", "oidc_user", metavar="USERNAME",
              help="A kubeconfig for this person instead, who logs in through the cluster's spec.apiServer.oidc "
                   "issuer (`gitops oidc-login` gets the token); the admin kubeconfig stays as it is.")
def kubeconfig(repo: Path, state_dir: Path | None, cluster: str, endpoint_host_override: str | None,
               oidc_user: str | None) -> None:
    """Print an admin kubeconfig (kubernetes-admin, system:masters) for CLUSTER's ingress, or with --oidc one
    for a person."""
    record, endpoint, oidc = applied_cluster(repo, state_dir, cluster)
    if endpoint is None:
        raise GitopsError(f"Cluster {cluster} has no controlplane-ingress Node, so it has no API endpoint")
    if oidc_user is None:
        click.echo(admin_kubeconfig(cluster, record, endpoint, endpoint_host_override), nl=False)
        return
    from gitops.oidc.login import Login, plugin_args

    if oidc is None:
        raise GitopsError(f"Cluster {cluster} trusts no OIDC issuer: set its spec.apiServer.oidc first")
    args = plugin_args(Login(oidc.issuer_url, oidc.client_id, oidc_user, oidc.ca_bundle))
    click.echo(person_kubeconfig(cluster, record, endpoint, oidc_user, args, endpoint_host_override), nl=False)


def applied_cluster(repo: Path, state_dir: Path | None,
                    cluster: str) -> tuple[ClusterRecord, str | None, ApiServerOIDC | None]:
    """CLUSTER's recorded credentials (it must have been applied), its ingress endpoint (None without one) and
    the OIDC issuer it trusts. Contacts no hypervisor, so encrypted client keys may stay encrypted."""
    model = load(repo, sealed_ok=True).model
    if cluster not in model.clusters:
        raise GitopsError(f"no Cluster {cluster!r} in {repo} (defined: {', '.join(sorted(model.clusters)) or 'none'})")
    state = state_store(repo, state_dir).load()
    record = state.clusters.get(cluster)
    if record is None or record.admin is None:
        raise GitopsError(f"Cluster {cluster} has not been applied yet (no credentials recorded); run gitops apply")
    compiled = compile_desired(model, state)
    return record, compiled.desired.clusters[cluster].api_endpoint, compiled.oidc.get(cluster)


COMMANDS: list[click.Command] = [plan, apply, kubeconfig]
