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
(`gitops.plan.rollout.plan_nodes` memoizes it on a digest of the same things, valid until the
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gitops.model.config import RepoConfig
from gitops.model.resources import Hypervisor, RepoModel
from gitops.plan.actions import Plan
from gitops.state.records import State
from gitops.state.sealing import public_cluster

#: bump when what a record covers changes: older records are then ignored (a full plan)
FORMAT = 1


@dataclass(frozen=True)
class Converged:
    """One cluster's record: `inputs` (its `inputs_digest`), `observed` (the git blob id of its observed
    snapshot file, "" without one) and `renew_at` (ISO 8601, "" when no certificate was checked)."""

    inputs: str
    observed: str
    renew_at: str = ""

    def to_bytes(self) -> bytes:
        data = {"format": FORMAT, "inputs": self.inputs, "observed": self.observed, "renewAt": self.renew_at}
        return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes | None) -> "Converged | None":
        """None for a missing, unreadable or older record (the cluster is then planned in full)."""
        try:
            data = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            return None
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


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of the gitops sources that plan: another version of gitops may plan otherwise."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
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


def inputs_digest(model: RepoModel, state: State, cluster: str, settings: str, reachable: Mapping[str, bool],
                  nodes_by_cluster: Mapping[str, list[str]]) -> str:
    """A digest of what `cluster`'s part of a plan is made from, but for its observation and the clock.
    `reachable`: the observed hypervisors' reachability; `nodes_by_cluster`: recorded nodes by cluster."""
    nodes = sorted(model.nodes_of(cluster), key=lambda n: n.name)
    recorded = sorted(set(nodes_by_cluster.get(cluster, ())) | {n.name for n in nodes})
    hvs = sorted(hypervisors_of(state, recorded) | {n.hypervisor for n in nodes if n.hypervisor})
    record = state.clusters.get(cluster)
    parts = [code_digest(), settings, repr(model.clusters.get(cluster)), repr(nodes),
             repr([(hv, _planned_part(model.hypervisors.get(hv)), reachable.get(hv)) for hv in hvs]),
             json.dumps(public_cluster(record) if record is not None else None, sort_keys=True),
             json.dumps([(n, dataclasses.asdict(state.nodes[n])) for n in recorded if n in state.nodes],
                        sort_keys=True)]
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(b"%d:" % len(data) + data)
    return h.hexdigest()


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


def records(plan: Plan, settled: bool, model: RepoModel, config: RepoConfig, state: State,
            reachable: Mapping[str, bool], observed: Mapping[str, str],
            renew_at: Mapping[str, dt.datetime]) -> dict[str, Converged]:
    """The records a reconcile leaves: one per cluster of `model` with no action in `plan`, none at all
    unless the plan is `settled` (no warning, note or unknown from any cluster). `state`: the recorded
    state as written beside them; `observed`: each cluster's observation fingerprint; `renew_at`: each
    cluster's first renewal time."""
    if not settled:
        return {}
    busy = {a.cluster for a in plan.actions}
    settings, by_cluster = settings_text(config), nodes_by_cluster(state)
    out = {}
    for cluster in sorted(model.clusters):
        if cluster in busy:
            continue
        when = renew_at.get(cluster)
        out[cluster] = Converged(inputs_digest(model, state, cluster, settings, reachable, by_cluster),
                                 observed.get(cluster, ""), when.isoformat() if when is not None else "")
    return out


def unchanged(model: RepoModel, config: RepoConfig, state: State, recorded: Mapping[str, Converged],
              reachable: Mapping[str, bool], observed: Mapping[str, str], now: dt.datetime) -> frozenset[str]:
    """The clusters of `model` whose record says their plan is empty again: same inputs, same observation
    fingerprint (`observed`), no certificate due."""
    settings, by_cluster = settings_text(config), nodes_by_cluster(state)
    out = set()
    for cluster in model.clusters:
        record = recorded.get(cluster)
        if record is None or record.due(now) or record.observed != observed.get(cluster, ""):
            continue
        if record.inputs == inputs_digest(model, state, cluster, settings, reachable, by_cluster):
            out.add(cluster)
    return frozenset(out)


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
