"""One of several controllers (spec.coordination): its Leases, and its share of the status branch.

`Replica` runs this controller's Leases with the settings in force and tells each
reconcile what it holds (a `Scope`) and whether an action may still run (the
fence). `Share` is what one reconcile of it writes on the status branch: the
files of its shards (and the global ones if it holds shard 0), a
`status/Shard/<lease>.yaml` per Lease held, and the state merged with the other
replicas' records, published before a plan's actions run (`WriteAhead`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gitops.compile.desired import DesiredState
from gitops.compile.sip_services import service_cluster
from gitops.coordination.lease import LeaseAPI, Timing
from gitops.coordination.member import Member
from gitops.coordination.scope import PlacementRaced, Scope, file_owner
from gitops.coordination.shards import LEADER, shard_leases
from gitops.errors import GitopsError
from gitops.kubeapi import KubeAPI
from gitops.model.config import Coordination, RepoConfig, coordination_problems
from gitops.model.resources import RepoModel
from gitops.plan.actions import Action
from gitops.state.records import State
from gitops.status.branch import StatusBranch, under
from gitops.status.reader import MANAGED, PUBLIC, SOURCE, resource_path
from gitops.status.report import Outcome, shard_documents
from gitops.status.sealed_state import ControllerStateStore

log = logging.getLogger("gitops.controller")


class Replica:
    """This controller's Leases, run with gitops.yaml's spec.coordination under the flags' `overrides`."""

    def __init__(self, identity: str, overrides: Callable[[Coordination], Coordination],
                 on_change: Callable[[], None]):
        self.identity = identity
        self.overrides = overrides
        self.on_change = on_change
        self.member: Member | None = None
        self.settings = Coordination()  # in force
        self._repo = Coordination()  # the last valid commit's

    def held(self) -> frozenset[str]:
        return frozenset(self.member.held()) if self.member is not None else frozenset()

    def coordinate(self, config: RepoConfig | None) -> None:
        """Run the Leases with the settings in force (`config`: a valid commit's; None: keep the last);
        none configured: stop them, the git lock serializes controllers as before."""
        if config is not None:
            self._repo = config.coordination
        wanted = self.overrides(self._repo)
        if wanted == self.settings and (self.member is not None or not wanted.mode):
            return
        self.stop()
        self.settings = wanted
        if wanted.mode:
            self._start(wanted)

    def _start(self, wanted: Coordination) -> None:
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
                             on_change=self.on_change)
        self.member.tick()
        self.member.start()
        log.info("coordination started", extra={"mode": wanted.mode, "leases": len(work),
                                                "identity": self.identity, "held": ",".join(self.member.held())})

    def stop(self) -> None:
        """Give the Leases up (others take over at once)."""
        if self.member is not None:
            self.member.stop()
            self.member = None

    def scope(self, model: RepoModel | None) -> Scope | None:
        """What this replica holds now (None: no Leases run); `model` names the SIPClusters (global work)."""
        if self.member is None:
            return None
        sips = model.sip_clusters if model is not None else {}
        names = frozenset(sips) | frozenset(service_cluster(n) for n in sips)
        return Scope(self.settings.mode, self.settings.shards, self.held(), names)

    def fence(self, scope: Scope) -> Callable[[Action], str | None]:
        """Why an action may no longer run: its Lease is not held fresh (None: it may)."""
        member = self.member
        assert member is not None

        def fence(action: Action) -> str | None:
            lease = scope.lease_of(action.cluster)
            if member.fresh(lease):
                return None
            return f"Lease {lease} (cluster {action.cluster or '-'}) is no longer held fresh by {self.identity}"
        return fence

    def share(self, store: ControllerStateStore, scope: Scope) -> Share:
        work = frozenset(self.member.work) if self.member is not None else frozenset()
        return Share(store, scope, self.identity, work)


