"""One planning pass: learn from the observed state, compile, diff.

Used by `gitops plan` (once, printing the result), by `gitops apply` (in
rounds until nothing is left) and by the controller loop.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gitops.compile import Compiled, compile_desired
from gitops.model.config import RepoConfig
from gitops.model.resources import RepoModel
from gitops.observe import ObservedState
from gitops.plan.actions import Plan
from gitops.plan.diff import DiffOptions, diff, learn
from gitops.state.records import State


@dataclass(frozen=True)
class Planned:
    compiled: Compiled
    observed: ObservedState
    plan: Plan

    @property
    def state(self) -> State:
        """The recorded state the plan was made against (to persist before applying)."""
        return self.compiled.state


def make_plan(model: RepoModel, config: RepoConfig, state: State, observed: ObservedState,
              *, now: dt.datetime | None = None, source: str = "") -> Planned:
    learned = learn(state, observed, {name: node.cluster for name, node in model.nodes.items()})
    compiled = compile_desired(model, learned, now=now, unavailable=observed.unreachable)
    options = DiffOptions(prune=config.prune.enabled, renew_before_days=config.renew_before_days)
    plan = diff(compiled.desired, observed, compiled.state, options, now=now)
    warnings = list(plan.warnings) + list(compiled.deferred) + _orphan_warnings(model, compiled.state)
    plan = Plan(actions=plan.actions, warnings=tuple(warnings), source=source)
    return Planned(compiled=compiled, observed=observed, plan=plan)


def _orphan_warnings(model: RepoModel, state: State) -> list[str]:
    """Nodes recorded on hypervisors that left the repo cannot be reached any more."""
    out = []
    for name, record in sorted(state.nodes.items()):
        if record.hypervisor not in model.hypervisors:
            out.append(f"Node {name} was placed on Hypervisor {record.hypervisor}, which left the repo; its pod "
                       "cannot be reached and is not removed (put the Hypervisor back to clean it up)")
    return out
