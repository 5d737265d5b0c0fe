"""Showing a plan: coloured text for terminals, Markdown for pull requests, JSON for machines."""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from gitops.plan.actions import KINDS, Action, Kind, Plan, UnknownKind
from gitops.printable import printable

COLOUR = {"+": "green", "~": "yellow", "-": "red", "=": "cyan"}


def safe(text: str) -> str:
    """`text` for a rich console: markup escaped, control characters written as `repr` does."""
    return escape(printable(text))


#: kinds from this phase on act inside the cluster's own API
API_PHASE = KINDS[Kind.CREATE_OBJECT].phase


def headline(plan: Plan) -> str:
    """The summary line. It never says "No changes." alone when something could not be observed."""
    if plan.unknowns:
        base = "No changes in what could be checked." if plan.empty else _counts(plan)
        return f"{base} Incomplete: {_unknown_count(plan)} could not be observed."
    if plan.empty and plan.warnings:
        return "No changes planned, with warnings (see below)."
    if plan.empty:
        return "No changes. The live state matches the repo."
    return _counts(plan)


def unchanged_line(plan: Plan, names: int = 10) -> str:
    """What a cold plan left out and why ("" when it left nothing out); names the first `names` clusters."""
    if not plan.unchanged:
        return ""
    shown = ", ".join(plan.unchanged[:names]) + (f" and {len(plan.unchanged) - names} more"
                                                  if len(plan.unchanged) > names else "")
    return (f"{len(plan.unchanged)} cluster(s) not planned again, unchanged since their last converged plan "
            f"(same documents, hypervisors, recorded state and observed pods; no certificate due): {shown}")


def _counts(plan: Plan) -> str:
    s = plan.summary()
    return f"Plan: {s['add']} to add, {s['change']} to change, {s['remove']} to remove."


def _unknown_count(plan: Plan) -> str:
    """`1 hypervisor`, `2 hypervisors, the API of 1 cluster and the BareMetalHosts`."""
    def count(kind: UnknownKind) -> int:
        return sum(len(u.nodes) if kind == UnknownKind.NODE_FILES else 1 for u in plan.unknowns if u.kind == kind)

    hypervisors, apis, nodes = (count(k) for k in (UnknownKind.HYPERVISOR, UnknownKind.CLUSTER_API,
                                                   UnknownKind.NODE_FILES))
    parts = [f"{hypervisors} hypervisor{'s' if hypervisors != 1 else ''}"] if hypervisors else []
    if apis:
        parts.append(f"the API of {apis} cluster{'s' if apis != 1 else ''}")
    if nodes:
        parts.append(f"the files of {nodes} node{'s' if nodes != 1 else ''}")
    if any(u.kind == UnknownKind.BARE_METAL_HOSTS for u in plan.unknowns):
        parts.append("the BareMetalHosts")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def unknown_lines(plan: Plan) -> list[str]:
    """One `Unknown: ...` line per source that could not be observed (text, apply's output)."""
    return [f"Unknown: {u.describe()}" for u in plan.unknowns]


def describe(action: Action) -> str:
    what = KINDS[action.kind].verb + (f" {action.component}" if action.component else "")
    return f"{what}: {action.reason}" if action.reason else what


#: a cluster's own sections that come before its nodes
_FIRST = (Kind.BACKUP_ETCD, Kind.RECOVER_ETCD, Kind.RESTORE_ETCD)
#: what a cluster-wide action is about, where a node's name would go
@dataclass(frozen=True)
class Section:
    """One group of a plan as people read it: a cluster's node on a hypervisor (a node that moves has one
    on each), its backup, restore or rebuild, what happens inside its API, its recorded state."""

    cluster: str
    #: "Node team-a-cp-1", "Backup:", "In its API:", "Worker team-a-w1"...
    title: str
    hypervisor: str
    actions: tuple[Action, ...]


def sections(plan: Plan) -> list[Section]:
    """The plan's groups in the order they are shown (text, Markdown, the UI)."""
    out = []
    for (cluster, node, _, _), actions in _groups(plan).items():
        title = _what(actions) + (f" {node}" if node else "")
        out.append(Section(cluster, title, next((a.hypervisor for a in actions if a.hypervisor), ""), tuple(actions)))
    return out


