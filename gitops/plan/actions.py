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


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    #: things the plan could not check or chose not to do (unreachable hypervisors...)
    warnings: tuple[str, ...] = ()
    #: source commit the plan was made from, when known
    source: str = ""
    counts: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def empty(self) -> bool:
        return not self.actions

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
        }


def ordered(actions: list[Action]) -> tuple[Action, ...]:
    return tuple(sorted(actions, key=Action.sort_key))
