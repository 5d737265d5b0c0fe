"""BareMetalHost label changes of a SIP selection, as plan actions (pure)."""
from __future__ import annotations

from gitops.plan.actions import Action, Kind
from gitops.plan.payloads import LabelHost
from gitops.sip.selection import HostSelection


def label_actions(plan: HostSelection) -> list[Action]:
    actions = []
    for change in plan.changes:
        details = tuple(f"set {k}={v}" for k, v in change.set) + tuple(f"remove {k}" for k in change.remove)
        actions.append(Action(Kind.LABEL_HOST, "", change.cluster, change.host, reason=change.reason,
                              details=details, payload=LabelHost(change.host, change.set, change.remove)))
    return actions


def sip_warnings(plan: HostSelection) -> list[str]:
    return [f"SIPCluster {s.cluster}: {s.condition.reason}: {s.condition.message}"
            for s in plan.selections if not s.ready]
