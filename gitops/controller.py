"""The controller: poll the infra repo, reconcile one commit at a time, report on the status branch.

One reconcile, as named stages: fetch the branch tip (a `Revision`, the
artifact later stages read); verify its signature (when required) and validate
it: a commit that fails either is refused as a whole, and the last good commit
stays the `Target` (it keeps being reconciled, so drift still heals). Then apply
under the apply lease (plan, execute, plan the follow-up: an `Applied`, failures
included, as data), and report: status, the executed plan, the observed
snapshot, encrypted kubeconfigs and the controller state in one commit on the
status branch, or none when nothing changed.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import logging
import os
import socket
import uuid
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gitops.apply import ApplyError
from gitops.compile.sip_services import service_cluster
from gitops.coordination.lease import LeaseAPI, Timing
from gitops.coordination.member import Member
from gitops.coordination.scope import PlacementRaced, Scope, file_owner
from gitops.coordination.shards import LEADER, shard_leases
from gitops.errors import GitopsError
from gitops.kubeapi import KubeAPI
from gitops.kubeconfig import admin_kubeconfig
from gitops.metrics import Metrics
from gitops.model.validate import Validation, validate_repo
from gitops.engine import Planned, apply_repo, desired_for, observe_all
from gitops.model.config import Coordination, RepoConfig, coordination_problems
from gitops.model.resources import RepoModel
from gitops.observe import ObservedState
from gitops.observe.clusters import ClusterReader
from gitops.plan.actions import Plan
from gitops.state.records import State
from gitops.source import GitSource, Revision, SignatureError, SignaturePolicy
from gitops.status.branch import StatusBranch
from gitops.status.lease import ApplyLease
from gitops.status.reader import APPLY, DEFAULT_BRANCH, MANAGED, PUBLIC, SOURCE, kubeconfig_path, resource_path
from gitops.status.report import (
    Outcome,
    Result,
    apply_document,
    dump,
    resource_documents,
    sip_documents,
    source_document,
)
from gitops.status.poll import NodeFilesCache, live_fingerprint
from gitops.status.snapshot import snapshot_files
from gitops.status.state import ControllerStateStore, Sealer

log = logging.getLogger("gitops.controller")

#: In the workdir: the statusBranch of the commit in force, for reporting a refused commit there.
IN_FORCE_BRANCH = "status-branch"


@dataclass(frozen=True)
class CoordinationFlags:
    """`gitops watch` flags over gitops.yaml's spec.coordination (None: the repo's value)."""

    mode: str | None = None
    kubeconfig: str | None = None
    namespace: str | None = None
    shards: int | None = None
    lease_duration: int | None = None
    renew_deadline: int | None = None
    retry_period: int | None = None
    #: holder identity (default: the workdir's controller id)
    replica_id: str | None = None

    def over(self, repo: Coordination) -> Coordination:
        fields = {f: getattr(self, f) for f in ("mode", "kubeconfig", "namespace", "shards", "lease_duration",
                                                 "renew_deadline", "retry_period") if getattr(self, f) is not None}
        return dataclasses.replace(repo, **fields)


@dataclass
class ControllerConfig:
    repo: str
    workdir: Path
    branch: str = "main"
    identity: str | None = None  # age identity text
    insecure_plaintext_secrets: bool = False
    signatures: SignaturePolicy | None = None
    allow_mass_delete: bool = False
    interval: float = 30.0
    lock_ttl: dt.timedelta = field(default_factory=lambda: dt.timedelta(minutes=10))
    status_branch: str | None = None  # overrides gitops.yaml's statusBranch
    coordination: CoordinationFlags = field(default_factory=CoordinationFlags)


@dataclass(frozen=True)
class Target:
    """The validated commit to apply: the new one, or the last good one while the new one is refused."""

    sha: str
    validation: Validation

    @property
    def model(self) -> RepoModel:
        assert self.validation.model is not None
        return self.validation.model

    @property
    def config(self) -> RepoConfig:
        return self.validation.repo.config


@dataclass(frozen=True)
class Quiet:
    """The last reconcile left the live state converged: its commit, live fingerprint and outcome."""

    target: Target
    fingerprint: str
    outcome: Outcome
    #: several controllers: what this replica owned then (another set of shards is another reconcile)
    scope: Scope | None = None

    @property
    def held(self) -> frozenset[str]:
        return self.scope.held if self.scope is not None else frozenset()


@dataclass(frozen=True)
class Applied:
    """What the apply stage did, as data for the report."""

    result: Result
    message: str
    actions: int
    #: the plan that was executed (None when planning itself failed)
    plan: Plan | None
    error: str = ""
    stopped: bool = False
    follow_up: Plan | None = None
    surprises: tuple[str, ...] = ()
    #: the planning pass after executing (its observation is the live state)
    after: Planned | None = None
    #: a Lease lost or stale stopped the run before this action ("" when not)
    fenced: str = ""


class Controller:
    def __init__(self, config: ControllerConfig, metrics: Metrics | None = None):
        self.config = config
        self.source = GitSource(config.repo, config.workdir, config.branch, config.signatures)
        self.sealer = Sealer(config.identity, config.insecure_plaintext_secrets)
        self.store = ControllerStateStore(self.sealer, config.workdir / "state-cache")
        self._workdir_lock = _lock_workdir(config.workdir)
        self.holder = _holder_id(config.workdir)
        self.stop = threading.Event()
        self.metrics = metrics or Metrics()
        self._status: dict[str, StatusBranch] = {}
        #: node files read on earlier polls, and the last converged reconcile (None: the next poll does it all)
        self.files = NodeFilesCache(RepoConfig().node_files_interval)
        self.clusters = ClusterReader(RepoConfig().cluster_objects_interval)
        self._quiet: Quiet | None = None
        #: several controllers (spec.coordination): this replica's Leases, and the settings they run with
        self.identity = config.coordination.replica_id or self.holder
        self.member: Member | None = None
        self._coordination = Coordination()
        self._repo_coordination = Coordination()
        #: set to reconcile at once (the Leases held changed)
        self.trigger = threading.Event()

    def status_branch(self, name: str) -> StatusBranch:
        name = self.config.status_branch or name
        if name not in self._status:
            self._status[name] = StatusBranch(self.config.repo, self.config.workdir, name)
        return self._status[name]

    # ------------------------------------------------------------------ one reconcile

    def reconcile_once(self) -> Outcome:
        started = time.monotonic()
        try:
            outcome = self._reconcile()
        except GitopsError as err:
            self.metrics.record(time.monotonic() - started, "error")
            log.error("reconcile failed", extra={"error": str(err)})
            raise
        self.metrics.record(time.monotonic() - started, outcome.result.value.lower())
        return outcome

    def _reconcile(self) -> Outcome:
        """fetch → (nothing changed since the last converged reconcile: stop) → verify and validate →
        choose what is in force → (several controllers: which shards this one holds) → apply → report."""
        now = dt.datetime.now(dt.timezone.utc)
        quiet, self._quiet = self._quiet, None
        live = None
        if quiet is not None and quiet.held == self._held():
            with ThreadPoolExecutor(max_workers=1) as pool:  # git fetch while the live state is read
                fetching = pool.submit(self.source.fetch)
                live = scoped_observed(observe_all(scoped_model(quiet.target.model, quiet.scope), quiet.target.config,
                                                   self.store.load(), reuse=self.files.reuse, clusters=self.clusters),
                                       quiet.scope)
                sha = fetching.result()
            if sha != quiet.target.sha:
                live = None  # a new commit: its own model is observed
            elif live_fingerprint(live, self.files.files_digest) == quiet.fingerprint:
                self.files.remember(live)
                self._quiet = quiet
                log.info("nothing changed", extra={"sha": sha, "node_files_reused": self.files.reused})
                return quiet.outcome
            else:
                log.info("the live state changed", extra={"sha": sha})
        else:
            sha = self.source.fetch()
        revision = self._checkout(sha)
        refusal, validation = self._check(revision)
        ok = validation is not None and validation.ok
        branch_name = validation.repo.config.status_branch if ok else self._last_status_branch()
        self._coordinate(validation.repo.config if ok else None)
        scope = self._scope(validation.model if ok else None)
        if scope is not None and not scope.held:
            log.info("standing by: this replica holds no Lease", extra={"sha": sha, "identity": self.identity})
            return Outcome(sha=sha, result=Result.STANDING_BY, message="standing by: this replica holds no Lease")
        status = self.status_branch(branch_name)
        status.sync()
        origin = self.store.restore(status.read, use_cache=scope is None)
        log.info("state restored", extra={"from": origin, "generation": self.store.generation})
        applied_before = status.reader.applied_sha()
        refused: Outcome | None = None
        if refusal:
            refused = self._refuse(revision.sha, refusal, applied_before, status, now, scope)
            if not applied_before:
                return refused
            target = Target(applied_before, self._last_good(applied_before))  # keeps healing drift
            scope = self._scope(target.model)
        else:
            assert validation is not None
            target = Target(revision.sha, validation)
        applied = self._apply(target, status, live if live is not None and target.sha == sha else None, scope)
        outcome = self._report(target, applied, refused, applied_before, status, now, scope)
        self._remember(target, applied, outcome, refused, scope)
        return outcome

    def _remember(self, target: Target, applied: Applied, outcome: Outcome, refused: Outcome | None,
                  scope: Scope | None = None) -> None:
        """After a reconcile that left the live state converged and fully observed, the next polls
        stop early while the commit and the live state stay the same."""
        after = applied.after
        if (refused is not None or outcome.result != Result.APPLIED or after is None or applied.follow_up is not None
                or not after.plan.empty or not after.plan.complete):
            self.files.forget()
            self.clusters.forget()
            return
        self.files.interval = target.config.node_files_interval
        self.files.remember(after.observed)
        self.clusters.objects_interval = target.config.cluster_objects_interval
        self.clusters.remember(after.observed.clusters)
        self._quiet = Quiet(target, live_fingerprint(after.observed, self.files.files_digest), dataclasses.replace(
            outcome, actions=0, message=f"commit {target.sha[:12]} in force; nothing changed"), scope)

    # ------------------------------------------------------------------ stages

    def _checkout(self, sha: str) -> Revision:
        """The fetched tip, checked out: the artifact every later stage reads."""
        revision = self.source.checkout(sha)
        log.info("reconcile", extra={"sha": sha, "subject": revision.subject})
        return revision

    def _check(self, revision: Revision) -> tuple[list[str], Validation | None]:
        """(why the commit is refused, its validation): a bad signature or a bad repo refuses it whole."""
        try:
            signer = self.source.verify(revision.sha)
            if signer:
                log.info("signature verified", extra={"sha": revision.sha, "signer": signer})
        except SignatureError as err:
            return [str(err)], None
        validation = validate_repo(revision.path, self.config.identity)  # decrypts secret fields in memory
        return [str(d) for d in validation.diagnostics], validation

    def _refuse(self, sha: str, refusal: list[str], applied_before: str, status: StatusBranch,
                now: dt.datetime, scope: Scope | None = None) -> Outcome:
        log.warning("commit refused", extra={"sha": sha, "errors": len(refusal)})
        outcome = Outcome(sha=sha, result=Result.REFUSED, errors=tuple(refusal), applied_sha=applied_before,
                          message=f"commit {sha[:12]} refused: {refusal[0]}" + (
                              f" (and {len(refusal) - 1} more)" if len(refusal) > 1 else "")
                          + (f"; {applied_before[:12]} stays in force" if applied_before else ""))
        if scope is None or scope.owns_global:  # one replica reports the commit itself
            status.publish(lambda s: s.write_tree({SOURCE: source_document(outcome, s.read, now)}, (SOURCE,)),
                           f"refuse {sha[:12]}: {len(refusal)} error(s)")
        return outcome

    def _last_good(self, sha: str) -> Validation:
        validation = validate_repo(self.source.checkout(sha).path, self.config.identity)
        if validation.model is None:
            raise GitopsError(f"the last good commit {sha[:12]} no longer validates")
        return validation

    def _apply(self, target: Target, status: StatusBranch, live: ObservedState | None = None,
               scope: Scope | None = None) -> Applied:
        """Plan and execute under the apply lease (the git lock, or this replica's Leases: only the
        actions of its shards, each fenced); failures become data for the report. `live`: this poll's
        observation already made, for the first plan (later ones observe again)."""
        model, config = scoped_model(target.model, scope), target.config
        if scope is None:
            ApplyLease(status.repo).acquire(self.holder, self.config.lock_ttl)
        sha = target.sha
        first = [live] if live is not None else []

        def watch(m: RepoModel) -> ObservedState:
            return first.pop() if first else scoped_observed(observe_all(m, config, store.load()), scope)

        store, restrict, fence = self.store, None, None
        if scope is not None:
            store = _WriteAhead(self.store, scope, lambda: self._publish_state(status, scope))
            restrict, fence = (lambda planned: _restricted(planned, scope)), self._fence(scope)
            assert self.member is not None
            self.member.busy = set(scope.held)  # not given up for fair share while this runs
        try:
            result = apply_repo(model, config, store, allow_mass_delete=self.config.allow_mass_delete,
                                should_stop=self.stop.is_set, source=sha, progress=_progress(scope),
                                observe_fn=watch, restrict=restrict, fence=fence)
        except ApplyError as err:
            log.error("apply failed", extra={"sha": sha, "error": str(err)})
            return Applied(Result.FAILED, str(err), len(err.executed), err.plan, error=str(err))
        except PlacementRaced as err:  # nothing ran; plan again at once, from the branch as it is now
            log.warning("placement raced another replica", extra={"sha": sha, "error": str(err)})
            self.trigger.set()
            return Applied(Result.FAILED, str(err), 0, None, error=str(err))
        except GitopsError as err:
            log.error("apply failed", extra={"sha": sha, "error": str(err)})
            return Applied(Result.FAILED, str(err), 0, None, error=str(err))
        finally:
            if self.member is not None:
                self.member.busy = set()
        message = f"commit {sha[:12]} applied"
        if result.fenced:
            return Applied(Result.FAILED, f"stopped before the plan was done: {result.fenced}",
                           len(result.executed), result.plan, stopped=True, fenced=result.fenced)
        if result.stopped:
            return Applied(Result.FAILED, "stopped on request before the plan was done", len(result.executed),
                           result.plan, stopped=True)
        if result.follow_up is not None:
            message += (f"; follow-up plan: {len(result.follow_up.actions)} action(s) not known before this "
                        "apply, applied on the next poll")
        return Applied(Result.APPLIED, message, len(result.executed), result.plan, follow_up=result.follow_up,
                       surprises=tuple(result.surprises), after=result.after)

    def _fence(self, scope: Scope):
        member = self.member
        assert member is not None

        def fence(action) -> str | None:
            lease = scope.lease_of(action.cluster)
            if member.fresh(lease):
                return None
            return f"Lease {lease} (cluster {action.cluster or '-'}) is no longer held fresh by {self.identity}"
        return fence

    def _report(self, target: Target, applied: Applied, refused: Outcome | None, applied_before: str,
                status: StatusBranch, now: dt.datetime, scope: Scope | None = None) -> Outcome:
        """One status commit: source, the executed plan, resources, SIPClusters, kubeconfigs, state. One of
        several replicas writes only its shards' files (and the global ones if it holds shard 0), the
        state merged with the branch's, and a `status/Shard/<lease>.yaml` per Lease it holds."""
        model, config, sha = scoped_model(target.model, scope), target.config, target.sha
        in_force = sha if applied.result == Result.APPLIED else applied_before
        if in_force == sha:
            self._record_status_branch(config.status_branch)
        if refused is not None:
            report = Outcome(sha=refused.sha, result=Result.REFUSED, message=refused.message, errors=refused.errors,
                             applied_sha=in_force, actions=applied.actions)
        else:
            report = Outcome(sha=sha, result=applied.result, message=applied.message, applied_sha=in_force,
                             actions=applied.actions)
        record = None
        if applied.plan is not None and (applied.actions or applied.error or applied.follow_up is not None):
            record = apply_document(sha, applied.plan, applied.actions, applied.error, applied.stopped,
                                    applied.follow_up, list(applied.surprises), now)
        last = applied.after
        if last is not None:  # its observation is the live state after the apply
            observed, compiled, sip = last.observed, last.compiled, last.sip
        else:
            observed = scoped_observed(observe_all(model, config, self.store.load()), scope)
            compiled, sip = desired_for(model, config, self.store.load(), observed)
        placements = {n: (r.hypervisor, dict(r.ports)) for n, r in self.store.state.nodes.items()}

        def write(branch: StatusBranch) -> None:
            files = {SOURCE: source_document(report, branch.read, now), **snapshot_files(observed)}
            previous = branch.read(APPLY)
            if record is not None or previous is not None:
                files[APPLY] = record if record is not None else previous
            files.update(resource_documents(model, compiled.desired, observed, report, branch.read, now, placements))
            files.update(sip_documents(model, sip, report, branch.read, now, compiled.desired, placements))
            files.update(self._kubeconfigs(compiled.desired, config.kubeconfig_recipients, branch))
            if scope is None:
                files.update(self.store.files({rel: branch.read(rel) for rel in (PUBLIC, self.sealer.path)}))
                branch.write_tree(files, MANAGED + (SOURCE,))
                return
            files.update(self._state_files(branch, scope))
            files.update(self._shard_files(scope, model, report))
            mine = self._mine(scope, model, compiled.desired)
            keep = {rel: data for rel, data in files.items() if mine(rel)}
            managed = {rel for rel in branch.tracked() if _under(rel, MANAGED + (SOURCE,)) and mine(rel)}
            branch.write_tree(keep, tuple(sorted(managed | keep.keys())))

        summary = f"{report.result.value.lower()} {sha[:12]}: {applied.actions} action(s)"
        if scope is not None:
            summary += f" [{self.identity}: {', '.join(sorted(scope.held))}]"
        committed = status.publish(write, summary)
        log.info("reconciled", extra={"sha": sha, "result": report.result.value, "actions": applied.actions,
                                      "status_commit": committed or ""})
        return report

    # ------------------------------------------------------------------ several controllers

    def _held(self) -> frozenset[str]:
        return frozenset(self.member.held()) if self.member is not None else frozenset()

    def _coordinate(self, config: RepoConfig | None) -> None:
        """Run this replica's Leases with the settings in force (gitops.yaml's, the flags over them);
        none configured: stop them, the git lock serializes controllers as before."""
        if config is not None:
            self._repo_coordination = config.coordination
        wanted = self.config.coordination.over(self._repo_coordination)
        if wanted == self._coordination and (self.member is not None or not wanted.mode):
            return
        if self.member is not None:
            self.member.stop()
            self.member = None
        self._coordination = wanted
        if not wanted.mode:
            return
        problems = coordination_problems(wanted)
        if problems:
            raise GitopsError("coordination: " + "; ".join(f"{f}: {m}" for f, m in problems))
        if not wanted.kubeconfig:
            raise GitopsError("coordination: no kubeconfig (spec.coordination.kubeconfig or "
                              "--coordination-kubeconfig)")
        timing = Timing(wanted.lease_duration, wanted.renew_deadline, wanted.retry_period)
        api = KubeAPI.from_kubeconfig(wanted.kubeconfig, timeout=max(1.0, min(5.0, timing.renew_deadline / 2)))
        work = (LEADER,) if wanted.mode == "leader" else shard_leases(wanted.shards)
        self.member = Member(LeaseAPI(api, wanted.namespace), self.identity, work, timing,
                             on_change=self.trigger.set)
        self.member.tick()
        self.member.start()
        log.info("coordination started", extra={"mode": wanted.mode, "leases": len(work),
                                                "identity": self.identity, "held": ",".join(self.member.held())})

    def _scope(self, model: RepoModel | None) -> Scope | None:
        if self.member is None:
            return None
        sips = model.sip_clusters if model is not None else {}
        names = frozenset(sips) | frozenset(service_cluster(n) for n in sips)
        return Scope(self._coordination.mode, self._coordination.shards, self._held(), names)

    def _state_files(self, branch: StatusBranch, scope: Scope, refuse_clashes: bool = False) -> dict[str, bytes]:
        """The state files: the branch's records, with ours for what this replica owns. `refuse_clashes`
        (before a plan's actions run): PlacementRaced when a node we placed takes a port another
        replica's node took on the branch since we planned."""
        paths = (PUBLIC, self.sealer.path)
        found = self.store.read(branch.read)
        generation, theirs = found if found is not None else (0, State())
        clashes = scope.clashes(theirs, self.store.state) if refuse_clashes else []
        if clashes:
            raise PlacementRaced("another replica placed a node on the same ports first: " + "; ".join(clashes)
                                 + "; nothing was done, the next poll plans again from its records")
        merged = scope.merge(theirs, self.store.state)
        if found is not None and merged.to_dict() == theirs.to_dict():
            self.store.adopt(theirs, generation)
            return {rel: data for rel in paths if (data := branch.read(rel)) is not None}
        self.store.adopt(merged, max(generation, self.store.generation) + 1)
        return self.store.files({rel: branch.read(rel) for rel in paths})

    def _publish_state(self, status: StatusBranch, scope: Scope) -> None:
        """Write-ahead: the decisions of a plan are on the branch before its actions run, so a replica
        taking the shard over after a crash starts from them."""
        paths = (PUBLIC, self.sealer.path)
        status.publish(lambda b: b.write_tree(self._state_files(b, scope, refuse_clashes=True), paths),
                       f"state [{self.identity}: {', '.join(sorted(scope.held))}]")

    def _shard_files(self, scope: Scope, model: RepoModel, report: Outcome) -> dict[str, bytes]:
        out = {}
        for lease in sorted(scope.held):
            clusters = sorted(c for c in model.clusters if scope.lease_of(c) == lease)
            out[resource_path("Shard", lease)] = dump({
                "apiVersion": "gitops.infra/v1alpha1", "kind": "ShardStatus", "metadata": {"name": lease},
                "status": {"holder": self.identity, "clusters": clusters, "observedSourceSHA": report.sha,
                           "result": report.result.value, "actions": report.actions}})
        return out

    def _mine(self, scope: Scope, model: RepoModel, desired):
        """Whether a status-branch file is this replica's to write (or remove)."""
        work = set(self.member.work) if self.member is not None else set()
        state_files = {PUBLIC, self.sealer.path}

        def node_cluster(node: str) -> str | None:
            if node in model.nodes:
                return model.nodes[node].cluster
            if node in desired.pods:
                return desired.pods[node].cluster
            record = self.store.state.nodes.get(node)
            return record.cluster if record is not None else None

        def mine(rel: str) -> bool:
            if rel in state_files:
                return True
            if rel.startswith(resource_path("Shard", "")[:-len(".yaml")]):
                lease = rel.rsplit("/", 1)[-1].removesuffix(".yaml")
                return lease in scope.held or (lease not in work and scope.owns_global)
            owner = file_owner(rel, node_cluster)
            return scope.owns_global if owner is None else scope.owns(owner)
        return mine

    def _kubeconfigs(self, desired, recipients: tuple[str, ...], branch: StatusBranch) -> dict[str, bytes]:
        out = {}
        for name, cluster in sorted(desired.clusters.items()):
            record = self.store.state.clusters.get(name)
            if cluster.api_endpoint is None or record is None or record.admin is None:
                continue
            rel = kubeconfig_path(name)
            text = admin_kubeconfig(name, record, cluster.api_endpoint).encode()
            out[rel] = self.sealer.seal(text, branch.read(rel), tuple(recipients))
        return out

    def _last_status_branch(self) -> str:
        """The statusBranch of the commit in force (the last one applied), as recorded in the workdir."""
        path = self.config.workdir / IN_FORCE_BRANCH
        recorded = path.read_text().strip() if path.is_file() else ""
        return recorded or DEFAULT_BRANCH

    def _record_status_branch(self, name: str) -> None:
        path = self.config.workdir / IN_FORCE_BRANCH
        if path.is_file() and path.read_text().strip() == name:
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(name + "\n")
        os.replace(tmp, path)

    # ------------------------------------------------------------------ the loop

    def run(self, trigger: threading.Event | None = None) -> None:
        """Reconcile every `interval` seconds (or when `trigger` fires, or the Leases held change)
        until `stop` is set."""
        trigger = self.trigger = trigger or self.trigger
        if self.member is not None:
            self.member.on_change = trigger.set
        while not self.stop.is_set():
            try:
                self.reconcile_once()
            except GitopsError:
                pass  # logged and counted; try again next time
            self.metrics.heartbeat()
            trigger.wait(self.config.interval)
            trigger.clear()
        log.info("controller stopped")

    def release(self) -> None:
        """Give up what this controller holds: its Leases (others take over at once), the git lock, its
        clients of the clusters' APIs."""
        self.clusters.close()
        if self.member is not None:
            self.member.stop()
            self.member = None
            return
        for branch in self._status.values():
            ApplyLease(branch.repo).release(self.holder)


