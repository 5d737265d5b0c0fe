"""Airship-SIP-style host selection: pure, deterministic, all or nothing per SIPCluster.

Labels (Airship SIP's keys, plus one gitops extension):

* ``sip.airshipit.org/cluster-name: <SIPCluster>`` -- the host belongs to that cluster;
* ``sip.airshipit.org/node-type: ControlPlane|Worker`` -- the role it fills;
* ``sip.airshipit.org/sip-scheduled: "true"`` -- taken (SIP's "not free" marker);
* ``sip.airshipit.org/standby: "true"`` -- gitops extension: a reserved standby host.
  Active hosts do not carry it, so consumers select active hosts with
  ``cluster-name=<c>, node-type=<role>, standby DoesNotExist``.

Inputs read from the host: ``sip.airshipit.org/rack`` (rack) and
``sip.airshipit.org/server`` (physical server, falling back to the BMH name).
Label selectors see the host's labels *without* the four managed keys above, so
an assignment never changes whether its host matches.

Eligibility of a host for a role of SIPCluster C:

* ``spec.online`` is true and ``status.operationalStatus`` is ``OK``;
* provisioning state in `FREE_STATES` (``available``, or ``ready`` of older
  Metal3) for a new assignment; a host C already holds in that role may also be
  ``provisioning``, ``provisioned`` or ``externally provisioned`` (`KEPT_STATES`).
  A provisioned host no SIPCluster holds runs something else and is never taken;
* not held by another SIPCluster of the repo, and not ``sip-scheduled`` without a
  cluster name (someone else's scheduling);
* matches the role's selector; for ``PerRack`` it has a rack label.

Spread is per role, as in SIP: ``PerRack`` = no two hosts of one role of one
SIPCluster in one rack; ``PerHost`` = no two on one server. ControlPlane and
Worker hosts of one cluster may share racks and servers (never a BMH).

Per role the hosts are ordered: hosts C keeps (its active ones, then its
standbys, each by host key; dropped when no longer eligible, no longer matching,
breaking the spread or beyond the wanted count), then new hosts sorted by
(rack, server, namespace/name). The first ``active`` are active, the rest
standby -- so a lost active host is replaced by promoting a standby and a new
host becomes the standby.

A SIPCluster with a role it cannot fill gets an ``InsufficientHosts`` condition
naming the role, the counts and why matching hosts were excluded, and *nothing*
changes for it: no host gets labeled, and hosts it already holds keep their
labels (a running cluster is not torn down because a spare is missing).
Hosts labeled for a SIPCluster no longer in the repo are unlabeled.

SIPClusters are processed one at a time by name, each seeing the assignments
made by earlier ones; passes repeat until nothing changes (a host released by a
later cluster can serve an earlier one), so applying a plan once converges:
planning again over the result yields no changes.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gitops.model.resources import BareMetalHost, SIPCluster, SIPRole

CLUSTER_LABEL = "sip.airshipit.org/cluster-name"
NODE_TYPE_LABEL = "sip.airshipit.org/node-type"
SCHEDULED_LABEL = "sip.airshipit.org/sip-scheduled"
STANDBY_LABEL = "sip.airshipit.org/standby"
RACK_LABEL = "sip.airshipit.org/rack"
SERVER_LABEL = "sip.airshipit.org/server"
#: the labels selection writes; everything else on a host is left alone
MANAGED_LABELS = (CLUSTER_LABEL, NODE_TYPE_LABEL, SCHEDULED_LABEL, STANDBY_LABEL)

CONTROL_PLANE = "ControlPlane"
WORKER = "Worker"
PER_RACK = "PerRack"
PER_HOST = "PerHost"

#: provisioning states in which a free host may be assigned
FREE_STATES = frozenset({"available", "ready"})
#: provisioning states in which a host keeps the assignment it already has
KEPT_STATES = FREE_STATES | {"provisioning", "provisioned", "externally provisioned"}

READY = "Ready"
INSUFFICIENT_HOSTS = "InsufficientHosts"

Labels = dict[str, str]


def host_key(host: BareMetalHost) -> str:
    """The identity of a host everywhere in this package: ``namespace/name``."""
    return f"{host.namespace}/{host.name}"


def rack_of(labels: Mapping[str, str]) -> str | None:
    return labels.get(RACK_LABEL) or None


def server_of(labels: Mapping[str, str], name: str) -> str:
    return labels.get(SERVER_LABEL) or name


def selector_view(labels: Mapping[str, str]) -> Labels:
    """What label selectors see: the host's labels without the managed ones."""
    return {k: v for k, v in labels.items() if k not in MANAGED_LABELS}


