"""The plan: an ordered list of typed actions, each with a human reason (the data; `gitops.plan.rollout`
decides the anchors, steps and gates that place them)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from gitops.nodefiles import AFTER_APPLY
from gitops.plan import payloads
from gitops.plan.payloads import Payload, payload_from_dict, payload_to_dict


class Kind(str, Enum):
    BACKUP_ETCD = "backup-etcd"
    RECOVER_ETCD = "recover-etcd"
    ETCD_MEMBER_REMOVE = "etcd-member-remove"
    REMOVE_CONTAINER = "remove-container"
    REMOVE_POD = "remove-pod"
    CREATE_POD = "create-pod"
    GENERATE_KEYS = "generate-keys"
    WRITE_FILES = "write-files"
    RESTORE_ETCD = "restore-etcd"
    ETCD_MEMBER_ADD = "etcd-member-add"
    ETCD_MEMBER_PROMOTE = "etcd-member-promote"
    CREATE_CONTAINER = "create-container"
    RECREATE_CONTAINER = "recreate-container"
    RELOAD_CONTAINER = "reload-container"
    LABEL_HOST = "label-host"
    DEFRAGMENT_ETCD = "defragment-etcd"
    DISARM_ETCD_ALARM = "disarm-etcd-alarm"
    CREATE_OBJECT = "create-object"
    UPDATE_OBJECT = "update-object"
    SIGN_CERTIFICATE_REQUEST = "sign-certificate-request"
    ADVANCE_CA_ROTATION = "advance-ca-rotation"
    START_WAVE = "start-wave"
    SOAK_WAVE = "soak-wave"


@dataclass(frozen=True)
class KindInfo:
    """Everything of a kind the plan knows, in one place: its order, its look in plans, its payload type.
    (Its apply handler is `gitops.apply.handlers.HANDLERS[kind]`; `tests/test_plan_contract.py` keeps both
    complete.)"""

    #: execution order; within phase 6 a node's etcd member add (as a learner) comes right before
    #: its containers and its promotion right after its etcd container, so members join one at a time
    phase: int
    symbol: str  # + ~ -
    verb: str
    #: what apply executes (`gitops.plan.payloads`): an action of this kind carries exactly this type
    payload: type
    #: what a plan line of an action with no node names as its place
    about: str = "recorded state"


KINDS: dict[Kind, KindInfo] = {
    # before anything of the plan changes a cluster's etcd membership, a CA or its version (spec.backup)
    Kind.BACKUP_ETCD: KindInfo(-1, "+", "back up etcd", payloads.BackupEtcd, about="etcd"),
    # a cluster whose etcd lost its quorum for good: rebuilt from its survivor first (spec.recovery)
    Kind.RECOVER_ETCD: KindInfo(0, "~", "rebuild etcd", payloads.RecoverEtcd),
    # etcd upkeep, on a cluster whose etcd the plan leaves alone, before anything else of it (a component
    # that exited while etcd was out of space starts again after): members one at a time, then the alarm
    Kind.DEFRAGMENT_ETCD: KindInfo(0, "~", "defragment etcd", payloads.EtcdHealth),
    Kind.DISARM_ETCD_ALARM: KindInfo(0, "~", "clear etcd alarm", payloads.EtcdAlarm),
    Kind.ETCD_MEMBER_REMOVE: KindInfo(0, "-", "remove etcd member", payloads.EtcdMemberChange),
    Kind.REMOVE_CONTAINER: KindInfo(1, "-", "remove container", payloads.Remove),
    Kind.REMOVE_POD: KindInfo(2, "-", "remove pod", payloads.Remove),
    Kind.CREATE_POD: KindInfo(3, "+", "create pod", payloads.CreatePod),
    Kind.GENERATE_KEYS: KindInfo(4, "+", "generate keys", payloads.GenerateKeys),
    Kind.WRITE_FILES: KindInfo(5, "~", "write files", payloads.WriteFiles),
    # a cluster's restore (spec.restore): its control plane stopped, every member's data directory
    # rewritten from a snapshot; its containers start again in phase 6
    Kind.RESTORE_ETCD: KindInfo(5, "~", "restore etcd", payloads.RestoreEtcd, about="etcd"),
    Kind.ETCD_MEMBER_ADD: KindInfo(6, "+", "add etcd member", payloads.EtcdMemberChange),
    Kind.ETCD_MEMBER_PROMOTE: KindInfo(6, "~", "promote etcd member", payloads.EtcdMemberChange),
    Kind.CREATE_CONTAINER: KindInfo(6, "+", "create container", payloads.CreateContainer),
    Kind.RECREATE_CONTAINER: KindInfo(6, "~", "recreate container", payloads.CreateContainer),
    # a component that takes new files in place (keepalived: SIGHUP), after every file is written and before
    # the cluster's containers start (`Action.sort_key`)
    Kind.RELOAD_CONTAINER: KindInfo(6, "~", "reload container", payloads.Reload),
    Kind.LABEL_HOST: KindInfo(7, "~", "label host", payloads.LabelHost),
    # inside each cluster's own API, once its control plane runs
    Kind.CREATE_OBJECT: KindInfo(8, "+", "create object", payloads.PutObject),
    Kind.UPDATE_OBJECT: KindInfo(8, "~", "update object", payloads.PutObject),
    Kind.SIGN_CERTIFICATE_REQUEST: KindInfo(9, "+", "sign certificate request", payloads.SignRequest),
    # the recorded state only, once every action of the cluster's CA rotation phase ran
    Kind.ADVANCE_CA_ROTATION: KindInfo(10, "~", "record CA rotation phase", payloads.RotationStep),
    # a rollout wave (spec.rollout.waves): watched from before its first action to the end of its soak, which
    # halts the rollout on a breach (`gitops.plan.waves`); they change nothing, so count in no summary
    Kind.START_WAVE: KindInfo(-2, "=", "start wave", payloads.WaveGate, about="rollout"),
    Kind.SOAK_WAVE: KindInfo(11, "=", "soak wave", payloads.WaveGate, about="rollout"),
}


@dataclass(frozen=True)
class Action:
    kind: Kind
    hypervisor: str
    cluster: str
    node: str
    component: str = ""
    #: for people: why the action is needed
    reason: str = ""
    #: for people: what changes (fields, files; `(known after apply)` where it depends on earlier actions)
    details: tuple[str, ...] = ()
    #: the sandbox or container this action removes or replaces
    target_id: str = ""
    #: removal of an object whose resource left the repo (counts against maxDeletes)
    prune: bool = False
    #: position of the component in its pod, for ordering
    order: int = 0
    #: the node's action this one is ordered against (sorted as if of that kind, `step` -1 right before
    #: it, +1 right after it): an API server talks only to its own node's member, so it stops (leaving
    #: the ingress) right before that member's removal or recreate (at `order`) and starts right after;
    #: a pod's files agent (re)starts right after where its pod is created, before its keys and files.
    anchor: Kind | None = None
    step: int = 0
    #: its rollout wave (1 the first of spec.rollout.waves; 0: none, before them all) and its batch of
    #: maxConcurrent clusters within the wave: the plan runs wave by wave, batch by batch (`gitops.plan.waves`)
    wave: int = 0
    batch: int = 0
    #: what apply executes (see `gitops.plan.payloads`)
    payload: Payload | None = field(default=None, compare=False)

    @property
    def info(self) -> KindInfo:
        return KINDS[self.kind]

    @property
    def symbol(self) -> str:
        return KINDS[self.kind].symbol

    @property
    def subject(self) -> str:
        return "/".join(p for p in (self.cluster, self.node, self.component) if p)

    def sort_key(self) -> tuple:
        """Where the action goes in the plan, from its own fields only (`gitops.plan.rollout.ordered`): wave
        by wave and batch by batch (`gitops.plan.waves`), then as `_in_batch`."""
        return (self.wave, self.batch, *self._in_batch())

    def _in_batch(self) -> tuple:
        kind = self.anchor or self.kind
        phase = KINDS[kind].phase
        if kind == Kind.RECREATE_CONTAINER:
            # running components change in the supported order, after the cluster's new containers:
            # every etcd member (one at a time, its node's API server stopped around it), then the
            # API servers, controller-managers, schedulers
            return (phase, self.cluster, 1, f"{self.order:04d}", self.node, 1 + self.step, self.kind.value,
                    self.component, self.target_id)
        if kind == Kind.RELOAD_CONTAINER:
            # before the cluster's new containers: a moved ingress node's new keepalived starts once its peers
            # speak to it (else it takes the virtual IP too, and traffic follows it mid-request)
            return (phase, self.cluster, -2, self.node, f"{self.order:04d}", self.kind.value, self.component,
                    self.target_id)
        if kind in (Kind.DEFRAGMENT_ETCD, Kind.DISARM_ETCD_ALARM):  # in the order upkeep chose (the leader last)
            return (phase, self.cluster, -1, f"{self.order:04d}", self.node, self.kind.value)
        sub = 0 if kind == Kind.ETCD_MEMBER_ADD else 1
        return (phase, self.cluster, 0, self.node, f"{self.order:04d}", sub + self.step, self.kind.value,
                self.component, self.target_id)

    def to_dict(self, payload: bool = True) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "payload" and (f.name not in _ROLLOUT or getattr(self, f.name))}
        data["kind"] = self.kind.value
        data["anchor"] = self.anchor.value if self.anchor is not None else None
        data["details"] = list(self.details)
        if payload:
            data["payload"] = payload_to_dict(self.payload) if self.payload is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Action":
        raw = data.get("payload")
        return cls(Kind(data["kind"]), data["hypervisor"], data["cluster"], data["node"], data.get("component", ""),
                   data.get("reason", ""), tuple(data.get("details", ())), data.get("target_id", ""),
                   bool(data.get("prune", False)), int(data.get("order", 0)),
                   Kind(data["anchor"]) if data.get("anchor") else None, int(data.get("step", 0)),
                   int(data.get("wave", 0)), int(data.get("batch", 0)),
                   payload_from_dict(raw) if raw is not None else None)


#: fields a saved plan holds only when set (a plan without waves reads as before them)
_ROLLOUT = ("wave", "batch")


class UnknownKind(str, Enum):
    #: a Hypervisor that could not be observed (unreachable, or no longer in the repo)
    HYPERVISOR = "hypervisor"
    #: the BareMetalHost provider could not list the hosts
    BARE_METAL_HOSTS = "bare-metal-hosts"
    #: a cluster's API server runs but did not answer (its objects and certificate requests not checked)
    CLUSTER_API = "cluster-api"
    #: running pods whose files agent is not running: it starts again in the plan, their files are
    #: checked once it runs (known after apply)
    NODE_FILES = "node-files"


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
        if self.kind == UnknownKind.NODE_FILES:
            return (f"files of {', '.join(self.nodes)}: {AFTER_APPLY}: the files agent is not running; it starts "
                    "again in this plan and the files are checked once it runs (nothing is re-issued before)")
        if self.kind == UnknownKind.CLUSTER_API:
            return (f"the API of cluster {self.name} did not answer{why}; its worker bootstrap objects and "
                    "certificate requests were not checked")
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
    #: what could not be observed (unreachable hypervisors...): the plan is incomplete
    unknowns: tuple[Unknown, ...] = ()
    #: for people: multi-step operations under way (a CA rotation's phase now and the phases that follow)
    notes: tuple[str, ...] = ()
    #: clusters left out because they plan nothing again: inputs and observation as when their plan was
    #: last empty (`gitops.plan.converged`; only a cold `gitops plan` leaves any out)
    unchanged: tuple[str, ...] = ()

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

    def to_dict(self, payloads: bool = True) -> dict[str, Any]:
        return {
            "source": self.source,
            "summary": self.summary(),
            "actions": [a.to_dict(payloads) for a in self.actions],
            "warnings": list(self.warnings),
            "complete": self.complete,
            "unknown": [u.to_dict() for u in self.unknowns],
            "notes": list(self.notes),
            **({"unchanged": list(self.unchanged)} if self.unchanged else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        return cls(actions=tuple(Action.from_dict(a) for a in data.get("actions", ())),
                   warnings=tuple(data.get("warnings", ())), source=data.get("source", ""),
                   unknowns=tuple(Unknown.from_dict(u) for u in data.get("unknown", ())),
                   notes=tuple(data.get("notes", ())), unchanged=tuple(data.get("unchanged", ())))
