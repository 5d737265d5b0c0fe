"""One planning pass: learn from the observed state, compile, diff.

Used by `gitops plan` (once, printing the result), by `gitops apply` (in
rounds until nothing is left) and by the controller loop.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass, field

from gitops.compile import Compiled, compile_desired
from gitops.errors import GitopsError
from gitops.model.config import RepoConfig
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.observe import ObservedState, observe
from gitops.plan.actions import Plan, Unknown, UnknownKind, ordered
from gitops.sip.reconcile import file_hosts, label_actions, provider_for
from gitops.sip.reconcile import warnings as sip_warnings
from gitops.sip.selection import SIPPlan, select_hosts
from gitops.plan.diff import DiffOptions, diff, learn
from gitops.state.records import State

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    compiled: Compiled
    observed: ObservedState
    plan: Plan
    #: SIP host selection and the label changes it needs
    sip: SIPPlan = field(default_factory=lambda: SIPPlan((), ()))

    @property
    def state(self) -> State:
        """The recorded state the plan was made against (to persist before applying)."""
        return self.compiled.state


def make_plan(model: RepoModel, config: RepoConfig, state: State, observed: ObservedState,
              *, now: dt.datetime | None = None, source: str = "") -> Planned:
    learned = learn(state, observed, {name: node.cluster for name, node in model.nodes.items()})
    hosts = bare_metal_hosts(model, config, learned, observed)
    compiled = compile_desired(model, learned, now=now, unavailable=observed.unreachable, hosts=hosts or ())
    options = DiffOptions(prune=config.prune.enabled, renew_before_days=config.renew_before_days)
    plan = diff(compiled.desired, observed, compiled.state, options, now=now)
    warnings = list(plan.warnings) + list(compiled.deferred)
    unknowns = list(plan.unknowns) + _orphans(model, compiled.state)
    if hosts is None:
        sip = SIPPlan((), ())
        if model.sip_clusters:
            unknowns.append(Unknown(UnknownKind.BARE_METAL_HOSTS, config.bare_metal.provider,
                                    sip_clusters=tuple(sorted(model.sip_clusters))))
    else:
        sip = select_hosts(model.sip_clusters, hosts)
        warnings += sip_warnings(sip)
    actions = ordered(list(plan.actions) + label_actions(sip))
    plan = Plan(actions=actions, warnings=tuple(warnings), source=source, unknowns=tuple(unknowns))
    return Planned(compiled=compiled, observed=observed, plan=plan, sip=sip)


def bare_metal_hosts(model: RepoModel, config: RepoConfig, state: State,
                     observed: ObservedState) -> list[BareMetalHost] | None:
    """File provider: the repo's hosts with recorded labels. Kubernetes: what observation listed."""
    if config.bare_metal.provider == "file":
        return file_hosts(model, state)
    return list(observed.hosts) if observed.hosts is not None else None


def observe_all(model: RepoModel, config: RepoConfig) -> ObservedState:
    """Observe the hypervisors, and a kubernetes BareMetalHost provider's hosts."""
    observed = observe(model.hypervisors.values())
    if config.bare_metal.provider != "kubernetes" or not model.sip_clusters:
        return observed
    try:
        hosts = provider_for(model, config, State()).list_hosts()
    except GitopsError as err:
        log.warning("cannot list BareMetalHosts: %s", err)
        return observed
    return dataclasses.replace(observed, hosts=tuple(hosts))


def _orphans(model: RepoModel, state: State) -> list[Unknown]:
    """Nodes recorded on hypervisors that left the repo: their pods cannot be observed nor removed."""
    gone: dict[str, list[str]] = {}
    for name, record in sorted(state.nodes.items()):
        if record.hypervisor not in model.hypervisors:
            gone.setdefault(record.hypervisor, []).append(name)
    return [Unknown(UnknownKind.HYPERVISOR, hv, "it left the repo; put the Hypervisor back to clean up its pods",
                    tuple(nodes)) for hv, nodes in sorted(gone.items())]