def health_problem(host: BareMetalHost) -> str | None:
    """Why the host is not healthy (offline, operationalStatus not OK), or None."""
    if not host.online:
        return "offline"
    if host.operational_status != "OK":
        return f"operationalStatus is {host.operational_status or 'unknown'!r}"
    return None


def state_problem(host: BareMetalHost, kept: bool) -> str | None:
    """Why the provisioning state rules the host out (`kept`: C already holds it), or None."""
    allowed = KEPT_STATES if kept else FREE_STATES
    if host.provisioning_state in allowed:
        return None
    return f"provisioning state is {host.provisioning_state or 'unknown'!r}"


@dataclass(frozen=True)
class Condition:
    """Kubernetes-style condition of type Ready for one SIPCluster."""

    reason: str  # READY | INSUFFICIENT_HOSTS
    message: str

    @property
    def ready(self) -> bool:
        return self.reason == READY


@dataclass(frozen=True)
class RoleSelection:
    role: str
    wanted_active: int
    wanted_standby: int
    spread: str
    active: tuple[str, ...] = ()  # host keys, in selection order
    standby: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.active + self.standby


@dataclass(frozen=True)
class Selection:
    """The hosts of one SIPCluster by role (as labeled after the plan) and its condition."""

    cluster: str
    roles: tuple[RoleSelection, ...]
    condition: Condition

    @property
    def ready(self) -> bool:
        return self.condition.ready

    def role(self, name: str) -> RoleSelection:
        for role in self.roles:
            if role.role == name:
                return role
        raise KeyError(name)