def _lock_workdir(workdir: Path):
    """One process per workdir (the kernel drops the lock if the process dies)."""
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle = open(workdir / ".lock", "a+")  # noqa: SIM115 - held for the controller's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise GitopsError(f"another gitops process is using {workdir}") from None
    return handle


def _holder_id(workdir: Path) -> str:
    """The apply-lease holder: stable per workdir, so a restarted controller takes its own lease back."""
    path = workdir / "controller-id"
    if not path.is_file():
        path.write_text(f"{socket.gethostname()}/{uuid.uuid4().hex[:12]}\n")
    return path.read_text().strip()


def _log_progress(index: int, total: int, action, status: str) -> None:
    if status != "start":
        log.info("action " + status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                             "subject": action.subject, "reason": action.reason})


def _log_every_step(index: int, total: int, action, status: str) -> None:
    """Several controllers: each action's start too, with its cluster, so overlaps show in the logs."""
    log.info("action " + status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                         "subject": action.subject, "cluster": action.cluster,
                                         "reason": action.reason})


def _progress(scope: Scope | None):
    return _log_progress if scope is None else _log_every_step


def scoped_model(model: RepoModel, scope: Scope | None) -> RepoModel:
    """What one replica plans: the clusters (and Nodes) of its shards, every Hypervisor (placement counts
    the recorded ports of every node, its own or not), and SIPClusters with their hosts if it owns shard 0."""
    if scope is None:
        return model
    return dataclasses.replace(
        model, clusters={n: c for n, c in model.clusters.items() if scope.owns(n)},
        nodes={n: node for n, node in model.nodes.items() if scope.owns(node.cluster)},
        sip_clusters=model.sip_clusters if scope.owns_global else {},
        baremetal_hosts=model.baremetal_hosts if scope.owns_global else {})