@dataclass(frozen=True)
class Share:
    """One reconcile's share of the status branch: what `scope` owns, with the state merged into the branch's."""

    store: ControllerStateStore
    scope: Scope
    identity: str
    #: every work Lease (held or not): a Shard file of a Lease no replica runs is the global owner's to remove
    work: frozenset[str]

    @property
    def state_paths(self) -> tuple[str, str]:
        return PUBLIC, self.store.sealer.path

    def state_files(self, read: Callable[[str], bytes | None], refuse_clashes: bool = False) -> dict[str, bytes]:
        """The state files: the branch's records, with ours for what this replica owns. `refuse_clashes`
        (before a plan's actions run): PlacementRaced when a node we placed takes a port another
        replica's node took on the branch since we planned."""
        store = self.store
        found = store.read(read)
        generation, theirs = found if found is not None else (0, State())
        clashes = self.scope.clashes(theirs, store.state) if refuse_clashes else []
        if clashes:
            raise PlacementRaced("another replica placed a node on the same ports first: " + "; ".join(clashes)
                                 + "; nothing was done, the next poll plans again from its records")
        merged = self.scope.merge(theirs, store.state)
        if found is not None and merged.to_dict() == theirs.to_dict():
            store.adopt(theirs, generation)
            return {rel: data for rel in self.state_paths if (data := read(rel)) is not None}
        store.adopt(merged, max(generation, store.generation) + 1)
        return store.files({rel: read(rel) for rel in self.state_paths})

    def publish_state(self, status: StatusBranch) -> None:
        """Write-ahead: the decisions of a plan are on the branch before its actions run, so a replica
        taking the shard over after a crash starts from them."""
        status.publish(lambda b: b.write_tree(self.state_files(b.read, refuse_clashes=True), self.state_paths),
                       f"state [{self.identity}: {', '.join(sorted(self.scope.held))}]")

    def write(self, branch: StatusBranch, files: dict[str, bytes], model: RepoModel, desired: DesiredState,
              outcome: Outcome) -> None:
        """Write this replica's files of a status commit (`files`: the commit's documents), the merged state
        and its Shard files, and remove the managed files it owns that the commit no longer has."""
        files = {**files, **self.state_files(branch.read)}
        files.update(shard_documents(self.scope, model.clusters, self.identity, outcome))
        mine = self.owns(model, desired)
        keep = {rel: data for rel, data in files.items() if mine(rel)}
        managed = {rel for rel in branch.tracked() if under(rel, MANAGED + (SOURCE,)) and mine(rel)}
        branch.write_tree(keep, tuple(sorted(managed | keep.keys())))

    def owns(self, model: RepoModel, desired: DesiredState) -> Callable[[str], bool]:
        """Whether a status-branch file is this replica's to write (or remove)."""
        scope, state_files, nodes = self.scope, set(self.state_paths), self.store.state.nodes
        shards = resource_path("Shard", "")[:-len(".yaml")]

        def node_cluster(node: str) -> str | None:
            if node in model.nodes:
                return model.nodes[node].cluster
            if node in desired.pods:
                return desired.pods[node].cluster
            record = nodes.get(node)
            return record.cluster if record is not None else None

        def mine(rel: str) -> bool:
            if rel in state_files:
                return True
            if rel.startswith(shards):
                lease = rel.rsplit("/", 1)[-1].removesuffix(".yaml")
                return lease in scope.held or (lease not in self.work and scope.owns_global)
            owner = file_owner(rel, node_cluster)
            return scope.owns_global if owner is None else scope.owns(owner)
        return mine


#: a save that only counts (a rolling wave's probe figures, `save_progress`) is published at most this often
#: (seconds): not a status commit every few seconds of a rollout
PUBLISH_PROGRESS_EVERY = 30.0


class WriteAhead:
    """One replica's StateStore: loads the state narrowed to its shards, and publishes every saved state
    to the status branch (`publish`), merged with the other replicas' records."""

    def __init__(self, inner: ControllerStateStore, scope: Scope, publish: Callable[[], None]):
        self.inner = inner
        self.scope = scope
        self.publish = publish
        self.published = float("-inf")  # (time.monotonic() of the last publish)

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
        self.published = time.monotonic()

    def save_progress(self, state: State) -> None:
        """A save that only counts: held by this replica, published with its next save or once
        PUBLISH_PROGRESS_EVERY seconds passed since its last publish. A replica that starts again or takes
        over after a kill (it reads the branch) counts on from the last publish: the counts of those
        seconds at most are lost."""
        if time.monotonic() - self.published >= PUBLISH_PROGRESS_EVERY:
            self.save(state)
        else:  # (the inner store keeps an unchanged state as it is)
            self.inner.save(self.scope.merge(self.inner.state, state))
