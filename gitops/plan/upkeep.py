"""etcd upkeep (pure): members whose database file is mostly free are defragmented, one at a time, and
a NOSPACE alarm is cleared once the space in use is well under the quota again. Out of space, etcd
counts the file itself against the quota, so every member with space to give back is defragmented
first and the alarm cleared after (etcd's own order: compact, defragment, disarm).

Upkeep runs only on a cluster whose etcd the plan leaves alone, whose members all answered: a
defragmentation blocks its member while it rewrites the file, so it never meets a roll or a
membership change. (Components that exited while etcd was out of space start again after it.) A member that leads hands leadership over first. A NOSPACE alarm that would
only fire again (the data in use near the quota) is a warning saying what to do, not an action.
"""
from __future__ import annotations

from gitops.compile.desired import DesiredCluster
from gitops.model.components import ETCD
from gitops.model.resources import DEFAULT_ETCD_QUOTA
from gitops.observe.types import ObservedEtcd
from gitops.plan.actions import Action, Kind
from gitops.plan.payloads import EtcdAlarm, EtcdHealth

#: a member is defragmented when more than half of its database file is free, and at least this much
MIN_FREE = 16 << 20
#: a NOSPACE alarm is cleared when the largest space in use is at most this share of the quota
DISARM_BELOW = 0.8


def mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def fragmented(size: int, in_use: int, quota: int | None = None) -> bool:
    """More than half of the file free, and enough to matter: MIN_FREE, or an eighth of a smaller quota."""
    free = size - in_use
    return free * 2 > size and free >= min(MIN_FREE, (quota or DEFAULT_ETCD_QUOTA) // 8)


#: what a plan may do to a cluster beside its upkeep: nothing of its etcd
_ETCD_KINDS = (Kind.ETCD_MEMBER_ADD, Kind.ETCD_MEMBER_PROMOTE, Kind.ETCD_MEMBER_REMOVE, Kind.RECOVER_ETCD,
               Kind.RESTORE_ETCD, Kind.BACKUP_ETCD)


def leaves_etcd_alone(actions: list[Action] | tuple[Action, ...], members: set[str]) -> bool:
    """Whether `actions` (one cluster's) neither change its membership nor touch a member's etcd or pod."""
    return not any(a.kind in _ETCD_KINDS or a.component == ETCD
                   or (a.kind in (Kind.REMOVE_POD, Kind.CREATE_POD) and a.node in members) for a in actions)


def upkeep_facts(seen: ObservedEtcd | None) -> tuple:
    """What `upkeep` decides on that changes from poll to poll: each member (whether it answered, whether
    its file is fragmented) and the alarms; not the sizes, which change with every write. Two
    observations with the same facts get the same upkeep while neither has an alarm (`gitops.plan.converged`
    records only clusters with nothing to do)."""
    if seen is None:
        return ()
    return (tuple(sorted((s.node, bool(s.error), fragmented(s.db_size, s.db_in_use, seen.quota))
                         for s in seen.members)), tuple(sorted(seen.alarms)), seen.quota)


def upkeep(cluster: str, want: DesiredCluster, seen: ObservedEtcd, where: dict[str, str],
           timeout: int) -> tuple[list[Action], list[str]]:
    """The upkeep actions of a cluster whose etcd the plan leaves alone (`where`: its members' hypervisors),
    and warnings."""
    members = {m.node for m in want.etcd_members}
    answered = [s for s in seen.members if not s.error]
    if not answered or len(answered) < len(seen.members) or {s.node for s in answered} != members:
        return [], []
    actions = []
    quota = want.etcd_quota or DEFAULT_ETCD_QUOTA
    alarmed = sorted(n for n, alarm in seen.alarms if alarm == "NOSPACE")
    for space in sorted(answered, key=lambda s: (s.leader, s.node)):  # the leader last
        # out of space, etcd counts the file against its quota: any space a defragmentation gives back counts
        # (and the space in use it reports is counted again only at its next write, so it may read high)
        if not (fragmented(space.db_size, space.db_in_use, quota)
                or (alarmed and space.db_size - space.db_in_use >= min(MIN_FREE, quota // 8) // 4)):
            continue
        peers = tuple(s.client_url for s in answered if s.node != space.node)
        actions.append(Action(
            Kind.DEFRAGMENT_ETCD, where.get(space.node, ""), cluster, space.node, order=len(actions),
            reason=f"{mib(space.db_size - space.db_in_use)} of its {mib(space.db_size)} database file is free",
            details=(f"one member at a time: the {len(peers)} other member(s) serving (a leader known) before, "
                     f"this one serving after (up to {timeout}s each)",
                     *(("it leads etcd: leadership first moves to another member",) if space.leader else ())),
            payload=EtcdHealth(space.client_url, peers, timeout, prefer=peers)))
    warnings = []
    if alarmed:
        in_use = max(s.db_in_use for s in answered)
        if in_use <= quota * DISARM_BELOW:
            actions.append(Action(
                Kind.DISARM_ETCD_ALARM, "", cluster, "", order=len(actions), reason=f"NOSPACE alarm on {', '.join(alarmed)}, and "
                f"{mib(in_use)} of the {mib(quota)} quota is in use now",
                details=("etcd takes writes again once the alarm is cleared (after any defragmentation above)",),
                payload=EtcdAlarm(tuple(s.client_url for s in answered), "NOSPACE")))
        else:
            warnings.append(f"cluster {cluster}: etcd is out of space (NOSPACE alarm on {', '.join(alarmed)}): "
                            f"{mib(in_use)} of its {mib(quota)} quota is in use, so clearing the alarm would only "
                            "raise it again: delete objects (etcd still takes deletions; the API server compacts "
                            "every 5 minutes) or raise spec.etcd.quotaBackendBytes"
                            + ("; the space in use is counted again after the defragmentation in this plan, and "
                               "the next plan clears the alarm if it is low enough" if actions else ""))
    return actions, warnings


def space_condition(want: DesiredCluster, seen: ObservedEtcd | None) -> tuple[bool, str, str]:
    """The cluster's `EtcdSpace` condition: (ok, reason, message)."""
    if seen is None or not seen.members:
        return True, "NotObserved", "etcd was not read"
    quota = want.etcd_quota or DEFAULT_ETCD_QUOTA
    answered = [s for s in seen.members if not s.error]
    alarms = [f"{alarm} on {node}" for node, alarm in seen.alarms]
    largest = max((s.db_size for s in answered), default=0)
    in_use = max((s.db_in_use for s in answered), default=0)
    text = f"database {mib(largest)} ({mib(in_use)} in use) of a {mib(quota)} quota"
    if alarms:
        return False, "EtcdAlarm", f"{', '.join(alarms)}; {text}"
    if largest >= quota * DISARM_BELOW:
        return False, "NearQuota", text
    # (no sizes while within: the status would change with every write)
    return True, "WithinQuota", f"every member's database under {DISARM_BELOW:.0%} of a {mib(quota)} quota"
