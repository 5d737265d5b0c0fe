"""The recorded-state dataclasses and their deterministic (sorted) JSON form."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SCHEMA_VERSION = 1


@dataclass
class CertRecord:
    """A certificate (PEM) and, for authorities the controller holds, its key."""

    cert_pem: str
    key_pem: str = ""

    def copy(self) -> CertRecord:
        return CertRecord(self.cert_pem, self.key_pem)


#: the phases of a CA rotation, in order (see `gitops.compile.authorities`)
TRUST_BOTH, RE_ISSUE, DROP_OLD = "trust-both", "re-issue", "drop-old"
ROTATION_PHASES = (TRUST_BOTH, RE_ISSUE, DROP_OLD)


@dataclass
class CARotation:
    """A CA rotation under way: the generation it rotates to and the phase it is in.

    trust-both: `other` holds the new authorities (trusted, not signing yet); re-issue: the new ones
    sign and `other` holds the old ones (still trusted); drop-old: `other` and `cross` are empty.
    `cross` (made with the new authorities): their certificates signed by the old ones, served after
    each server certificate re-issued in re-issue, so a client that still trusts only the old CA
    verifies it.
    """

    generation: int
    phase: str = TRUST_BOTH
    other: dict[str, CertRecord] = field(default_factory=dict)
    cross: dict[str, str] = field(default_factory=dict)

    def copy(self) -> CARotation:
        return CARotation(self.generation, self.phase, {r: c.copy() for r, c in self.other.items()}, dict(self.cross))

    @property
    def number(self) -> int:
        """1, 2 or 3."""
        return ROTATION_PHASES.index(self.phase) + 1


@dataclass
class ClusterRecord:
    #: authorities by role: "cluster", "etcd", "front-proxy"
    authorities: dict[str, CertRecord] = field(default_factory=dict)
    #: the admin client certificate (O=system:masters), kept for kubeconfigs
    admin: CertRecord | None = None
    #: public keys (PEM) of each node's service-account signing key, by node
    service_account_keys: dict[str, str] = field(default_factory=dict)
    #: etcd members in the order they joined (node names)
    etcd_members: list[str] = field(default_factory=list)
    #: members added as learners and not promoted yet (a run stopped in between: the next one promotes)
    etcd_learners: list[str] = field(default_factory=list)
    #: public keys of removed or replaced nodes: still trusted, so the tokens they signed stay valid
    retired_service_account_keys: list[str] = field(default_factory=list)
    #: the CA generation the authorities belong to (spec.certificates.caGeneration once rotated to)
    ca_generation: int = 1
    #: a CA rotation under way, None otherwise
    rotation: CARotation | None = None
    #: the spec.restore.snapshot value last restored ("" for none): each value is restored once
    restored: str = ""
    #: the spec.recovery.forceNewClusterFrom value last forced ("" for none): each value forces once
    recovered: str = ""
    #: the member a planned --force-new-cluster rebuilds etcd from, until it ran ("" for none)
    forcing: str = ""
    #: the virtual IP its ingress nodes share ("" with fewer than two ingress nodes; gitops.compile.vip)
    virtual_ip: str = ""
    #: that address's VRRP router id (1-255, unique in the fleet; 0 without a virtual IP)
    vrrp_id: int = 0
    #: the commit whose plan last changed the cluster: the one it runs ("" before any; with waves, clusters of
    #: one fleet may run different commits). Not part of what the cluster is compiled from (no repr).
    commit: str = field(default="", repr=False)

    def copy(self) -> ClusterRecord:
        """A deep copy (new records, dicts and lists; the strings are shared)."""
        return ClusterRecord(
            authorities={role: rec.copy() for role, rec in self.authorities.items()},
            admin=self.admin.copy() if self.admin is not None else None,
            service_account_keys=dict(self.service_account_keys),
            etcd_members=list(self.etcd_members),
            etcd_learners=list(self.etcd_learners),
            retired_service_account_keys=list(self.retired_service_account_keys),
            ca_generation=self.ca_generation,
            rotation=self.rotation.copy() if self.rotation is not None else None,
            restored=self.restored,
            recovered=self.recovered,
            forcing=self.forcing,
            virtual_ip=self.virtual_ip,
            vrrp_id=self.vrrp_id,
            commit=self.commit,
        )

    def restore_pending(self, snapshot: str | None) -> bool:
        """Whether spec.restore.snapshot `snapshot` asks for a restore: set, not restored yet, and the
        cluster has etcd members to restore (a new cluster bootstraps first, then restores)."""
        return bool(snapshot) and bool(self.etcd_members) and snapshot != self.restored

    def next_phase(self) -> ClusterRecord:
        """This record one CA-rotation phase further (a plan's `advance-ca-rotation`, once the phase's
        actions ran): the new CAs start signing, then the old ones stop being trusted, then the rotation
        ends at its generation. Deterministic: the cross-signed certificates were made with the new CAs."""
        rotation = self.rotation
        if rotation is None:
            raise ValueError("no CA rotation under way")
        out = self.copy()
        if rotation.phase == TRUST_BOTH:
            out.authorities = {role: rec.copy() for role, rec in sorted(rotation.other.items())}
            out.rotation = CARotation(rotation.generation, RE_ISSUE,
                                      {role: rec.copy() for role, rec in sorted(self.authorities.items())},
                                      dict(rotation.cross))
        elif rotation.phase == RE_ISSUE:
            out.rotation = CARotation(rotation.generation, DROP_OLD)
        else:
            out.rotation = None
            out.ca_generation = rotation.generation
        return out

    def trust_bundle(self, role: str) -> str:
        """What everything that verifies `role`'s certificates trusts: its authority and, while a
        rotation holds another one, that one too (sorted PEMs: the same bundle whichever signs)."""
        pems = {self.authorities[role].cert_pem}
        if self.rotation is not None and role in self.rotation.other:
            pems.add(self.rotation.other[role].cert_pem)
        return "".join(sorted(pems))

    def chain(self, role: str) -> str:
        """What follows a server certificate `role` signs: the cross-signed authority while re-issuing."""
        if self.rotation is None or self.rotation.phase != RE_ISSUE:
            return ""
        return self.rotation.cross.get(role, "")

    def set_service_account_key(self, node: str, public_pem: str) -> None:
        """Record `node`'s key; a different key it had before is retired, not forgotten."""
        if self.service_account_keys.get(node) != public_pem:
            self.retire_service_account_key(node)
            self.service_account_keys[node] = public_pem

    def retire_service_account_key(self, node: str) -> None:
        old = self.service_account_keys.pop(node, None)
        if old and old not in self.retired_service_account_keys:
            self.retired_service_account_keys = sorted([*self.retired_service_account_keys, old])

    def trusted_service_account_keys(self) -> list[str]:
        """The bundle every API server verifies tokens with: every recorded node key and the retired
        ones, sorted (so a key moving from a removed node to the retired list changes nothing, and a
        node on its way out is trusted the same before and after it goes)."""
        return sorted(set(self.service_account_keys.values()) | set(self.retired_service_account_keys))


