"""The loop owner: observe → learn → select hosts → compile → diff makes a plan; execute runs it.

`gitops plan` makes one plan and shows it; `gitops apply` makes one plan (or
loads a saved one), executes exactly it, then observes once more: whatever a
plan could not know beforehand shows up there as a follow-up plan, reported,
never silently executed.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gitops.compile import Compiled, compile_desired
from gitops.errors import GitopsError
from gitops.hostport import host_port
from gitops.learn import learn
from gitops.model.components import APISERVER
from gitops.model.config import RepoConfig
from gitops.model.resources import RepoModel
from gitops.observe.types import ClusterTarget, FilesReuse, ObservedState
from gitops.plan.actions import Plan, Unknown, UnknownKind
from gitops.plan.cluster_api import cluster_api_actions
from gitops.plan.diff import DiffOptions
from gitops.plan import converged, recorded, recovery
from gitops.plan.hosts import label_actions, sip_warnings
from gitops.plan.inputs import plan_inputs
from gitops.plan.clusters import plan_nodes
from gitops.plan.rollout import ordered
from gitops.plan.endpoints import endpoint_notes
from gitops.plan.rotation import rotation_notes, rotation_steps
from gitops.plan.upgrades import check_versions
from gitops.plan.waves import in_waves
from gitops.sip.providers import planned_hosts, provider_for, provider_kind
from gitops.sip.selection import HostSelection, select_hosts
from gitops.state.records import State
from gitops.state.store import StateStore

if TYPE_CHECKING:  # executing and observing are imported when used: a plan against a snapshot needs no gRPC
    from gitops.apply.executor import Connections, Fence, Progress
    from gitops.observe.clusters import ClusterReader
    from gitops.observe.etcd import EtcdReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    compiled: Compiled
    observed: ObservedState
    plan: Plan
    #: SIP host selection and the label changes it needs
    sip: HostSelection = field(default_factory=lambda: HostSelection((), ()))
    #: each planned cluster's first certificate renewal time (until then its diff holds)
    renew_at: dict[str, dt.datetime] = field(default_factory=dict)
    #: no warning, note or unknown of the plan comes from a cluster's part (SIPClusters and their hosts are
    #: planned every time): what `gitops.plan.converged` needs to record clusters as converged
    settled: bool = False

    @property
    def state(self) -> State:
        """The recorded state the plan was made against, with its new decisions (saved before executing)."""
        return self.compiled.state


def make_plan(model: RepoModel, config: RepoConfig, state: State, observed: ObservedState,
              *, now: dt.datetime | None = None, source: str = "",
              unchanged: frozenset[str] = frozenset()) -> Planned:
    """One planning pass (pure): everything apply will do, in order. VersionSkew when the repo skips
    or reverts a Kubernetes minor version; StateMismatch when `state` does not know the clusters that run.
    `unchanged`: clusters known to plan nothing (`gitops.plan.converged`), neither compiled nor diffed;
    `observed` may lack their pods. Only a plan for people leaves clusters out: apply plans them all."""
    model = converged.without(model, unchanged)
    recorded.check(state, observed)
    state, recovery_warnings, recovery_notes = recovery.before_compile(model, state, observed)
    learned = learn(state, observed, {name: node.cluster for name, node in model.nodes.items()})
    hosts = planned_hosts(model, config, learned, observed.hosts)
    sip = select_hosts(model.sip_clusters, hosts) if hosts is not None else HostSelection((), ())
    labelled = sip.relabeled(hosts or [])
    compiled = compile_desired(model, learned, now=now, unavailable=observed.unreachable, hosts=labelled)
    options = DiffOptions(prune=config.prune.enabled, health_timeout=config.health_timeout)
    renew_at: dict[str, dt.datetime] = {}
    every = plan_inputs(model, compiled.desired, observed, compiled.state)
    found = plan_nodes(every, options, now=now, skip=unchanged, renew_at=renew_at)
    inside, inside_warnings, inside_unknowns = cluster_api_actions(compiled.desired, observed, config.health_timeout)
    check_versions(model, observed)
    warnings: list[str] = []
    unknowns: list[Unknown] = list(found.unknowns)
    if hosts is None:
        if model.sip_clusters:
            unknowns.append(Unknown(UnknownKind.BARE_METAL_HOSTS, config.bare_metal.provider,
                                    sip_clusters=tuple(sorted(model.sip_clusters))))
    else:
        warnings += sip_warnings(sip)
    unknowns += [*inside_unknowns, *every.left]
    actions = [*found.actions, *label_actions(sip), *inside]
    steps = rotation_steps(model, compiled.state, actions, unknowns)
    notes = rotation_notes(compiled.state)
    placed, rollout_warnings = in_waves(actions + steps, model, config.rollout, compiled.desired, observed,
                                        compiled.state, source, config.health_timeout)
    plan = Plan(actions=ordered(placed),
                warnings=tuple(list(found.warnings) + warnings + inside_warnings + list(compiled.deferred)
                               + recovery_warnings + rollout_warnings),
                source=source, unknowns=tuple(unknowns),
                notes=tuple(notes + recovery_notes
                            + endpoint_notes(model, learned, compiled.state)),
                unchanged=tuple(sorted(unchanged)))
    settled = not (found.warnings or inside_warnings or compiled.deferred or recovery_warnings or plan.notes
                   or any(u.kind != UnknownKind.BARE_METAL_HOSTS for u in unknowns))
    return Planned(compiled=compiled, observed=observed, plan=plan, sip=sip, renew_at=renew_at, settled=settled)


def desired_for(model: RepoModel, config: RepoConfig, state: State, observed: ObservedState,
                *, now: dt.datetime | None = None) -> tuple[Compiled, HostSelection]:
    """What the repo wants given `observed`, as make_plan's first pass compiles it, without a plan
    (the report of an apply that ended before its own planning pass after executing)."""
    learned = learn(state, observed, {name: node.cluster for name, node in model.nodes.items()})
    hosts = planned_hosts(model, config, learned, observed.hosts)
    sip = select_hosts(model.sip_clusters, hosts) if hosts is not None else HostSelection((), ())
    return compile_desired(model, learned, now=now, unavailable=observed.unreachable,
                           hosts=sip.relabeled(hosts or [])), sip


def observe_all(model: RepoModel, config: RepoConfig, state: State | None = None,
                reuse: FilesReuse | None = None, clusters: ClusterReader | None = None,
                etcd: EtcdReader | None = None) -> ObservedState:
    """Observe the hypervisors, then (with the recorded `state`'s credentials) the API and the etcd space
    of every cluster that runs them, the snapshots of a cluster whose spec.restore is pending, and the
    BareMetalHosts of a provider whose hosts are observed. `reuse`: node files known from an earlier
    observation; `clusters`: the reader that keeps its clients and the objects it listed; `etcd`: the
    reader that keeps etcd's space a while (all three the controller's, for quiet polls)."""
    from gitops.observe.backups import list_restores
    from gitops.observe.clusters import observe_clusters
    from gitops.observe.etcd import observe_etcd
    from gitops.observe.hypervisors import observe

    observed = observe(model.hypervisors.values(), reuse=reuse)
    if state is not None:
        targets = cluster_targets(model, state, observed)
        found = clusters.observe(targets) if clusters is not None else observe_clusters(targets)
        spaces = etcd.observe(model, state, observed) if etcd is not None else observe_etcd(model, state, observed)
        observed = dataclasses.replace(observed, clusters=found, snapshots=list_restores(model, config, state),
                                       etcd=spaces)
    if not provider_kind(config.bare_metal).observed or not model.sip_clusters:
        return observed
    try:
        hosts = provider_for(model, config, State()).list_hosts()
    except GitopsError as err:
        log.warning("cannot list BareMetalHosts: %s", err)
        return observed
    return dataclasses.replace(observed, hosts=tuple(hosts))


def cluster_targets(model: RepoModel, state: State, observed: ObservedState) -> list[ClusterTarget]:
    """Each cluster with a running kube-apiserver, reached directly at its running ones (by node name)."""
    running: dict[str, list[str]] = {}
    for pod in observed.pods():
        if pod.cluster in model.clusters and pod.running(APISERVER) and pod.node in state.nodes:
            running.setdefault(pod.cluster, []).append(pod.node)
    targets = []
    for cluster, nodes in sorted(running.items()):
        record = state.clusters.get(cluster)
        if record is None or record.admin is None:
            continue
        servers = tuple("https://" + host_port(model.hypervisors[state.nodes[n].hypervisor].ip_address,
                                               state.nodes[n].ports["apiserver"]) for n in sorted(nodes)
                        if state.nodes[n].hypervisor in model.hypervisors and "apiserver" in state.nodes[n].ports)
        if servers:
            targets.append(ClusterTarget(cluster, servers, record.trust_bundle("cluster"),
                                         record.admin.cert_pem, record.admin.key_pem))
    return targets


def connections(model: RepoModel, config: RepoConfig) -> Connections:
    from gitops.apply.executor import Connections
    from gitops.cri.client import CRIClient

    return Connections(cri=lambda name: CRIClient(model.hypervisors[name].cri_endpoint()),
                       hosts=lambda state: provider_for(model, config, state),
                       backup_target=lambda name: config.backup_targets[name])


# ------------------------------------------------------------------------------------------------ apply


class MassDeleteRefused(GitopsError):
    def __init__(self, plan: Plan, limit: int):
        self.plan = plan
        nodes = ", ".join(a.node for a in plan.prunes)
        super().__init__(f"the plan removes {len(plan.prunes)} pods whose nodes left the repo ({nodes}), more than "
                         f"prune.maxDeletes={limit}; re-run with --allow-mass-delete if that is intended")


@dataclass
class ApplyResult:
    #: the plan that was executed
    plan: Plan
    executed: list = field(default_factory=list)
    stopped: bool = False
    #: what the executed plan could not know: planned after executing it, not executed
    follow_up: Plan | None = None
    #: why the follow-up exists, when apply saw it happen (a key regenerated...)
    surprises: list[str] = field(default_factory=list)
    #: the planning pass after executing: its observed state is the live state
    after: Planned | None = None
    #: why the fence stopped the run ("" when it did not)
    fenced: str = ""
    #: by plan index: when each action done ran (`gitops.apply.run.Timing`)
    done: dict = field(default_factory=dict)

    @property
    def converged(self) -> bool:
        return not self.stopped and self.after is not None and self.after.plan.empty


Observe = Callable[[RepoModel], ObservedState]
#: narrows a planning pass to what this controller may touch (one of several replicas: its shards)
Restrict = Callable[[Planned], Planned]


def apply_repo(model: RepoModel, config: RepoConfig, store: StateStore, *, allow_mass_delete: bool = False,
               progress: Progress | None = None, source: str = "", should_stop: Callable[[], bool] = lambda: False,
               observe_fn: Observe | None = None, restrict: Restrict | None = None,
               fence: Fence | None = None) -> ApplyResult:
    """Plan, then execute exactly that plan (`gitops apply REPO`, the controller)."""
    watch = observe_fn or (lambda m: observe_all(m, config, store.load()))
    narrow = restrict or (lambda p: p)
    planned = narrow(make_plan(model, config, store.load(), watch(model), source=source))
    return apply_plan(planned.plan, planned.state, model, config, store, allow_mass_delete=allow_mass_delete,
                      progress=progress, should_stop=should_stop, observe_fn=watch, planned=planned,
                      restrict=restrict, fence=fence)


def apply_plan(the_plan: Plan, state: State, model: RepoModel, config: RepoConfig, store: StateStore, *,
               allow_mass_delete: bool = False, progress: Progress | None = None,
               should_stop: Callable[[], bool] = lambda: False, observe_fn: Observe | None = None,
               planned: Planned | None = None, restrict: Restrict | None = None,
               fence: Fence | None = None) -> ApplyResult:
    """Save the plan's recorded `state`, execute `the_plan` exactly, then plan once more to report what is
    left (the follow-up). `planned`: the planning pass that made the plan, when at hand. `restrict`
    narrows the follow-up like the plan; `fence` is asked before every action."""
    watch = observe_fn or (lambda m: observe_all(m, config, store.load()))
    narrow = restrict or (lambda p: p)
    if len(the_plan.prunes) > config.prune.max_deletes and not allow_mass_delete:
        raise MassDeleteRefused(the_plan, config.prune.max_deletes)
    store.save(state)
    result = ApplyResult(plan=the_plan)
    if the_plan.empty and planned is not None:
        result.after = planned
        return result
    from gitops.apply.executor import ApplyError, execute

    try:
        execution = execute(the_plan, state, connections(model, config), store,
                            progress=progress, should_stop=should_stop, fence=fence)
    except ApplyError as err:
        err.plan = the_plan
        raise
    result.executed, result.stopped, result.surprises = execution.executed, execution.stopped, execution.surprises
    result.fenced, result.done = execution.fenced, execution.done
    if result.stopped:
        return result
    after = narrow(make_plan(model, config, store.load(), watch(model), source=the_plan.source))
    result.after = after
    if after.plan.empty:
        store.save(after.state)  # records of what left the repo are dropped once nothing refers to them
    else:
        result.follow_up = after.plan
        log.warning("follow-up plan", extra={"actions": len(after.plan.actions)})
    return result