def scoped_observed(observed: ObservedState, scope: Scope | None) -> ObservedState:
    """The observation with only the pods and cluster APIs of what the replica owns: other replicas' pods
    are neither desired nor pruned here."""
    if scope is None:
        return observed
    hypervisors = {n: dataclasses.replace(hv, pods=tuple(p for p in hv.pods if scope.owns(p.cluster)))
                   for n, hv in observed.hypervisors.items()}
    return dataclasses.replace(observed, hypervisors=hypervisors,
                               clusters={n: c for n, c in observed.clusters.items() if scope.owns(n)})


def _restricted(planned: Planned, scope: Scope) -> Planned:
    """The planning pass with only the actions of clusters this replica holds the Leases of."""
    plan = planned.plan
    actions = tuple(a for a in plan.actions if scope.owns(a.cluster))
    if len(actions) == len(plan.actions):
        return planned
    return dataclasses.replace(planned, plan=dataclasses.replace(plan, actions=actions))


def _under(rel: str, prefixes: tuple[str, ...]) -> bool:
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


class _WriteAhead:
    """One replica's StateStore (several controllers): loads the state narrowed to its shards, and
    publishes every saved state to the status branch, merged with the other replicas' records."""

    def __init__(self, inner: ControllerStateStore, scope: Scope, publish):
        self.inner = inner
        self.scope = scope
        self.publish = publish

    def load(self) -> State:
        return self.scope.narrow_state(self.inner.load())

    def save(self, state: State) -> None:
        if state.to_dict() == self.load().to_dict():
            return
        before, generation = self.inner.state, self.inner.generation
        self.inner.save(self.scope.merge(self.inner.state, state))
        try:
            self.publish()
        except PlacementRaced:
            self.inner.adopt(before, generation)  # the refused decisions are not reported either
            raise
