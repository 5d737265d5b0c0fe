"""The controller: poll the infra repo, reconcile one commit at a time, report on the status branch.

One reconcile, as named stages: fetch the branch tip and check it out (a
`Revision`, the artifact later stages read; `Commits`); verify its signature
(when required) and validate it: a commit that fails either is refused as a
whole, and the last good commit stays the `Target` (it keeps being reconciled,
so drift still heals). Then apply under the apply lease (plan, execute, plan
the follow-up: an `Applied`, failures included, as data), and report: status,
the executed plan, the observed snapshot, encrypted kubeconfigs and the
controller state in one commit on the status branch, or none when nothing
changed. This module is the loop; the documents it writes are built in
`gitops.status` (`commit.py`, `report.py`), and several controllers' Leases and
share of the branch are `gitops.status.replica`.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gitops.apply import ApplyError, Timing
from gitops.coordination.member import Member
from gitops.coordination.scope import PlacementRaced, Scope
from gitops.engine import ApplyResult, Planned, apply_repo, desired_for, observe_all
from gitops.errors import GitopsError
from gitops.gitrepo import clear_stale_locks
from gitops.notify import Event, Notifier
from gitops.metrics import Metrics
from gitops.model.config import Coordination, NotificationTarget, RepoConfig, Rollout
from gitops.model.resources import Hypervisor, RepoModel
from gitops.model.validate import Validation, validate_repo
from gitops.observe.clusters import ClusterReader
from gitops.observe.etcd import EtcdReader
from gitops.observe.exits import ExitWatch
from gitops.observe.types import ObservedState
from gitops.plan.actions import Action, Plan
from gitops.source import GitSource, Revision, SignatureError, SignaturePolicy
from gitops.status.backups import BACKUPS_DIR, take_due
from gitops.status.branch import (Note, StatusBranch, in_force_branch, in_force_signers, record_in_force_branch,
                                  record_in_force_signers)
from gitops.status.commit import commit_documents, converged_files, kubeconfig_files, placements_of
from gitops.status.lease import ApplyLease, holder_id, lock_workdir
from gitops.status.poll import NodeFilesCache, live_fingerprint
from gitops.status.reader import MANAGED, PUBLIC, SOURCE
from gitops.status.replica import Replica, WriteAhead
from gitops.status.report import Outcome, Result, apply_document, source_document
from gitops.status.sealed_state import ControllerStateStore, Sealer
from gitops.status.trust import SIGNING_KEY, BranchTrust, Signers, SigningKey, TrustError, Verifier, ensure_key

log = logging.getLogger("gitops.controller")


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
    """What `gitops reconcile` and `gitops watch` run with."""

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
    #: the SSH key status commits are signed with (default: `status-signing-key` in the workdir, made if missing)
    status_signing_key: Path | None = None
    #: read the status branch without verifying its signatures (loudly; labs only)
    insecure_unverified_status: bool = False
    coordination: CoordinationFlags = field(default_factory=CoordinationFlags)


@dataclass(frozen=True)
class Target:
    """The validated commit to apply: the new one, or the last good one while the new one is refused."""

    sha: str
    validation: Validation
    #: the commit in force put back after the tip's rollout halted: planned without waves (a retreat is not
    #: held up by soaks, nor halted itself)
    put_back: bool = False

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
    #: by plan index: when each action done and each failed one ran; the seconds of the whole apply stage
    done: Mapping[int, Timing] = field(default_factory=dict)
    failed: Mapping[int, Timing] = field(default_factory=dict)
    duration: float | None = None


class Commits:
    """The infra repo's fetched commits as the loop takes them: checked out, verified and validated."""

    def __init__(self, source: GitSource, identity: str | None):
        self.source = source
        self.identity = identity  # age identity text: secret fields are decrypted in memory

    def checkout(self, sha: str) -> Revision:
        """The fetched tip, checked out: the artifact every later stage reads."""
        revision = self.source.checkout(sha)
        log.info("reconcile", extra={"sha": sha, "subject": revision.subject})
        return revision

    def check(self, revision: Revision) -> tuple[list[str], Validation | None]:
        """(why the commit is refused, its validation): a bad signature or a bad repo refuses it whole."""
        try:
            signer = self.source.verify(revision.sha)
            if signer:
                log.info("signature verified", extra={"sha": revision.sha, "signer": signer})
        except SignatureError as err:
            return [str(err)], None
        validation = validate_repo(revision.path, self.identity)  # decrypts secret fields in memory
        return [str(d) for d in validation.diagnostics], validation

    def last_good(self, sha: str) -> Validation:
        """The validation of the commit in force, checked out again (a refused commit keeps it applied). It
        is verified as the tip is: signed as the policy asks, and on the followed branch; otherwise nothing
        is applied (`GitopsError` says why)."""
        try:
            self.source.verify(sha)
        except SignatureError as err:
            raise GitopsError(f"the commit in force {sha[:12]} is not applied: {err}") from None
        if not self.source.on_branch(sha):
            raise GitopsError(f"the commit in force {sha[:12]} is not applied: it is not on the followed branch "
                              f"{self.source.branch}")
        validation = validate_repo(self.source.checkout(sha).path, self.identity)
        if validation.model is None:
            raise GitopsError(f"the last good commit {sha[:12]} no longer validates")
        return validation


