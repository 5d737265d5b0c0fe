"""The plan: an ordered list of typed actions, each with a human reason."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Kind(str, Enum):
    ETCD_MEMBER_REMOVE = "etcd-member-remove"
    REMOVE_CONTAINER = "remove-container"
    REMOVE_POD = "remove-pod"
    CREATE_POD = "create-pod"
    GENERATE_KEYS = "generate-keys"
    WRITE_FILES = "write-files"
    ETCD_MEMBER_ADD = "etcd-member-add"
    CREATE_CONTAINER = "create-container"
    RECREATE_CONTAINER = "recreate-container"
    LABEL_HOST = "label-host"


#: execution order of the kinds; within the last phase a node's etcd member add
#: comes right before its containers, so members join one at a time
PHASE = {
    Kind.ETCD_MEMBER_REMOVE: 0,
    Kind.REMOVE_CONTAINER: 1,
    Kind.REMOVE_POD: 2,
    Kind.CREATE_POD: 3,
    Kind.GENERATE_KEYS: 4,
    Kind.WRITE_FILES: 5,
    Kind.ETCD_MEMBER_ADD: 6,
    Kind.CREATE_CONTAINER: 6,
    Kind.RECREATE_CONTAINER: 6,
    Kind.LABEL_HOST: 7,
}

SYMBOL = {
    Kind.ETCD_MEMBER_REMOVE: "-",
    Kind.REMOVE_CONTAINER: "-",
    Kind.REMOVE_POD: "-",
    Kind.CREATE_POD: "+",
    Kind.GENERATE_KEYS: "+",
    Kind.WRITE_FILES: "~",
    Kind.ETCD_MEMBER_ADD: "+",
    Kind.CREATE_CONTAINER: "+",
    Kind.RECREATE_CONTAINER: "~",
    Kind.LABEL_HOST: "~",
}


@dataclass(frozen=True)
class Action:
    kind: Kind
    hypervisor: str
    cluster: str
    node: str
    component: str = ""
    reason: str = ""
    details: tuple[str, ...] = ()
    #: the sandbox or container this action removes or replaces
    target_id: str = ""
    #: removal of an object whose resource left the repo (counts against maxDeletes)
    prune: bool = False
    #: position of the component in its pod, for ordering
    order: int = 0

    @property
    def symbol(self) -> str:
        return SYMBOL[self.kind]

    @property
    def subject(self) -> str:
        parts = [self.cluster, self.node] + ([self.component] if self.component else [])
        return "/".join(parts)

    def sort_key(self) -> tuple:
        phase = PHASE[self.kind]
        sub = 0 if self.kind == Kind.ETCD_MEMBER_ADD else 1
        return (phase, self.cluster, self.node, sub, self.order, self.kind.value, self.component, self.target_id)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        data["details"] = list(self.details)
        return data


class UnknownKind(str, Enum):
    #: a Hypervisor that could not be observed (unreachable, or no longer in the repo)
    HYPERVISOR = "hypervisor"
    #: the BareMetalHost provider could not list the hosts
    BARE_METAL_HOSTS = "bare-metal-hosts"


@dataclass(frozen=True)
class Unknown:
    """A source the plan could not observe: nothing that depends on it was checked or planned.

    A plan with unknowns is incomplete: "no changes" only holds for what could be checked.
    """

    kind: UnknownKind
    #: the Hypervisor's name, or the BareMetalHost provider ("kubernetes")
    name: str
    #: why it could not be observed, as reported (empty when not known)
    error: str = ""
    #: the Nodes whose pods were not checked (placed there, or recorded there and left the repo)
    nodes: tuple[str, ...] = ()
    #: the SIPClusters that were not planned (BareMetalHosts unknown)
    sip_clusters: tuple[str, ...] = ()

    def describe(self) -> str:
        why = f" ({self.error})" if self.error else ""
        if self.kind == UnknownKind.HYPERVISOR:
            text = f"hypervisor {self.name} is unreachable{why}; nothing on it is planned"
            if self.nodes:
                text += f"; its {len(self.nodes)} node(s) were not checked: {', '.join(self.nodes)}"
            return text
        text = f"BareMetalHosts could not be listed from the {self.name} provider{why}"
        if self.sip_clusters:
            text += f"; SIPCluster(s) not planned: {', '.join(self.sip_clusters)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "name": self.name, "error": self.error, "nodes": list(self.nodes),
                "sip_clusters": list(self.sip_clusters)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Unknown":
        return cls(UnknownKind(data["kind"]), data["name"], data.get("error", ""), tuple(data.get("nodes", ())),
                   tuple(data.get("sip_clusters", ())))


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    #: things worth knowing that the plan chose not to do (pruning disabled, deferred nodes...)
    warnings: tuple[str, ...] = ()
    #: source commit the plan was made from, when known
    source: str = ""
    counts: dict[str, int] = field(default_factory=dict, compare=False)
    #: what could not be observed (unreachable hypervisors...): the plan is incomplete
    unknowns: tuple[Unknown, ...] = ()

    @property
    def empty(self) -> bool:
        """No actions (which says nothing about what could not be checked: see `complete`)."""
        return not self.actions

    @property
    def complete(self) -> bool:
        """Everything the plan depends on was observed."""
        return not self.unknowns

    @property
    def prunes(self) -> list[Action]:
        return [a for a in self.actions if a.prune and a.kind == Kind.REMOVE_POD]

    def summary(self) -> dict[str, int]:
        by_symbol = Counter(a.symbol for a in self.actions)
        return {"add": by_symbol["+"], "change": by_symbol["~"], "remove": by_symbol["-"]}

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "summary": self.summary(),
            "actions": [a.to_dict() for a in self.actions],
            "warnings": list(self.warnings),
            "complete": self.complete,
            "unknown": [u.to_dict() for u in self.unknowns],
        }


def ordered(actions: list[Action]) -> tuple[Action, ...]:
    return tuple(sorted(actions, key=Action.sort_key))
