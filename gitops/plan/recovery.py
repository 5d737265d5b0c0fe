"""Rebuilding an etcd whose quorum is lost for good (spec.recovery.forceNewClusterFrom), as a plan (pure).

When a majority of a cluster's recorded members were on hypervisors marked lost, no member can be
removed (that needs a quorum) and none can be added. With spec.recovery naming the member that
survives, the plan is made against the state the recovery leaves (`before_compile`): the survivor the
only member, the lost members' records dropped, so they are placed anew and join again one at a time as
learners, by the ordinary plan. Its first action (`gitops.plan.restore.recover_action`) restarts the
survivor's etcd once with --force-new-cluster (a one-member cluster on its own data), then as usual.
Without spec.recovery, the plan says exactly this and which field to set.
"""
from __future__ import annotations

from gitops.model.resources import RepoModel
from gitops.observe.types import ObservedState
from gitops.pods import AGENT
from gitops.state.records import State


def where(state: State, member: str) -> str:
    """The hypervisor a recorded member runs on (or ran on, while it moves)."""
    record = state.nodes.get(member)
    return (record.moved_from or record.hypervisor) if record is not None else ""


def before_compile(model: RepoModel, state: State, observed: ObservedState) -> tuple[State, list[str], list[str]]:
    """`state` as the recoveries this plan makes leave it, with (warnings, notes): a cluster that lost its
    quorum to lost hypervisors without a way to recover gets a warning saying what to set."""
    lost = set(observed.lost)
    out, warnings, notes = state, [], []
    if not lost:
        return out, warnings, notes
    running = {p.node for p in observed.pods() if p.running(AGENT) is not None}
    for name, cluster in sorted(model.clusters.items()):
        record = state.clusters.get(name)
        if record is None or not record.etcd_members or record.forcing:
            continue
        members = list(record.etcd_members)
        gone = [m for m in members if where(state, m) in lost]
        alive = [m for m in members if m not in gone]
        if not gone or len(alive) > len(members) // 2:
            continue  # a quorum stays: the lost ones are replaced one at a time
        hvs = ", ".join(sorted({where(state, m) for m in gone}))
        what = (f"cluster {name}: {len(gone)} of its {len(members)} etcd members ({', '.join(gone)}) were on lost "
                f"hypervisor(s) {hvs}, so it has no quorum and no member can be removed or added")
        survivor = cluster.recovery.force_new_cluster_from if cluster.recovery else ""
        if not survivor:
            options = ", ".join(alive) or "none: restore it from a snapshot instead (spec.restore)"
            warnings.append(f"{what}. To rebuild etcd from a surviving member's data, set "
                            f"spec.recovery.forceNewClusterFrom on Cluster {name} to one of: {options}. The plan "
                            "then restarts that member once with --force-new-cluster (writes it had not received are "
                            "lost) and adds the others back from new places, one at a time, as learners")
            continue
        why = ""
        if record.recovered == survivor:
            why = f"spec.recovery.forceNewClusterFrom {survivor} was already forced once: name another survivor"
        elif survivor not in alive:
            why = f"{survivor} is not a surviving member (survivors: {', '.join(alive) or 'none'})"
        elif alive != [survivor]:
            why = (f"members other than {survivor} survive ({', '.join(m for m in alive if m != survivor)}): "
                   "a rebuild from one member would leave them behind; mark their hypervisors lost too, or wait "
                   "until the lost ones answer")
        elif survivor not in running:
            why = f"the pod or files agent of {survivor} is not running on {where(state, survivor)}"
        if why:
            warnings.append(f"{what}; spec.recovery waits: {why}")
            continue
        if out is state:
            out = state.copy()
        rebuilt = out.clusters[name]
        rebuilt.etcd_members, rebuilt.etcd_learners, rebuilt.forcing = [survivor], [], survivor
        for member in gone:
            out.nodes.pop(member, None)  # placed anew: they join again as learners
            rebuilt.retire_service_account_key(member)  # (their new pods generate new keys)
        notes.append(f"{what}: etcd is rebuilt from {survivor} (spec.recovery.forceNewClusterFrom); "
                     f"{', '.join(gone)} join again from new places, one at a time")
    return out, warnings, notes