@dataclass
class NodeRecord:
    cluster: str
    hypervisor: str
    #: allocated host ports by purpose, e.g. {"etcd-client": 31000}
    ports: dict[str, int] = field(default_factory=dict)
    #: etcd bootstrap flags, frozen when the node first joins (etcd ignores them afterwards)
    etcd_initial_cluster: str = ""
    etcd_initial_state: str = ""
    #: the hypervisor its etcd member still votes from (or voted from, when lost) while the node moves, until
    #: its member votes from `hypervisor` ("" when not moving)
    moved_from: str = ""
    #: a move off a live hypervisor is learner-first: the old member (on `leaving_from`, at `leaving_peer`)
    #: stays until the new one votes, then is removed ("" otherwise). A move off a lost one removes first.
    leaving_from: str = ""
    leaving_peer: str = ""
    #: the old pod's host ports on `leaving_from` while it runs there: no other node is given them
    leaving_ports: dict[str, int] = field(default_factory=dict)

    def copy(self) -> NodeRecord:
        return NodeRecord(self.cluster, self.hypervisor, dict(self.ports), self.etcd_initial_cluster,
                          self.etcd_initial_state, self.moved_from, self.leaving_from, self.leaving_peer,
                          dict(self.leaving_ports))


@dataclass
class WaveRecord:
    """One rollout wave of a commit as apply left it (`gitops.apply.waves`)."""

    name: str
    #: Rolling (started, not yet soaked), Soaked, or Halted
    phase: str
    started: str = ""
    ended: str = ""
    #: per cluster: what the wave measured (requests, failed, success_ratio, workers_ready_before, ...)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the cluster and measurement that halted it, against its threshold ("" when none)
    breach: str = ""
    breached_cluster: str = ""

    def copy(self) -> WaveRecord:
        return WaveRecord(self.name, self.phase, self.started, self.ended,
                          {c: dict(f) for c, f in self.figures.items()}, self.breach, self.breached_cluster)


