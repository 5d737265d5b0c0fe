"""Showing a plan: coloured text for terminals, Markdown for pull requests, JSON for machines."""
from __future__ import annotations

import json
from collections import OrderedDict

from rich.console import Console
from rich.markup import escape

from gitops.plan.actions import Action, Kind, Plan

VERB = {
    Kind.ETCD_MEMBER_REMOVE: "remove etcd member",
    Kind.REMOVE_CONTAINER: "remove container",
    Kind.REMOVE_POD: "remove pod",
    Kind.CREATE_POD: "create pod",
    Kind.GENERATE_KEYS: "generate keys",
    Kind.WRITE_FILES: "write files",
    Kind.ETCD_MEMBER_ADD: "add etcd member",
    Kind.CREATE_CONTAINER: "create container",
    Kind.RECREATE_CONTAINER: "recreate container",
    Kind.LABEL_HOST: "label host",
}
COLOUR = {"+": "green", "~": "yellow", "-": "red"}


def headline(plan: Plan) -> str:
    if plan.empty and plan.warnings:
        return "No changes planned, but not everything could be checked (see the warnings)."
    if plan.empty:
        return "No changes. The live state matches the repo."
    s = plan.summary()
    return f"Plan: {s['add']} to add, {s['change']} to change, {s['remove']} to remove."


def describe(action: Action) -> str:
    what = VERB[action.kind] + (f" {action.component}" if action.component else "")
    return f"{what}: {action.reason}" if action.reason else what


def _groups(plan: Plan) -> "OrderedDict[tuple[str, str], list[Action]]":
    groups: OrderedDict[tuple[str, str], list[Action]] = OrderedDict()
    for action in sorted(plan.actions, key=lambda a: (a.cluster, a.node)):
        groups.setdefault((action.cluster, action.node), []).append(action)
    for key in groups:
        groups[key].sort(key=Action.sort_key)
    return groups


def render_text(plan: Plan, console: Console) -> None:
    """Grouped by cluster and node, `+ ~ -` coloured when the console is a terminal."""
    source = f" (source {plan.source})" if plan.source else ""
    console.print(f"[bold]{escape(headline(plan))}[/bold]{escape(source)}")
    cluster = None
    for (cluster_name, node), actions in _groups(plan).items():
        if cluster_name != cluster:
            cluster = cluster_name
            console.print(f"\n[bold]Cluster {escape(cluster_name)}[/bold]")
        hv = next((a.hypervisor for a in actions if a.hypervisor), "")
        what = "Host" if any(a.kind == Kind.LABEL_HOST for a in actions) else "Node"
        console.print(f"  {what} {escape(node)}" + (f" [dim]on {escape(hv)}[/dim]" if hv else ""))
        for action in actions:
            colour = COLOUR[action.symbol]
            console.print(f"    [{colour}]{action.symbol} {escape(describe(action))}[/{colour}]")
            for detail in action.details:
                console.print(f"        [dim]{escape(detail)}[/dim]")
    for warning in plan.warnings:
        console.print(f"[bold yellow]! {escape(warning)}[/bold yellow]")


def render_markdown(plan: Plan) -> str:
    """A PR comment: summary line, then a `diff` block per cluster (GitHub colours + and -)."""
    lines = [f"### gitops plan{f' for `{plan.source}`' if plan.source else ''}", "", f"**{headline(plan)}**", ""]
    symbol = {"+": "+", "-": "-", "~": "!"}
    cluster = None
    for (cluster_name, node), actions in _groups(plan).items():
        if cluster_name != cluster:
            if cluster is not None:
                lines += ["```", ""]
            cluster = cluster_name
            lines += [f"#### Cluster `{cluster_name}`", "", "```diff"]
        for action in actions:
            where = f"{node}" + (f" on {action.hypervisor}" if action.hypervisor else "")
            lines.append(f"{symbol[action.symbol]} {where}: {describe(action)}")
            lines += [f"    {d}" for d in action.details]
    if cluster is not None:
        lines += ["```", ""]
    if plan.warnings:
        lines += ["**Warnings**", ""] + [f"- :warning: {w}" for w in plan.warnings] + [""]
    return "\n".join(lines)


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, sort_keys=True)