#: In a controller's workdir: notifications queued and not yet sent (gitops/notify.py), sent after a restart.
NOTIFICATIONS_SPOOL = "notifications"


class Controller:
    """The loop: reconcile every `interval` (or when triggered) until stopped; one reconcile at a time."""

    def __init__(self, config: ControllerConfig, metrics: Metrics | None = None):
        self.config = config
        self.source = GitSource(config.repo, config.workdir, config.branch, config.signatures)
        self.commits = Commits(self.source, config.identity)
        self.sealer = Sealer(config.identity, config.insecure_plaintext_secrets)
        self.store = ControllerStateStore(self.sealer, config.workdir / "state-cache")
        self._workdir_lock = lock_workdir(config.workdir)
        for lock in clear_stale_locks(config.workdir):  # no git of ours runs yet: a killed one's
            log.warning("git lock left by a killed process removed", extra={"path": str(lock)})
        self.holder = holder_id(config.workdir)
        if config.status_signing_key is not None and not config.status_signing_key.is_file():
            raise TrustError(f"--status-signing-key {config.status_signing_key}: no such file")
        self.signing_key: SigningKey = (SigningKey(config.status_signing_key) if config.status_signing_key
                                        else ensure_key(config.workdir / SIGNING_KEY, f"gitops-status@{self.holder}"))
        if config.insecure_unverified_status:
            log.warning("--insecure-unverified-status: the status branch is read WITHOUT verifying who signed "
                        "it; anyone who can push there can change what this controller does")
        self.stop = threading.Event()
        self.metrics = metrics or Metrics()
        self.notifier = Notifier(spool=config.workdir / NOTIFICATIONS_SPOOL)
        self._status: dict[str, StatusBranch] = {}
        self._leases: dict[str, ApplyLease] = {}
        #: node files read on earlier polls, and the last converged reconcile (None: the next poll does it all)
        self.files = NodeFilesCache(RepoConfig().node_files_interval)
        self.clusters = ClusterReader(RepoConfig().cluster_objects_interval)
        self.etcd = EtcdReader()
        self._quiet: Quiet | None = None
        #: the commit in force and this replica's scope, as the last reconcile left them (scheduled backups)
        self._in_force: tuple[Target, Scope | None] | None = None
        #: False once no cluster opted in and the branch held no `backups/` record (None: not known)
        self._backup_records: bool | None = None
        #: set to reconcile at once (the Leases held changed)
        self.trigger = threading.Event()
        #: several controllers (spec.coordination): this replica's Leases, and the settings they run with
        self.identity = config.coordination.replica_id or self.holder
        self.replica = Replica(self.identity, config.coordination.over, lambda: self.trigger.set())

    @property
    def member(self) -> Member | None:
        """This replica's Leases (None: no spec.coordination, the git lock serializes controllers)."""
        return self.replica.member

    def status_branch(self, name: str, signers: tuple[str, ...] = ()) -> StatusBranch:
        """The status branch `name`, signing with this controller's key and reading only commits signed by
        `signers` (spec.status.signers of the commit in force) or by this controller's own key."""
        name = self.config.status_branch or name
        if name not in self._status:
            self._status[name] = StatusBranch(self.config.repo, self.config.workdir, name)
        branch = self._status[name]
        listed = Signers.parse(signers, "spec.status.signers")
        pinned = listed.plus([self.signing_key.signer])
        if branch.trust is not None and branch.trust.verifier.signers == pinned:
            return branch
        if listed and not listed.allows(self.signing_key.signer):  # (said once per change of the list)
            log.warning("this controller's status signing key is not in spec.status.signers: gitops status, plan "
                        "--against-status, state pull, the UI and other replicas will not read what it writes",
                        extra={"key": self.signing_key.signer.public[:40] + "..."})
        branch.trust = BranchTrust(Verifier(pinned, insecure=self.config.insecure_unverified_status),
                                   self.signing_key)
        return branch

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
        self.back_up_due()
        return outcome

    def back_up_due(self) -> None:
        """Snapshot the etcd of each cluster in force (of this replica's shards) whose spec.backup
        schedule says so; failures are conditions on the status branch, not reconcile errors."""
        if self._in_force is None:
            return
        target, scope = self._in_force
        model = scoped_model(target.model, scope)
        status = self.status_branch(target.config.status_branch)
        if not any(c.backup for c in model.clusters.values()):
            # none opted in: a quiet poll reads the branch's index only until no backup record is left
            if self._backup_records is False or not status.tracked_under(BACKUPS_DIR):
                self._backup_records = False
                return
        self._backup_records = None  # a round may add or remove records: look again next time
        try:
            backups = take_due(model, target.config, self.store.load(), status, dt.datetime.now(dt.timezone.utc),
                               list(model.clusters), owns_all=scope is None)
        except GitopsError as err:  # the status branch could not take the record: try again next poll
            log.error("backup round failed", extra={"error": str(err)})
            return
        self.metrics.backups(backups)

    def _reconcile(self) -> Outcome:
        """fetch → (nothing changed since the last converged reconcile: stop) → verify and validate →
        choose what is in force → (several controllers: which shards this one holds) → apply → report."""
        now = dt.datetime.now(dt.timezone.utc)
        sha, live, unchanged = self._fetch()
        if unchanged is not None:
            return unchanged
        revision = self.commits.checkout(sha)
        refusal, validation = self.commits.check(revision)
        ok = validation is not None and validation.ok
        branch_name = validation.repo.config.status_branch if ok else in_force_branch(self.config.workdir)
        signers = validation.repo.config.status_signers if ok else in_force_signers(self.config.workdir)
        self.replica.coordinate(validation.repo.config if ok else None)
        if self.member is not None and not signers and self.config.status_signing_key is None:
            # each replica would set the others' status commits aside (and their shards' state with them)
            raise TrustError("several controllers (spec.coordination) each sign the status branch with the key of "
                             "their workdir: list every replica's key in spec.status.signers (`gitops status-key "
                             "--workdir DIR` prints one), or give them one shared key with --status-signing-key")
        scope = self.replica.scope(validation.model if ok else None)
        if scope is not None and not scope.held:
            if ok:
                self.notifier.resume(validation.repo.config.notifications)  # what it queued before a restart
            log.info("standing by: this replica holds no Lease", extra={"sha": sha, "identity": self.identity})
            return Outcome(sha=sha, result=Result.STANDING_BY, message="standing by: this replica holds no Lease")
        status = self.status_branch(branch_name, signers)
        status.sync()
        untrusted = self._untrusted(status, now, validation.repo.config.notifications if ok else ())
        origin = self.store.restore(status.read, use_cache=scope is None)
        log.info("state restored", extra={"from": origin, "generation": self.store.generation})
        applied_before = status.reader.applied_sha()
        refused: Outcome | None = None
        halted = self._halted(revision.sha, applied_before) if not refusal else ""
        if halted:
            refusal = [halted]
        if refusal:
            in_force_ok = True
            try:
                good = self.commits.last_good(applied_before) if applied_before else None
            except GitopsError as err:  # the commit in force fails the policy now: nothing is applied
                refusal, good, in_force_ok = [*refusal, str(err)], None, False
            if good is not None:
                self.notifier.resume(good.repo.config.notifications)  # what a killed process left unsent first
            refused = self._refuse(revision.sha, refusal, applied_before, status, now, scope,
                                   good.repo.config.notifications if good is not None else (), untrusted,
                                   in_force_ok)
            if good is None:
                return refused
            target = Target(applied_before, good, put_back=bool(halted))  # keeps healing drift
            scope = self.replica.scope(target.model)
        else:
            assert validation is not None
            target = Target(revision.sha, validation)
            self.notifier.resume(validation.repo.config.notifications)  # what a killed process left unsent
        applied = self._apply(target, status, live if live is not None and target.sha == sha else None, scope)
        self._in_force = (target, scope)
        outcome = self._report(target, applied, refused, applied_before, status, now, scope, untrusted)
        self._remember(target, applied, outcome, refused, scope)
        return outcome

    def _halted(self, sha: str, in_force: str) -> str:
        """Why `sha` is held: its rollout halted (the recorded state says where), "" when it did not."""
        rollout = self.store.load().rollout
        wave = rollout.halted if rollout is not None and rollout.commit == sha else None
        if wave is None:
            return ""
        back = (f"the clusters it reached are put back to {in_force[:12]}" if in_force
                else "no commit was in force before it: nothing to put back")
        return (f"its rollout halted at wave {wave.name}: cluster {wave.breached_cluster}: {wave.breach} ({back}; "
                "a new commit, a fix or a revert, rolls out again)")

    def _fetch(self) -> tuple[str, ObservedState | None, Outcome | None]:
        """(the branch tip, the live state observed meanwhile for the commit in force, the last outcome
        when the commit and the live state are as the last converged reconcile left them: stop there)."""
        quiet, self._quiet = self._quiet, None
        if quiet is None or quiet.held != self.replica.held():
            return self.source.fetch(), None, None
        with ThreadPoolExecutor(max_workers=1) as pool:  # git fetch while the live state is read
            fetching = pool.submit(self.source.fetch)
            live = scoped_observed(observe_all(scoped_model(quiet.target.model, quiet.scope), quiet.target.config,
                                               self.store.load(), reuse=self.files.reuse, clusters=self.clusters,
                                               etcd=self.etcd),
                                   quiet.scope)
            sha = fetching.result()
        if sha != quiet.target.sha:
            return sha, None, None  # a new commit: its own model is observed
        if live_fingerprint(live, self.files.files_digest) == quiet.fingerprint:
            self.files.remember(live)
            self._quiet = quiet
            log.info("nothing changed", extra={"sha": sha, "node_files_reused": self.files.reused})
            return sha, live, quiet.outcome
        log.info("the live state changed", extra={"sha": sha})
        return sha, live, None

    def _remember(self, target: Target, applied: Applied, outcome: Outcome, refused: Outcome | None,
                  scope: Scope | None = None) -> None:
        """After a reconcile that left the live state converged and fully observed, the next polls
        stop early while the commit and the live state stay the same."""
        after = applied.after
        if (refused is not None or outcome.result != Result.APPLIED or after is None or applied.follow_up is not None
                or not after.plan.empty or not after.plan.complete):
            self.files.forget()
            self.clusters.forget()
            self.etcd.forget()
            return
        self.files.interval = target.config.node_files_interval
        self.files.remember(after.observed)
        self.clusters.objects_interval = target.config.cluster_objects_interval
        self.clusters.remember(after.observed.clusters)
        self.etcd.remember(after.observed.etcd)
        self._quiet = Quiet(target, live_fingerprint(after.observed, self.files.files_digest), dataclasses.replace(
            outcome, actions=0, message=f"commit {target.sha[:12]} in force; nothing changed"), scope)

    # ------------------------------------------------------------------ stages

    def _untrusted(self, status: StatusBranch, now: dt.datetime,
                   notify: tuple[NotificationTarget, ...]) -> tuple[str, str] | None:
        """The status branch's tip set aside by the last sync (unsigned, signed by a key not pinned, or
        rolled back), reported: logged (by the branch), counted, and notified; None when it was trusted."""
        untrusted = status.untrusted
        if untrusted is None:
            return None
        self.metrics.untrusted_status.inc()
        self.notifier.send(notify, Event(untrusted[0], "UntrustedStatus",
                                         f"status commit {untrusted[0][:12] or '(none)'} on {status.branch} set aside: "
                                         f"{untrusted[1]}", errors=(untrusted[1],),
                                         time=now.isoformat(timespec="seconds")))
        return untrusted

    def _refuse(self, sha: str, refusal: list[str], applied_before: str, status: StatusBranch,
                now: dt.datetime, scope: Scope | None = None,
                notify: tuple[NotificationTarget, ...] = (), untrusted: tuple[str, str] | None = None,
                in_force_ok: bool = True) -> Outcome:
        log.warning("commit refused", extra={"sha": sha, "errors": len(refusal)})
        kept = applied_before and in_force_ok
        outcome = Outcome(sha=sha, result=Result.REFUSED, errors=tuple(refusal), applied_sha=applied_before,
                          message=f"commit {sha[:12]} refused: {refusal[0]}" + (
                              f" (and {len(refusal) - 1} more)" if len(refusal) > 1 else "")
                          + (f"; {applied_before[:12]} stays in force" if kept else ""),
                          untrusted_status=untrusted)
        if scope is None or scope.owns_global:  # one replica reports the commit itself
            committed = status.publish(
                lambda s: s.write_tree({SOURCE: source_document(outcome, s.read, now)}, (SOURCE,)),
                f"refuse {sha[:12]}: {len(refusal)} error(s)",
                self._note(sha, f"gitops: Refused: {len(refusal)} error(s)", refusal))
            if committed:
                self.notifier.send(notify, Event(sha, "Refused", outcome.message, errors=tuple(refusal),
                                                 status_commit=committed, time=now.isoformat(timespec="seconds")))
        return outcome

    def _note(self, sha: str, headline: str, lines: Iterable[str] = ()) -> Note:
        """The commit's outcome as its git note (`git log --notes=gitops`), pushed with the status commit that
        records it (a note that cannot be written is logged: it never fails the reconcile)."""
        return Note(sha, self.config.branch, "\n".join([headline, *lines]))

    def _apply(self, target: Target, status: StatusBranch, live: ObservedState | None = None,
               scope: Scope | None = None) -> Applied:
        """Plan and execute under the apply lease (the git lock, or this replica's Leases: only the
        actions of its shards, each fenced); failures become data for the report. `live`: this poll's
        observation already made, for the first plan (later ones observe again)."""
        model, config = scoped_model(target.model, scope), target.config
        if target.put_back:
            config = dataclasses.replace(config, rollout=Rollout())
        if scope is None:
            self._lease(status).acquire(self.holder, self.config.lock_ttl)
        sha = target.sha
        first = [live] if live is not None else []

        def watch(m: RepoModel) -> ObservedState:
            return first.pop() if first else scoped_observed(observe_all(m, config, store.load()), scope)

        store, restrict, fence = self.store, None, None
        if scope is not None:
            share = self.replica.share(self.store, scope)
            store = WriteAhead(self.store, scope, lambda: share.publish_state(status))
            restrict, fence = (lambda planned: _restricted(planned, scope)), self.replica.fence(scope)
            assert self.member is not None
            self.member.busy = set(scope.held)  # not given up for fair share while this runs
        began = time.monotonic()
        try:
            result = apply_repo(model, config, store, allow_mass_delete=self.config.allow_mass_delete,
                                should_stop=self.stop.is_set, source=sha, progress=_progress(scope),
                                observe_fn=watch, restrict=restrict, fence=fence)
        except ApplyError as err:
            log.error("apply failed", extra={"sha": sha, "error": str(err)})
            if err.halted is not None:
                self.trigger.set()  # the next reconcile puts back what the rollout reached
            return Applied(Result.HALTED if err.halted is not None else Result.FAILED, str(err), len(err.executed),
                           err.plan, error=str(err), done=err.done, failed=err.failed,
                           duration=round(time.monotonic() - began, 1))
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
        return dataclasses.replace(_applied(sha, result), done=result.done,
                                   duration=round(time.monotonic() - began, 1))

    def _report(self, target: Target, applied: Applied, refused: Outcome | None, applied_before: str,
                status: StatusBranch, now: dt.datetime, scope: Scope | None = None,
                untrusted: tuple[str, str] | None = None) -> Outcome:
        """One status commit: source, the executed plan, resources, SIPClusters, kubeconfigs, state. One of
        several replicas writes only its shards' files (and the global ones if it holds shard 0), the
        state merged with the branch's, and a `status/Shard/<lease>.yaml` per Lease it holds."""
        model, config, sha = scoped_model(target.model, scope), target.config, target.sha
        in_force = sha if applied.result == Result.APPLIED else applied_before
        if in_force == sha:
            record_in_force_branch(self.config.workdir, config.status_branch)
            record_in_force_signers(self.config.workdir, config.status_signers)
        report = dataclasses.replace(_reported(sha, applied, refused, in_force), untrusted_status=untrusted)
        record = None
        if applied.plan is not None and (applied.actions or applied.error or applied.follow_up is not None):
            record = apply_document(sha, applied.plan, applied.done, applied.failed, applied.error, applied.stopped,
                                    applied.follow_up, list(applied.surprises), now, applied.duration)
        last = applied.after
        if last is not None:  # its observation is the live state after the apply
            observed, compiled, sip = last.observed, last.compiled, last.sip
        else:
            observed = scoped_observed(observe_all(model, config, self.store.load()), scope)
            compiled, sip = desired_for(model, config, self.store.load(), observed)
        placements = placements_of(self.store.state)
        share = self.replica.share(self.store, scope) if scope is not None else None

        def write(branch: StatusBranch) -> None:
            files = commit_documents(report, record, model, compiled.desired, observed, sip, placements,
                                     branch.read, now, self.store.state)
            files.update(converged_files(last, model, config, self.store.state, files))
            files.update(kubeconfig_files(compiled.desired, self.store.state, self.sealer,
                                          config.kubeconfig_recipients, branch.read))
            if share is not None:
                share.write(branch, files, model, compiled.desired, report)
                return
            files.update(self.store.files({rel: branch.read(rel) for rel in (PUBLIC, self.sealer.path)}))
            branch.write_tree(files, MANAGED + (SOURCE,))

        summary = f"{report.result.value.lower()} {sha[:12]}: {applied.actions} action(s)"
        if scope is not None:
            summary += f" [{self.identity}: {', '.join(sorted(scope.held))}]"
        note = None
        if scope is None or scope.owns_global:  # one replica notes the commit itself
            done = f"{applied.actions} action(s)" + (f" of {len(applied.plan.actions)}" if applied.plan else "")
            note = self._note(sha, f"gitops: {report.result.value}: {done}", [applied.error] if applied.error else [])
        committed = status.publish(write, summary, note)
        log.info("reconciled", extra={"sha": sha, "result": report.result.value, "actions": applied.actions,
                                      "status_commit": committed or ""})
        if committed:
            self._notify(config.notifications, sha, applied, report, committed, now)
        return report

    def _notify(self, targets: tuple[NotificationTarget, ...], sha: str, applied: Applied, report: Outcome,
                committed: str, now: dt.datetime) -> None:
        """Queue the outcome for `targets`: Failed; Incomplete (applied, some source not observed); Applied
        only with changes."""
        plans = [p for p in (applied.plan, applied.after.plan if applied.after is not None else None) if p is not None]
        unknown = tuple(dict.fromkeys(u.describe() for p in plans for u in p.unknowns))
        result = report.result.value
        if report.result == Result.APPLIED and unknown:
            result = "Incomplete"
        elif report.result == Result.APPLIED and not applied.actions:
            return
        if result not in ("Applied", "Failed", "Incomplete", "Halted"):
            return
        self.notifier.send(targets, Event(
            sha, result, report.message, actions_done=applied.actions, actions_failed=1 if applied.error else 0,
            actions_planned=len(applied.plan.actions) if applied.plan else 0,
            errors=(applied.error,) if applied.error else (), incomplete=unknown, status_commit=committed,
            time=now.isoformat(timespec="seconds")))

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

    def watch_exits(self, interval: float) -> ExitWatch:
        """Start watching the hypervisors of the commit in force for exited components (gitops.observe.exits):
        one wakes this loop at once, and its plan restarts it."""

        def hypervisors() -> list[Hypervisor]:
            in_force = self._in_force
            if in_force is None:
                return []
            target, scope = in_force
            return [hv for hv in scoped_model(target.model, scope).hypervisors.values() if not hv.lost]

        def wake(reason: str) -> None:
            log.info("waking the loop: a component exited", extra={"reason": reason})
            self.trigger.set()

        watch = ExitWatch(hypervisors, wake, interval, registry=self.metrics.registry)
        watch.start()
        return watch

    def release(self) -> None:
        """Give up what this controller holds: its Leases (others take over at once), the git lock, its
        clients of the clusters' APIs; first, notifications still queued get up to 30 s to go out."""
        if not self.notifier.flush(30):
            log.warning("notifications still queued at exit were not sent")
        self.clusters.close()
        if self.member is not None:
            self.replica.stop()
            return
        for branch in self._status.values():
            self._lease(branch).release(self.holder)

    def _lease(self, branch: StatusBranch) -> ApplyLease:
        """The apply lease on `branch`'s remote, one per branch for this controller's life (what it saw of
        other holders' leases counts across polls), verified with the branch's trust of the moment."""
        if branch.branch not in self._leases:
            self._leases[branch.branch] = ApplyLease(branch.repo, branch.trust)
        lease = self._leases[branch.branch]
        lease.trust = branch.trust
        return lease


def _applied(sha: str, result: ApplyResult) -> Applied:
    """What an apply that ran to its end (or was stopped or fenced on the way) did."""
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


def _reported(sha: str, applied: Applied, refused: Outcome | None, in_force: str) -> Outcome:
    """The outcome a status commit reports: the refused commit's, else the applied one's."""
    if refused is not None:
        return Outcome(sha=refused.sha, result=Result.REFUSED, message=refused.message, errors=refused.errors,
                       applied_sha=in_force, actions=applied.actions)
    return Outcome(sha=sha, result=applied.result, message=applied.message, applied_sha=in_force,
                   actions=applied.actions)


def _log_progress(index: int, total: int, action: Action, status: str) -> None:
    if status != "start":
        log.info("action " + status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                             "subject": action.subject, "reason": action.reason})


def _log_every_step(index: int, total: int, action: Action, status: str) -> None:
    """Several controllers: each action's start too, with its cluster, so overlaps show in the logs."""
    log.info("action " + status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                         "subject": action.subject, "cluster": action.cluster,
                                         "reason": action.reason})


def _progress(scope: Scope | None) -> Callable[[int, int, Action, str], None]:
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