@dataclass(frozen=True)
class LabelChange:
    """Labels to set and remove on one host, with why."""

    host: str  # namespace/name
    cluster: str  # the SIPCluster the host now belongs to, else the one it left
    set: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()
    reason: str = ""

    def apply(self, labels: Mapping[str, str]) -> Labels:
        out = {k: v for k, v in labels.items() if k not in self.remove}
        out.update(self.set)
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class HostSelection:
    """Which hosts each SIPCluster gets, and the label changes that make it so."""

    selections: tuple[Selection, ...] = ()  # by cluster name
    changes: tuple[LabelChange, ...] = ()  # by host key

    @property
    def empty(self) -> bool:
        return not self.changes

    def selection(self, cluster: str) -> Selection:
        for sel in self.selections:
            if sel.cluster == cluster:
                return sel
        raise KeyError(cluster)

    def relabeled(self, hosts: Iterable[BareMetalHost]) -> list[BareMetalHost]:
        """`hosts` as they will be once this selection's label changes are made."""
        changes = {c.host: c for c in self.changes}
        out = []
        for host in hosts:
            change = changes.get(f"{host.namespace}/{host.name}")
            out.append(dataclasses.replace(host, labels=change.apply(host.labels)) if change else host)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for `gitops plan -o json` and the status branch)."""
        return {
            "selections": [{
                "cluster": s.cluster,
                "ready": s.ready,
                "reason": s.condition.reason,
                "message": s.condition.message,
                "roles": {r.role: {"active": list(r.active), "standby": list(r.standby)} for r in s.roles},
            } for s in self.selections],
            "changes": [{"host": c.host, "cluster": c.cluster, "set": dict(c.set), "remove": list(c.remove),
                         "reason": c.reason} for c in self.changes],
        }


# --------------------------------------------------------------------------- planning


def select_hosts(clusters: Mapping[str, SIPCluster], hosts: Iterable[BareMetalHost]) -> HostSelection:
    """Selections and label changes for every SIPCluster over `hosts` (pure, deterministic)."""
    by_key = {host_key(h): h for h in sorted(hosts, key=host_key)}
    original = {k: dict(h.labels) for k, h in by_key.items()}
    labels = {k: dict(v) for k, v in original.items()}
    reasons: dict[str, list[str]] = {}
    selections: tuple[Selection, ...] = ()
    for _ in range(len(clusters) + 2):  # converges in a pass or two; the bound only guards
        selections, changed = _one_pass(clusters, by_key, labels, reasons)
        if not changed:
            break
    changes = []
    for key in by_key:
        before, after = original[key], labels[key]
        if before == after:
            continue
        owner = after.get(CLUSTER_LABEL) or before.get(CLUSTER_LABEL, "")
        changes.append(LabelChange(
            host=key,
            cluster=owner,
            set=tuple(sorted((k, v) for k, v in after.items() if before.get(k) != v)),
            remove=tuple(sorted(k for k in before if k not in after)),
            reason="; ".join(dict.fromkeys(reasons.get(key, ()))),
        ))
    return HostSelection(selections=selections, changes=tuple(changes))


def _one_pass(clusters: Mapping[str, SIPCluster], hosts: dict[str, BareMetalHost],
              labels: dict[str, Labels], reasons: dict[str, list[str]]) -> tuple[tuple[Selection, ...], bool]:
    changed = False
    for key in hosts:
        owner = labels[key].get(CLUSTER_LABEL)
        if owner and owner not in clusters:
            changed |= _write(labels, reasons, key, {}, f"SIPCluster {owner} is no longer in the repo")
    selections = []
    for name in sorted(clusters):
        sel, touched = _Scheduler(clusters[name], clusters, hosts, labels, reasons).run()
        selections.append(sel)
        changed |= touched
    return tuple(selections), changed


def _write(labels: dict[str, Labels], reasons: dict[str, list[str]], key: str,
           managed: Mapping[str, str], reason: str) -> bool:
    """Replace the managed labels of host `key` by `managed`; True when that changed anything."""
    new = {k: v for k, v in labels[key].items() if k not in MANAGED_LABELS}
    new.update(managed)
    new = dict(sorted(new.items()))
    if new == labels[key]:
        return False
    labels[key] = new
    reasons.setdefault(key, []).append(reason)
    return True


@dataclass
class _Role:
    name: str
    spec: SIPRole
    picked: list[str] = field(default_factory=list)
    racks: set[str] = field(default_factory=set)
    servers: set[str] = field(default_factory=set)
    why_not: dict[str, str] = field(default_factory=dict)  # matching host -> reason excluded

    @property
    def wanted(self) -> int:
        return self.spec.active + self.spec.standby

    def spread_problem(self, labels: Mapping[str, str], name: str) -> str | None:
        if self.spec.spread == PER_RACK:
            rack = rack_of(labels)
            if rack is None:
                return f"no {RACK_LABEL} label (PerRack)"
            if rack in self.racks:
                return f"rack {rack} already has a {self.name} host"
        elif server_of(labels, name) in self.servers:
            return f"server {server_of(labels, name)} already has a {self.name} host"
        return None

    def take(self, key: str, labels: Mapping[str, str], name: str) -> None:
        self.picked.append(key)
        self.why_not.pop(key, None)
        rack = rack_of(labels)
        if rack is not None:
            self.racks.add(rack)
        self.servers.add(server_of(labels, name))


class _Scheduler:
    """One SIPCluster in one pass: keep, fill, then label all or nothing."""

    def __init__(self, cluster: SIPCluster, clusters: Mapping[str, SIPCluster],
                 hosts: dict[str, BareMetalHost], labels: dict[str, Labels], reasons: dict[str, list[str]]):
        self.cluster = cluster
        self.clusters = clusters
        self.hosts = hosts
        self.labels = labels
        self.reasons = reasons
        self.roles = [_Role(name, spec) for name, spec in sorted(cluster.roles.items())]
        self.taken: set[str] = set()
        self.release: dict[str, str] = {}  # held host -> why it is let go

    def run(self) -> tuple[Selection, bool]:
        held = sorted(k for k in self.hosts if self.labels[k].get(CLUSTER_LABEL) == self.cluster.name)
        for role in self.roles:
            self._keep(role, held)
        for key in held:
            if key not in self.taken and key not in self.release:
                node_type = self.labels[key].get(NODE_TYPE_LABEL, "")
                self.release[key] = f"role {node_type or '(none)'} is not in the SIPCluster"
        for role in self.roles:
            self._fill(role)
        short = [r for r in self.roles if len(r.picked) < r.wanted]
        if short:
            return self._current(held, Condition(INSUFFICIENT_HOSTS, "; ".join(self._shortage(r) for r in short))), False
        return self._label(held)

    # -- keep and fill

    def _keep(self, role: _Role, held: list[str]) -> None:
        mine = [k for k in held if self.labels[k].get(NODE_TYPE_LABEL) == role.name]
        mine.sort(key=lambda k: (STANDBY_LABEL in self.labels[k], k))  # actives first
        for key in mine:
            host, labels = self.hosts[key], self.labels[key]
            why = (health_problem(host) or state_problem(host, kept=True)
                   or (None if role.spec.selector.matches(selector_view(labels)) else "no longer matches the selector")
                   or role.spread_problem(labels, host.name)
                   or (f"{role.name} wants only {role.wanted}" if len(role.picked) >= role.wanted else None))
            if why:
                self.release[key] = why
            else:
                role.take(key, labels, host.name)
                self.taken.add(key)

    def _fill(self, role: _Role) -> None:
        if len(role.picked) >= role.wanted:
            return
        candidates = [k for k in self.hosts
                      if k not in role.picked and role.spec.selector.matches(selector_view(self.labels[k]))]
        candidates.sort(key=lambda k: (rack_of(self.labels[k]) or "", server_of(self.labels[k], self.hosts[k].name), k))
        for key in candidates:
            why = self._fill_problem(role, key)
            if why:
                role.why_not.setdefault(key, why)
            elif len(role.picked) < role.wanted:
                role.take(key, self.labels[key], self.hosts[key].name)
                self.taken.add(key)

    def _fill_problem(self, role: _Role, key: str) -> str | None:
        host, labels = self.hosts[key], self.labels[key]
        owner = labels.get(CLUSTER_LABEL)
        if key in self.taken:
            other = next(r.name for r in self.roles if key in r.picked)
            return f"already a {other} host of {self.cluster.name}"
        if owner and owner != self.cluster.name and owner in self.clusters:
            return f"assigned to SIPCluster {owner}"
        if not owner and labels.get(SCHEDULED_LABEL) == "true":
            return f"{SCHEDULED_LABEL} is set without a cluster name"
        return health_problem(host) or state_problem(host, kept=False) or role.spread_problem(labels, host.name)

    # -- outcome

    def _shortage(self, role: _Role) -> str:
        matching = sorted(role.why_not)
        missing = role.wanted - len(role.picked)
        text = (f"{role.name} needs {role.wanted} hosts ({role.spec.active} active + {role.spec.standby} standby, "
                f"{role.spec.spread}) but only {len(role.picked)} are usable, {missing} missing")
        if matching:
            text += "; excluded: " + ", ".join(f"{k} ({role.why_not[k]})" for k in matching)
        else:
            text += "; no other host matches the selector"
        return text

    def _current(self, held: list[str], condition: Condition) -> Selection:
        """The selection as labeled now (a short cluster changes nothing)."""
        roles = []
        for role in self.roles:
            mine = [k for k in held if self.labels[k].get(NODE_TYPE_LABEL) == role.name]
            roles.append(RoleSelection(
                role.name, role.spec.active, role.spec.standby, role.spec.spread,
                active=tuple(k for k in mine if STANDBY_LABEL not in self.labels[k]),
                standby=tuple(k for k in mine if STANDBY_LABEL in self.labels[k]),
            ))
        return Selection(self.cluster.name, tuple(roles), condition)

    def _label(self, held: list[str]) -> tuple[Selection, bool]:
        name = self.cluster.name
        changed = False
        for key, why in sorted(self.release.items()):
            if key not in self.taken:
                role = self.labels[key].get(NODE_TYPE_LABEL) or "host"
                changed |= _write(self.labels, self.reasons, key, {}, f"{name}/{role}: released: {why}")
        roles = []
        for role in self.roles:
            active, standby = role.picked[:role.spec.active], role.picked[role.spec.active:]
            for key in role.picked:
                is_standby = key in standby
                managed = {CLUSTER_LABEL: name, NODE_TYPE_LABEL: role.name, SCHEDULED_LABEL: "true"}
                if is_standby:
                    managed[STANDBY_LABEL] = "true"
                changed |= _write(self.labels, self.reasons, key, managed,
                                  f"{name}/{role.name}: {self._verb(key, held, role.name, is_standby)}")
            roles.append(RoleSelection(role.name, role.spec.active, role.spec.standby, role.spec.spread,
                                       tuple(active), tuple(standby)))
        message = ", ".join(f"{r.role} {len(r.active)} active + {len(r.standby)} standby" for r in roles)
        return Selection(name, tuple(roles), Condition(READY, message)), changed

    def _verb(self, key: str, held: list[str], role: str, standby: bool) -> str:
        labels = self.labels[key]
        if key not in held:
            return "selected as standby" if standby else "selected as active"
        if labels.get(NODE_TYPE_LABEL) != role:
            return f"moved from {labels.get(NODE_TYPE_LABEL) or '(none)'} to {role}" + (" standby" if standby else "")
        was_standby = STANDBY_LABEL in labels
        if was_standby and not standby:
            return "standby promoted to active"
        if standby and not was_standby:
            return "active moved to standby"
        return "labels repaired"