def _groups(plan: Plan) -> "OrderedDict[tuple[str, str, str, str], list[Action]]":
    groups: OrderedDict[tuple[str, str, str, str], list[Action]] = OrderedDict()
    # a cluster's backup first, its nodes, what happens inside its API (objects, workers' certificates),
    # then its recorded state
    # (with spec.rollout.waves: wave by wave, each between its start and its soak)
    for action in sorted(plan.actions, key=lambda a: (a.wave, _GATE.get(a.kind, 1), a.cluster, a.kind not in _FIRST,
                                                      a.kind != Kind.BACKUP_ETCD, a.info.phase >= API_PHASE,
                                                      a.kind == Kind.ADVANCE_CA_ROTATION, a.node)):
        section = action.kind.value if action.kind in (*_FIRST, Kind.ADVANCE_CA_ROTATION, *_GATE) else ""
        # a node that moves has a group on each hypervisor (where it leaves, where it comes)
        where = action.hypervisor if action.node else ""
        groups.setdefault((action.cluster, action.node, section, where), []).append(action)
    for key in groups:
        groups[key].sort(key=Action.sort_key)
    return groups


#: a wave's start before its clusters, its soak after them
_GATE = {Kind.START_WAVE: 0, Kind.SOAK_WAVE: 2}


def _what(actions: list[Action]) -> str:
    kinds = {a.kind for a in actions}
    if kinds & set(_GATE):
        return f"Wave {actions[0].component}:"
    if Kind.BACKUP_ETCD in kinds:
        return "Backup:"
    if Kind.RESTORE_ETCD in kinds:
        return "Restore:"
    if Kind.RECOVER_ETCD in kinds:
        return "Rebuild etcd from"
    if Kind.ADVANCE_CA_ROTATION in kinds:
        return "Recorded state:"
    if Kind.LABEL_HOST in kinds:
        return "Host"
    if Kind.SIGN_CERTIFICATE_REQUEST in kinds:
        return "Worker"
    return "In its API:" if kinds & {Kind.CREATE_OBJECT, Kind.UPDATE_OBJECT} else "Node"


def _header(section: Section) -> str:
    return f"Cluster {section.cluster}" if section.cluster else "Rollout"


def render_text(plan: Plan, console: Console) -> None:
    """Grouped by cluster and node, `+ ~ -` coloured when the console is a terminal."""
    source = f" (source {plan.source})" if plan.source else ""
    console.print(f"[bold]{safe(headline(plan))}[/bold]{safe(source)}")
    if plan.unchanged:
        console.print(f"[dim]= {safe(unchanged_line(plan))}[/dim]")
    for line in unknown_lines(plan):
        console.print(f"[bold magenta]? {safe(line)}[/bold magenta]")
    for note in plan.notes:
        console.print(f"[bold cyan]» {safe(note)}[/bold cyan]")
    cluster = None
    for section in sections(plan):
        if section.cluster != cluster:
            cluster = section.cluster
            console.print(f"\n[bold]{safe(_header(section))}[/bold]")
        hv = section.hypervisor
        console.print(f"  {safe(section.title)}" + (f" [dim]on {safe(hv)}[/dim]" if hv else ""))
        for action in section.actions:
            colour = COLOUR[action.symbol]
            console.print(f"    [{colour}]{action.symbol} {safe(describe(action))}[/{colour}]")
            for detail in action.details:
                console.print(f"        [dim]{safe(detail)}[/dim]")
    for warning in plan.warnings:
        console.print(f"[bold yellow]! {safe(warning)}[/bold yellow]")


def render_markdown(plan: Plan) -> str:
    """A PR comment: summary line, then a `diff` block per cluster (GitHub colours + and -)."""
    lines = [f"### gitops plan{f' for `{plan.source}`' if plan.source else ''}", "", f"**{headline(plan)}**", ""]
    if plan.unchanged:
        lines += [f"_{unchanged_line(plan)}_", ""]
    if plan.unknowns:
        lines += ["**Unknown** (could not be observed: not checked, nothing planned there)", ""]
        lines += [f"- :question: {u.describe()}" for u in plan.unknowns] + [""]
    if plan.notes:
        lines += [f"- :arrows_counterclockwise: {n}" for n in plan.notes] + [""]
    symbol = {"+": "+", "-": "-", "~": "!", "=": "#"}
    cluster = None
    for (cluster_name, node, _, _), actions in _groups(plan).items():
        if cluster_name != cluster:
            if cluster is not None:
                lines += ["```", ""]
            cluster = cluster_name
            lines += [f"#### Cluster `{cluster_name}`" if cluster_name else "#### Rollout", "", "```diff"]
        for action in actions:
            where = (node or action.info.about) + (f" on {action.hypervisor}" if action.hypervisor else "")
            lines.append(f"{symbol[action.symbol]} {where}: {describe(action)}")
            lines += [f"    {d}" for d in action.details]
    if cluster is not None:
        lines += ["```", ""]
    if plan.warnings:
        lines += ["**Warnings**", ""] + [f"- :warning: {w}" for w in plan.warnings] + [""]
    return "\n".join(map(printable, lines))


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, sort_keys=True)
