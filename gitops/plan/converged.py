"""What a cold plan may leave out: per cluster, what its last converged plan was made from (pure).

A reconcile whose plan has no warning, note or unknown from any cluster (SIPClusters' are planned every
time) records, for each cluster with no action of its own, a `Converged`: a digest of everything that cluster's part of a plan is made from
(its Cluster and Nodes, the Hypervisors its nodes are recorded on and whether they answered, the
public part of its recorded state, the settings a plan reads, the gitops code), the fingerprint of
its observed pods and API objects, and the first moment one of its certificates enters its renewal
window. A later plan made by a process that has nothing compiled yet (`gitops plan --against-status`
in a pull request) compares them with what it has: a cluster whose inputs and observation are the
same and whose renewal time has not come plans to nothing again, as it did then, so it is neither
compiled, verified nor diffed, and its observation is not even loaded. Anything that differs, or a
cluster with no record, is planned as always.

Why that is exact: a cluster's part of a plan is a pure function of these inputs and the clock
(`gitops.plan.clusters.plan_nodes` memoizes it on a digest of the same things, valid until the
renewal time). What a cluster's part could read from another cluster is covered by how records are
made: no record exists after a plan with a cluster's warning or unknown, and an observed pod of one cluster's
node labeled with another cluster is an action of that other cluster (so neither is recorded), and
makes the cold plan load both (`clusters_of_pods`).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from gitops.model.config import RepoConfig
from gitops.model.resources import Hypervisor, RepoModel
from gitops.observe.types import ObservedState
from gitops.plan.actions import Plan
from gitops.state.records import State

#: bump when what a record covers changes: older records are then ignored (a full plan)
FORMAT = 1


@dataclass(frozen=True)
class Converged:
    """One cluster's record: `inputs` (`Digester.digest`), `observed` (the git blob id of its observed
    snapshot file, "" without one) and `renew_at` (ISO 8601, "" when no certificate was checked)."""

    inputs: str
    observed: str
    renew_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "inputs": self.inputs, "observed": self.observed, "renewAt": self.renew_at}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes | None) -> "Converged | None":
        """None for a missing, unreadable or older record (the cluster is then planned in full)."""
        try:
            data = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            return None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "Converged | None":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        values = [data.get(k) for k in ("inputs", "observed", "renewAt")]
        if not all(isinstance(v, str) for v in values):
            return None
        return cls(*values)

    def due(self, now: dt.datetime) -> bool:
        """Whether a certificate it checked has entered its renewal window by `now`."""
        if not self.renew_at:
            return False
        try:
            return now >= dt.datetime.fromisoformat(self.renew_at)
        except ValueError:
            return True


def blob_id(data: bytes) -> str:
    """The git blob id of `data` (what `git ls-tree` lists for a file holding it)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


#: libraries whose answers a plan depends on (certificates parsed, YAML read, schemas checked)
_LIBRARIES = ("cryptography", "PyYAML", "jsonschema")


#: packages of gitops a plan never runs (the lab and its crash harness, the web UI's pages, a worker's join):
#: changing them replans nothing (tests/test_cold_plan.py checks that planning imports none of them). The
#: UI's branch plan (`ui/plans.py`) only hands a checkout to `status.against`: plan logic belongs there.
NOT_PLANNING = ("lab", "ui", "worker")


