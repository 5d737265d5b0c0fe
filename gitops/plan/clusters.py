"""Each cluster's part of a plan (pure), one stage after another: its inputs (`gitops.plan.inputs`); a pending
restore or a recovery decided, and the cluster as it leaves it (`gitops.plan.restore`);
that compared (`gitops.plan.diff`) and rolled out (`gitops.plan.rollout`: gates and order); the restore's or the
recovery's own actions put first; then the etcd upkeep of a cluster the plan leaves alone
(`gitops.plan.upkeep`). Each cluster is planned once per content of its inputs (`CLUSTER_DIFFS`).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gitops.memo import Memo
from gitops.plan import restore
from gitops.plan.actions import Action, Plan, Unknown, UnknownKind
from gitops.plan.diff import DiffOptions, compare
from gitops.plan.inputs import ClusterInputs, PlanInputs
from gitops.plan.rollout import ordered, roll_out
from gitops.plan.upkeep import leaves_etcd_alone, upkeep


def plan_nodes(every: PlanInputs, options: DiffOptions, now: dt.datetime | None = None,
               skip: frozenset[str] = frozenset(), renew_at: dict[str, dt.datetime] | None = None) -> Plan:
    """Every cluster's actions on its hypervisors (its pods, files, containers and etcd membership),
    compared then rolled out once per content of its inputs (see `ClusterInputs`), plus what is unknown
    (the unreachable hypervisors, nodes whose files are not checked). `skip`: clusters known to plan
    nothing (`gitops.plan.converged`), left out; `renew_at` gets each cluster's first certificate renewal
    time."""
    now = now or dt.datetime.now(dt.timezone.utc)
    unknowns = every.unreachable
    actions: list[Action] = []
    warnings: list[tuple[str, str]] = []
    settings = repr(options)
    unchecked: list[str] = []
    for inputs in every.clusters:
        if inputs.cluster in skip:
            continue
        part = CLUSTER_DIFFS.get(inputs.key(settings), lambda: _cluster_plan(inputs, options, now),
                                 fresh=lambda part: part.fresh_at(now))
        if renew_at is not None and part.until is not None:
            renew_at[inputs.cluster] = part.until
        actions.extend(part.actions)
        warnings.extend(part.warnings)
        if (inputs.etcd is not None and inputs.want is not None
                and leaves_etcd_alone(part.actions, {m.node for m in inputs.want.etcd_members})):
            done, said = upkeep(inputs.cluster, inputs.want, inputs.etcd, {p.node: p.hypervisor for p in inputs.wants},
                                options.health_timeout)
            actions.extend(done)
            warnings.extend(("", w) for w in said)
        unchecked.extend(part.unchecked)
    warnings.sort(key=lambda item: item[0])  # by node, as the pods were walked
    if unchecked:
        unknowns += (Unknown(UnknownKind.NODE_FILES, "files agent", nodes=tuple(sorted(unchecked))),)
    return Plan(actions=ordered(actions), warnings=tuple(text for _, text in warnings), unknowns=unknowns)


@dataclass(frozen=True)
class ClusterDiff:
    """One cluster's actions and (node, warning)s, valid from `since` until `until` (the first moment a
    certificate found fine enters its renewal window; None: no certificate involved)."""

    actions: tuple[Action, ...]
    warnings: tuple[tuple[str, str], ...]
    since: dt.datetime
    until: dt.datetime | None
    #: nodes whose files were not checked: their files agent starts again in this plan
    unchecked: tuple[str, ...] = ()

    def fresh_at(self, now: dt.datetime) -> bool:
        return self.since <= now and (self.until is None or now < self.until)


#: per-cluster diffs by a digest of their inputs: a plan diffs again only the clusters that changed
CLUSTER_DIFFS: Memo[bytes, ClusterDiff] = Memo(maxsize=1 << 16)


def _cluster_plan(inputs: ClusterInputs, options: DiffOptions, now: dt.datetime) -> ClusterDiff:
    """One cluster's stages: a recovery under way (its survivor's etcd rebuilt first) or a pending restore
    that can run (one that waits says why) decided, the cluster compared and rolled out as it leaves it,
    then the recovery's or the restore's own actions put first."""
    timeout = options.health_timeout
    forcing = inputs.record is not None and bool(inputs.record.forcing)
    value = "" if forcing else restore.pending(inputs)
    waits = restore.hold(inputs, value) if value else ""
    restoring = bool(value) and not waits
    view = (restore.stopped_view(inputs) if restoring
            else restore.survivor_view(inputs) if forcing else inputs)
    found = compare(view, options, now)
    actions, held = roll_out(view, found.actions, found.keepers, timeout)
    if forcing:
        actions = restore.recover_action(inputs, actions, timeout)
    if restoring:
        actions = [restore.restore_action(inputs, value), *restore.restart_gates(view, actions, timeout)]
    waiting = ((min(inputs.record.etcd_members), waits),) if waits and inputs.record else ()
    return ClusterDiff(tuple(actions), (*found.warnings, *held, *waiting), now, found.until, found.unchecked)