@dataclass
class RolloutRecord:
    """The rollout of `commit` through spec.rollout.waves: each wave started so far, in order."""

    commit: str
    waves: list[WaveRecord] = field(default_factory=list)

    def copy(self) -> RolloutRecord:
        return RolloutRecord(self.commit, [w.copy() for w in self.waves])

    def wave(self, name: str) -> WaveRecord | None:
        return next((w for w in self.waves if w.name == name), None)

    @property
    def halted(self) -> WaveRecord | None:
        return next((w for w in self.waves if w.phase == HALTED), None)


#: WaveRecord.phase values
ROLLING, SOAKED, HALTED = "Rolling", "Soaked", "Halted"


@dataclass
class State:
    clusters: dict[str, ClusterRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    #: labels gitops set on file-provider BareMetalHosts ("namespace/name" -> label -> value, None = removed)
    sip_labels: dict[str, dict[str, str | None]] = field(default_factory=dict)
    #: the fleet's hypervisor CA (`gitops hypervisor`): signs each onboarded machine's CRI front certificate
    #: and gitops's client certificate for it; None until the first `gitops hypervisor` command makes it
    hypervisor_ca: CertRecord | None = None
    #: the last rollout through spec.rollout.waves (None: none yet)
    rollout: RolloutRecord | None = None

    def copy(self) -> State:
        """A deep copy, field by field (deepcopy's bookkeeping costs seconds for a large fleet)."""
        return State(
            clusters={name: record.copy() for name, record in self.clusters.items()},
            nodes={name: record.copy() for name, record in self.nodes.items()},
            sip_labels={host: dict(labels) for host, labels in self.sip_labels.items()},
            hypervisor_ca=self.hypervisor_ca.copy() if self.hypervisor_ca else None,
            rollout=self.rollout.copy() if self.rollout else None,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = SCHEMA_VERSION
        if data["hypervisor_ca"] is None:
            del data["hypervisor_ca"]  # (none made: state files stay as they were before it existed)
        if data["rollout"] is None:
            del data["rollout"]  # (no waves yet: as above)
        for record in data["clusters"].values():
            for name in ("restored", "recovered", "forcing", "virtual_ip", "vrrp_id", "commit"):
                if not record[name]:
                    del record[name]  # (never done: state files written before these fields stay as they were)
        for record in data["nodes"].values():
            for name in ("moved_from", "leaving_from", "leaving_peer", "leaving_ports"):
                if not record[name]:
                    del record[name]  # (not moving: as above)
        return _sorted(data)

    @classmethod
    def parse(cls, data: Any) -> "State":
        """The state of JSON read from a file: checked against `STATE_SCHEMA` first, so a value of the
        wrong shape is a `ValueError` naming its field (about 0.6 s for a thousand clusters)."""
        error = best_match(_VALIDATOR.iter_errors(data))
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or "the top level"
            raise ValueError(f"at {where}: {error.message[:200]}")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "State":
        """The state of its JSON form, as `to_dict` wrote it (unchecked: `parse` checks)."""
        clusters = {}
        for name, raw in data.get("clusters", {}).items():
            clusters[name] = ClusterRecord(
                authorities={k: CertRecord(**v) for k, v in raw.get("authorities", {}).items()},
                admin=CertRecord(**raw["admin"]) if raw.get("admin") else None,
                service_account_keys=dict(raw.get("service_account_keys", {})),
                etcd_members=list(raw.get("etcd_members", [])),
                etcd_learners=list(raw.get("etcd_learners", [])),
                retired_service_account_keys=list(raw.get("retired_service_account_keys", [])),
                ca_generation=int(raw.get("ca_generation", 1)),
                rotation=_rotation(raw.get("rotation")),
                restored=str(raw.get("restored", "")),
                recovered=str(raw.get("recovered", "")),
                forcing=str(raw.get("forcing", "")),
                virtual_ip=str(raw.get("virtual_ip", "")),
                vrrp_id=int(raw.get("vrrp_id", 0)),
                commit=str(raw.get("commit", "")),
            )
        nodes = {name: NodeRecord(**raw) for name, raw in data.get("nodes", {}).items()}
        sip_labels = {host: dict(labels) for host, labels in data.get("sip_labels", {}).items()}
        ca = data.get("hypervisor_ca")
        rollout = data.get("rollout")
        return cls(clusters=clusters, nodes=nodes, sip_labels=sip_labels,
                   hypervisor_ca=CertRecord(**ca) if ca else None,
                   rollout=RolloutRecord(rollout["commit"], [WaveRecord(**w) for w in rollout.get("waves", ())])
                   if rollout else None)


def _rotation(raw: dict[str, Any] | None) -> CARotation | None:
    if not raw:
        return None
    if raw.get("phase") not in ROTATION_PHASES:
        raise ValueError(f"unknown CA rotation phase {raw.get('phase')!r}")
    return CARotation(int(raw["generation"]), raw["phase"], {k: CertRecord(**v) for k, v in raw.get("other", {}).items()},
                      dict(raw.get("cross", {})))


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _map(values: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": values}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_CERT = {"type": "object", "required": ["cert_pem"], "additionalProperties": False,
         "properties": {"cert_pem": _STR, "key_pem": _STR}}
#: the shape `State.from_dict` reads (older files may lack fields; unknown ones are ignored where it can)
STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "version": _INT,
        "clusters": _map({"type": "object", "properties": {
            "authorities": _map(_CERT),
            "admin": {"anyOf": [{"type": "null"}, _CERT]},
            "service_account_keys": _map(_STR),
            "etcd_members": {"type": "array", "items": _STR},
            "etcd_learners": {"type": "array", "items": _STR},
            "retired_service_account_keys": {"type": "array", "items": _STR},
            "ca_generation": _INT,
            "restored": _STR,
            "recovered": _STR,
            "forcing": _STR,
            "virtual_ip": _STR,
            "vrrp_id": {"type": "integer", "minimum": 0, "maximum": 255},
            "commit": _STR,
            "rotation": {"anyOf": [{"type": "null"}, {
                "type": "object", "required": ["generation", "phase"],
                "properties": {"generation": _INT, "phase": {"enum": list(ROTATION_PHASES)},
                               "other": _map(_CERT), "cross": _map(_STR)}}]},
        }}),
        "nodes": _map({"type": "object", "required": ["cluster", "hypervisor"], "additionalProperties": False,
                       "properties": {"cluster": _STR, "hypervisor": _STR, "ports": _map(_INT),
                                      "etcd_initial_cluster": _STR, "etcd_initial_state": _STR,
                                      "moved_from": _STR, "leaving_from": _STR, "leaving_peer": _STR,
                                      "leaving_ports": _map(_INT)}}),
        "sip_labels": _map(_map({"type": ["string", "null"]})),
        "hypervisor_ca": {"anyOf": [{"type": "null"}, _CERT]},
        "rollout": {"anyOf": [{"type": "null"}, {
            "type": "object", "required": ["commit"], "additionalProperties": False,
            "properties": {"commit": _STR, "waves": {"type": "array", "items": {
                "type": "object", "required": ["name", "phase"], "additionalProperties": False,
                "properties": {"name": _STR, "phase": {"enum": ["Rolling", "Soaked", "Halted"]}, "started": _STR,
                               "ended": _STR, "breach": _STR, "breached_cluster": _STR,
                               "figures": _map(_map({"type": ["number", "string", "boolean"]}))}}}}}]},
    },
}
_VALIDATOR = Draft202012Validator(STATE_SCHEMA)