def digested_sources(root: Path) -> list[Path]:
    """The gitops sources `code_digest` covers, sorted: every module but those of `NOT_PLANNING`."""
    return sorted(p for p in root.rglob("*.py") if p.relative_to(root).parts[0] not in NOT_PLANNING)


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of the gitops sources a plan runs, the Python version and the libraries a plan's answers
    depend on: another version of any of them may plan otherwise."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(sys.version.encode())
    for name in _LIBRARIES:
        try:
            h.update(f"{name}={metadata.version(name)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{name}=?\0".encode())
    for path in digested_sources(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def settings_text(config: RepoConfig) -> str:
    """The repo-wide settings a cluster's plan reads."""
    return repr((config.prune, config.renew_before_days, config.health_timeout))


def hypervisors_of(state: State, nodes: Iterable[str]) -> set[str]:
    """Where the recorded `nodes` are, were (moving) or leave from."""
    out: set[str] = set()
    for node in nodes:
        record = state.nodes.get(node)
        if record is not None:
            out |= {hv for hv in (record.hypervisor, record.moved_from, record.leaving_from) if hv}
    return out


class Digester:
    """The inputs digest of each cluster of one model and recorded state (what all clusters share is made
    once: the settings, the hypervisors' text, the recorded nodes by cluster)."""

    def __init__(self, model: RepoModel, config: RepoConfig, state: State, reachable: Mapping[str, bool]):
        self.model, self.state = model, state
        self.head = [code_digest(), settings_text(config)]
        self.by_cluster = nodes_by_cluster(state)
        self.hypervisors = {name: repr((name, _planned_part(hv), reachable.get(name)))
                            for name, hv in model.hypervisors.items()}
        self.reachable = reachable

    def digest(self, cluster: str) -> str:
        """A digest of what `cluster`'s part of a plan is made from, but for its observation and the clock:
        its Cluster and Nodes, the Hypervisors its nodes are (or were, moving) recorded on or pinned to and
        whether they answered, the public part of its records (every field but private keys), the settings
        a plan reads, the gitops code."""
        model, state = self.model, self.state
        nodes = sorted(model.nodes_of(cluster), key=lambda n: n.name)
        recorded = sorted(set(self.by_cluster.get(cluster, ())) | {n.name for n in nodes})
        hvs = sorted(hypervisors_of(state, recorded) | {n.hypervisor for n in nodes if n.hypervisor})
        record = state.clusters.get(cluster)
        parts = [*self.head, repr(model.clusters.get(cluster)), repr(nodes),
                 "".join(self.hypervisors.get(hv) or repr((hv, None, self.reachable.get(hv))) for hv in hvs),
                 json.dumps(_plain(record), sort_keys=True),
                 json.dumps([(n, _plain(state.nodes[n])) for n in recorded if n in state.nodes], sort_keys=True)]
        h = hashlib.sha256()
        for part in parts:
            data = part.encode()
            h.update(b"%d:" % len(data) + data)
        return h.hexdigest()


_FIELDS: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> Any:
    """`value` as JSON-able data, every dataclass field by name but private keys (`key_pem`): the public
    part of a record as `gitops.state.sealing` publishes it, made without `asdict`'s deep copies."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    names = _FIELDS.get(kind)
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if kind is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(value) if f.name != "key_pem")
        return _plain(value)
    return value


def _planned_part(hypervisor: Hypervisor | None) -> Hypervisor | None:
    """What a plan reads of a Hypervisor: all but how its runtime is reached (a pull request's checkout
    may point its endpoints elsewhere; a sealed client key reads otherwise than a decrypted one)."""
    return dataclasses.replace(hypervisor, endpoint=None) if hypervisor is not None else None


def nodes_by_cluster(state: State) -> dict[str, list[str]]:
    """Recorded node names by their cluster."""
    out: dict[str, list[str]] = {}
    for name, record in state.nodes.items():
        out.setdefault(record.cluster, []).append(name)
    return out


def records(plan: Plan, settled: bool, model: RepoModel, config: RepoConfig, state: State, planned_state: State,
            reachable: Mapping[str, bool], observed: Mapping[str, str],
            renew_at: Mapping[str, dt.datetime]) -> dict[str, Converged]:
    """The records a reconcile leaves: one per cluster of `model` with no action in `plan`, none at all
    unless the plan is `settled` (no warning, note or unknown from any cluster). `state`: the recorded
    state as written beside them (a cluster whose records there differ from `planned_state`'s, the
    plan's, is left out); `observed`: each cluster's observation fingerprint; `renew_at`: each cluster's
    first renewal time."""
    if not settled:
        return {}
    busy = {a.cluster for a in plan.actions}
    digester = Digester(model, config, state, reachable)
    planned_nodes = nodes_by_cluster(planned_state)
    out = {}
    for cluster in sorted(model.clusters):
        nodes = sorted(digester.by_cluster.get(cluster, []))
        if (cluster in busy or planned_state.clusters.get(cluster) != state.clusters.get(cluster)
                or sorted(planned_nodes.get(cluster, [])) != nodes
                or any(planned_state.nodes[n] != state.nodes[n] for n in nodes)):
            continue
        when = renew_at.get(cluster)
        out[cluster] = Converged(digester.digest(cluster), observed.get(cluster, ""),
                                 when.isoformat() if when is not None else "")
    return out


def reachability(observed: ObservedState) -> dict[str, bool]:
    """Whether each observed hypervisor answered."""
    return {name: hv.reachable for name, hv in observed.hypervisors.items()}


def unchanged(model: RepoModel, config: RepoConfig, state: State, recorded: Mapping[str, Converged],
              reachable: Mapping[str, bool], observed: Mapping[str, str], now: dt.datetime) -> frozenset[str]:
    """The clusters of `model` whose record says their plan is empty again: same inputs, same observation
    fingerprint (`observed`), no certificate due."""
    digester = Digester(model, config, state, reachable)
    out = set()
    for cluster in model.clusters:
        record = recorded.get(cluster)
        if record is None or record.due(now) or record.observed != observed.get(cluster, ""):
            continue
        if record.inputs == digester.digest(cluster):
            out.add(cluster)
    return frozenset(out)


def leave_out(model: RepoModel, config: RepoConfig, state: State, recorded: Mapping[str, Converged],
              observed: ObservedState, fingerprints: Mapping[str, str], now: dt.datetime) -> frozenset[str]:
    """The clusters a plan against the whole of `observed` (a live observation) may leave out: `unchanged`
    by their `fingerprints`, less those owning the node of a pod filed under another cluster."""
    skipped = unchanged(model, config, state, recorded, reachability(observed), fingerprints, now)
    return skipped - clusters_of_pods(model, observed.pods(), skipped)


def to_json(records: Mapping[str, Converged]) -> dict[str, Any]:
    """The records as a local state dir keeps them (`converged.json`)."""
    return {"clusters": {name: records[name].to_dict() for name in sorted(records)}}


def from_json(data: Any) -> dict[str, Converged]:
    """`to_json`'s records back; unreadable ones left out."""
    clusters = data.get("clusters") if isinstance(data, dict) else None
    if not isinstance(clusters, dict):
        return {}
    return {name: record for name, raw in clusters.items() if (record := Converged.from_dict(raw)) is not None}


def clusters_of_pods(model: RepoModel, pods: Iterable[Any], skipped: frozenset[str]) -> set[str]:
    """Skipped clusters that own the node of an observed pod (labeled with another cluster, or none):
    such a pod is planned with its node's cluster, so that cluster must be planned too."""
    out = set()
    for pod in pods:
        node = model.nodes.get(pod.node)
        if node is not None and node.cluster in skipped and pod.cluster != node.cluster:
            out.add(node.cluster)
    return out


def without(model: RepoModel, clusters: frozenset[str]) -> RepoModel:
    """`model` without `clusters` and their nodes (what a plan leaves out)."""
    if not clusters:
        return model
    return dataclasses.replace(
        model, clusters={n: c for n, c in model.clusters.items() if n not in clusters},
        nodes={n: node for n, node in model.nodes.items() if node.cluster not in clusters})


def observed_without(observed: ObservedState, clusters: frozenset[str]) -> ObservedState:
    """`observed` without what is filed under `clusters` (their pods, API, etcd and snapshots)."""
    if not clusters:
        return observed
    return dataclasses.replace(
        observed,
        hypervisors={n: dataclasses.replace(hv, pods=tuple(p for p in hv.pods if p.cluster not in clusters))
                     for n, hv in observed.hypervisors.items()},
        clusters={n: c for n, c in observed.clusters.items() if n not in clusters},
        snapshots={n: s for n, s in observed.snapshots.items() if n not in clusters},
        etcd={n: e for n, e in observed.etcd.items() if n not in clusters})
