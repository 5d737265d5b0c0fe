"""Apply's handler of bare-metal hosts: a BareMetalHost's labels, through its provider."""
from __future__ import annotations

from gitops.apply.run import Run
from gitops.plan.actions import Action
from gitops.plan.payloads import LabelHost
from gitops.sip.providers import apply_change
from gitops.sip.selection import LabelChange


def label_host(run: Run, action: Action, p: LabelHost) -> None:
    if run.provider is None:
        run.provider = run.connections.hosts(run.state)
    with run.recording() as state:
        apply_change(run.provider, LabelChange(p.host, action.cluster, p.set, p.remove, action.reason), state)
