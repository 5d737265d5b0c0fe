"""Status documents: what people read on the status branch (pure).

`status/source.yaml` says which commit is in force and how the last one went;
`status/<Kind>/<name>.yaml` gives each resource's phase, conditions (with a
lastTransitionTime kept from the previous commit while nothing changes),
endpoints and per-component state; `status/Shard/<lease>.yaml` (several
controllers) which replica holds a shard and how its last reconcile went.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from gitops.apply import Timing
from gitops.compile.desired import DesiredCluster, DesiredPod, DesiredState
from gitops.compile.sip_services import auth_node, issuer_url, runs_provider
from gitops.coordination.scope import Scope
from gitops.hostport import host_port
from gitops.model.resources import RepoModel
from gitops.observe.types import ObservedEtcd, ObservedPod, ObservedState
from gitops.pki.facts import certificate_facts
from gitops.plan.actions import Action, Plan
from gitops.plan.upkeep import space_condition
from gitops.pods import reloaded_to
from gitops.sip.selection import HostSelection
from gitops.state.records import RolloutRecord
from gitops.status.reader import SOURCE, kubeconfig_path, resource_path

API_VERSION = "gitops.infra/v1alpha1"


class Result(StrEnum):
    """How one reconcile of one commit ended."""

    APPLIED = "Applied"
    REFUSED = "Refused"
    FAILED = "Failed"
    #: a rollout wave breached its SLO (spec.rollout.slo): no later wave started; held like a refused commit
    HALTED = "Halted"
    #: one of several replicas that holds no Lease: it neither applied nor reported anything
    STANDING_BY = "StandingBy"


class Reason(StrEnum):
    """The Ready condition's reason on status/source.yaml, one per result."""

    RECONCILED = "Reconciled"
    COMMIT_REFUSED = "CommitRefused"
    APPLY_FAILED = "ApplyFailed"
    ROLLOUT_HALTED = "RolloutHalted"
    STANDING_BY = "StandingBy"


REASON = {Result.APPLIED: Reason.RECONCILED, Result.REFUSED: Reason.COMMIT_REFUSED, Result.FAILED: Reason.APPLY_FAILED,
          Result.HALTED: Reason.ROLLOUT_HALTED, Result.STANDING_BY: Reason.STANDING_BY}


@dataclass(frozen=True)
class Outcome:
    """How one reconcile of one commit ended."""

    sha: str
    result: Result
    message: str = ""
    errors: tuple[str, ...] = ()
    applied_sha: str = ""  # the commit in force afterwards (the last good one)
    actions: int = 0
    #: the status branch's tip was set aside as untrusted: its commit and why ("" when it was trusted)
    untrusted_status: tuple[str, str] | None = None


#: LibYAML when PyYAML has it: a large fleet has thousands of status documents per commit
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dump(data: Any) -> bytes:
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=True, default_flow_style=False, width=120).encode()


def _previous_conditions(previous: Callable[[str], bytes | None], rel: str) -> dict[str, dict[str, Any]]:
    raw = previous(rel)
    if raw is None:
        return {}
    try:
        doc = yaml.load(raw, Loader=_LOADER) or {}  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        return {}
    return {c.get("type"): c for c in doc.get("status", {}).get("conditions", []) if isinstance(c, dict)}


def condition(kind: str, status: bool | None, reason: str, message: str,
              before: dict[str, dict[str, Any]], now: dt.datetime) -> dict[str, Any]:
    value = "Unknown" if status is None else ("True" if status else "False")
    old = before.get(kind)
    since = now.isoformat(timespec="seconds")
    if old and old.get("status") == value and old.get("reason") == reason:
        since = old.get("lastTransitionTime", since)
    return {"type": kind, "status": value, "reason": reason, "message": message, "lastTransitionTime": since}


def source_document(outcome: Outcome, previous: Callable[[str], bytes | None], now: dt.datetime) -> bytes:
    before = _previous_conditions(previous, SOURCE)
    ok = outcome.result == Result.APPLIED
    reason = REASON[outcome.result].value
    status: dict[str, Any] = {
        "lastSeenSHA": outcome.sha,
        "appliedSHA": outcome.applied_sha,
        "result": outcome.result.value,
        "conditions": [condition("Ready", ok, reason, outcome.message, before, now)],
    }
    untrusted = outcome.untrusted_status
    status["conditions"].append(condition(
        "StatusBranchTrusted", untrusted is None, "Untrusted" if untrusted else "Signed",
        f"status commit {untrusted[0][:12] or '(none)'} set aside: {untrusted[1]}; the last trusted status was read and "
        "written back over it" if untrusted else "the status branch's tip was signed by a pinned key", before, now))
    if outcome.errors:
        status["errors"] = list(outcome.errors)
    return dump({"apiVersion": API_VERSION, "kind": "SourceStatus", "metadata": {"name": "source"},
                 "status": status})


def apply_document(sha: str, plan: Plan, done: Mapping[int, Timing], failed: Mapping[int, Timing], error: str,
                   stopped: bool, follow_up: Plan | None, surprises: list[str], now: dt.datetime,
                   duration: float | None = None) -> bytes:
    """The plan the controller executed for `sha`, each action with its result (when it started, in seconds
    from the first, and the seconds it took), and the follow-up plan.

    `done`, `failed`: by plan index (from 0), the actions that completed and those that failed. The clusters
    of a wave's batch apply at once, so what is done need not be the plan's first actions.
    `duration`: the seconds the whole apply stage took (planning, actions, the plan after).
    """
    def row(index: int, action: Action, result: str | None) -> dict[str, Any]:
        data = {"index": index + 1, "kind": action.kind.value, "subject": action.subject,
                "hypervisor": action.hypervisor, "reason": action.reason, "details": list(action.details)}
        if result is not None:
            data["result"] = result
            timing = done.get(index) or failed.get(index)
            if timing is not None:
                data["startedSeconds"], data["seconds"] = timing.started, timing.seconds
        return data

    def result(index: int) -> str:
        return "Done" if index in done else "Failed" if index in failed else "NotRun"

    outcome = "Failed" if error else ("Stopped" if stopped else "Applied")
    status: dict[str, Any] = {
        "sha": sha, "time": now.isoformat(timespec="seconds"), "result": outcome,
        **({"durationSeconds": duration} if duration is not None else {}),
        "summary": {**plan.summary(), "executed": len(done), "planned": len(plan.actions)},
        "actions": [row(i, a, result(i)) for i, a in enumerate(plan.actions)],
    }
    if error:
        status["error"] = error
    if follow_up is not None:
        status["followUp"] = {"summary": follow_up.summary(),
                              "actions": [row(i, a, None) for i, a in enumerate(follow_up.actions)],
                              "why": list(surprises)}
    return dump({"apiVersion": API_VERSION, "kind": "ApplyRecord", "metadata": {"name": "last-apply"},
                 "status": status})


def rollout_document(record: RolloutRecord | None) -> bytes | None:
    """status/rollout.yaml: the last rollout through spec.rollout.waves, wave by wave with its figures, and
    where it halted (None before any)."""
    if record is None:
        return None
    halted = record.halted
    status: dict[str, Any] = {
        "commit": record.commit,
        # (Soaked: every wave started so far soaked; a later wave starts when the commit reaches its clusters)
        "phase": "Halted" if halted else ("Rolling" if any(w.phase == "Rolling" for w in record.waves) else "Soaked"),
        "waves": [{"name": w.name, "phase": w.phase, "started": w.started, "ended": w.ended,
                   "clusters": {c: dict(sorted(f.items())) for c, f in sorted(w.figures.items())},
                   **({"breach": {"cluster": w.breached_cluster, "reason": w.breach}} if w.breach else {})}
                  for w in record.waves],
    }
    if halted:
        status["halted"] = {"wave": halted.name, "cluster": halted.breached_cluster, "reason": halted.breach}
    return dump({"apiVersion": API_VERSION, "kind": "RolloutStatus", "metadata": {"name": "rollout"},
                 "status": status})


@dataclass(frozen=True)
class Phase:
    """A resource's phase and its Ready condition's status, reason and message."""

    phase: str
    ready: bool | None
    reason: str
    message: str


def resource_documents(model: RepoModel, desired: DesiredState, observed: ObservedState, outcome: Outcome,
                       previous: Callable[[str], bytes | None], now: dt.datetime,
                       placements: dict[str, tuple[str, dict[str, int]]],
                       running: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """status/<Kind>/<name>.yaml for every Cluster, Node and Hypervisor of the applied model; `running`: the
    commit each cluster runs, as recorded (the commit in force where it is not)."""
    nodes = _node_documents(model, desired, observed, outcome, previous, now, placements)
    node_phase = {name: phase for name, (phase, _) in nodes.items()}
    out = {rel: doc for _, (_, (rel, doc)) in nodes.items()}
    out.update(_cluster_documents(model, desired, node_phase, outcome, previous, now, observed, running or {}))
    out.update(_hypervisor_documents(model, observed, previous, now, placements))
    return out


def node_phase(want: DesiredPod | None, observed: ObservedState, have: ObservedPod | None,
               outcome: Outcome) -> tuple[Phase, dict[str, str]]:
    """A Node's phase from its desired and observed pod, and each component's state."""
    components: dict[str, str] = {}
    if want is None:
        return Phase("Pending", False, "NotPlaced", "no reachable hypervisor can take it yet"), components
    if not observed.hypervisors.get(want.hypervisor) or not observed.hypervisors[want.hypervisor].reachable:
        return Phase("Unknown", None, "HypervisorUnreachable",
                     f"hypervisor {want.hypervisor} could not be reached"), components
    missing = []
    for container in want.containers:
        running = have.running(container.spec.name) if have else None
        state = "missing"
        if running is not None:
            current = running.spec_hash == container.spec_hash or reloaded_to(
                have.files if have else None, container.spec.name, running.id, container.spec_hash)
            state = "running" if current else "outdated"
        elif have is not None and any(c.component == container.spec.name for c in have.containers):
            state = next(c.state for c in sorted(have.containers, key=lambda c: -c.created_at)
                         if c.component == container.spec.name)
        components[container.spec.name] = state
        if state != "running":
            missing.append(f"{container.spec.name} {state}")
    if have is None:
        phase = Phase("Progressing", False, "PodMissing", "the pod does not exist")
    elif missing:
        phase = Phase("Progressing", False, "ComponentsNotReady", ", ".join(missing))
    else:
        phase = Phase("Ready", True, "AllComponentsRunning", "all components run")
    if outcome.result == Result.FAILED and phase.phase == "Progressing":
        phase = Phase("Failed", False, "ApplyFailed", f"{phase.message}; {outcome.message}")
    return phase, components


def _node_documents(model: RepoModel, desired: DesiredState, observed: ObservedState, outcome: Outcome,
                    previous: Callable[[str], bytes | None], now: dt.datetime,
                    placements: dict[str, tuple[str, dict[str, int]]]) -> dict[str, tuple[str, tuple[str, bytes]]]:
    """Node name -> (phase, (path, document))."""
    pods = {p.node: p for p in observed.pods() if p.node in desired.pods
            and p.hypervisor == desired.pods[p.node].hypervisor}
    out = {}
    for name, node in sorted(model.nodes.items()):
        rel = resource_path("Node", name)
        phase, components = node_phase(desired.pods.get(name), observed, pods.get(name), outcome)
        placed = placements.get(name)
        status: dict[str, Any] = {
            "phase": phase.phase,
            "observedSourceSHA": outcome.applied_sha,
            "conditions": [condition("Ready", phase.ready, phase.reason, phase.message,
                                     _previous_conditions(previous, rel), now)],
            "components": components,
        }
        if components:
            status["containers"] = _containers(desired.pods.get(name), pods.get(name))
        if placed:
            status["hypervisor"], status["ports"] = placed
        out[name] = (phase.phase, (rel, dump({"apiVersion": API_VERSION, "kind": "NodeStatus",
                                              "metadata": {"name": name},
                                              "spec": {"cluster": node.cluster, "role": node.role},
                                              "status": status})))
    return out


def _containers(want: DesiredPod | None, have: ObservedPod | None) -> dict[str, dict[str, Any]]:
    """Each desired container's image, and how many exited containers of it the pod holds (its restarts
    seen: a container gitops replaces is removed, one that died stays until it is started again)."""
    if want is None:
        return {}
    seen = have.containers if have is not None else ()
    return {c.spec.name: {"image": c.spec.image,
                          "restarts": sum(1 for o in seen if o.component == c.spec.name and o.state == "exited")}
            for c in want.containers}


def _certificates(pods: dict[str, list[ObservedPod]], nodes: Iterable[str]) -> dict[str, str]:
    """The earliest expiry of the certificates the cluster's nodes hold (`pods`: observed pods by node), and
    which one it is ({} when none was read)."""
    earliest: tuple[dt.datetime, str] | None = None
    for pod in (p for node in nodes for p in pods.get(node, ()) if p.files is not None):
        for name, pem in pod.files.certificates.items():  # type: ignore[union-attr]
            facts = certificate_facts(pem, None)
            if facts is not None and (earliest is None or facts.not_after < earliest[0]):
                earliest = (facts.not_after, f"{pod.node}/{name}")
    if earliest is None:
        return {}
    return {"earliestExpiry": earliest[0].isoformat(timespec="seconds"), "certificate": earliest[1]}


def _etcd(seen: ObservedEtcd | None) -> dict[str, Any]:
    """The cluster's etcd members as last read, and the one that leads."""
    if seen is None or not seen.members:
        return {}
    leader = next((m.node for m in seen.members if m.leader), "")
    return {"members": sorted(m.node for m in seen.members), **({"leader": leader} if leader else {})}


def cluster_phase(phases: dict[str, str], endpoint: str | None) -> Phase:
    """A Cluster's phase from its Nodes' phases."""
    not_ready = [f"{n} {p}" for n, p in phases.items() if p != "Ready"]
    if not phases:
        return Phase("Pending", False, "NoNodes", "the cluster has no Node")
    if any(p == "Unknown" for p in phases.values()):
        return Phase("Unknown", None, "NodesUnknown", ", ".join(not_ready))
    if not_ready:
        failed = any(p == "Failed" for p in phases.values())
        return Phase("Failed" if failed else "Progressing", False, "NodesNotReady", ", ".join(not_ready))
    if endpoint is None:
        return Phase("Ready", True, "NoIngress", "all nodes ready; no ingress node")
    return Phase("Ready", True, "AllNodesReady", "all nodes ready")


def workers_status(observed: ObservedState, cluster: str) -> dict[str, Any]:
    """The cluster's joined workers as its API lists them (not in the repo: workers join with tokens)."""
    seen = observed.clusters.get(cluster)
    if seen is None or not seen.reachable:
        return {"observed": False, "reason": seen.error if seen is not None else "no API server running"}
    return {"observed": True, "total": len(seen.workers), "ready": sum(1 for w in seen.workers if w.ready),
            "nodes": {w.name: {"ready": w.ready, "address": w.address, "kubeletVersion": w.kubelet_version}
                      for w in seen.workers}}


def _cluster_documents(model: RepoModel, desired: DesiredState, node_phases: dict[str, str], outcome: Outcome,
                       previous: Callable[[str], bytes | None], now: dt.datetime,
                       observed: ObservedState, running: Mapping[str, str]) -> dict[str, bytes]:
    out = {}
    pods: dict[str, list[ObservedPod]] = {}
    for pod in observed.pods():
        pods.setdefault(pod.node, []).append(pod)
    for name in sorted(model.clusters):
        rel = resource_path("Cluster", name)
        phases = {n: node_phases[n] for n in sorted(node.name for node in model.nodes_of(name))}
        endpoint = desired.clusters[name].api_endpoint if name in desired.clusters else None
        phase = cluster_phase(phases, endpoint)
        status = {
            "phase": phase.phase,
            "version": model.clusters[name].kubernetes_version,
            "observedSourceSHA": outcome.applied_sha,
            # the commit whose plan last changed it (with waves, a fleet may run two commits)
            "runningSHA": running.get(name) or outcome.applied_sha,
            "conditions": [condition("Ready", phase.ready, phase.reason, phase.message,
                                     _previous_conditions(previous, rel), now),
                           *_etcd_condition(desired.clusters.get(name), observed.etcd.get(name),
                                            _previous_conditions(previous, rel), now)],
            "endpoints": {"api": endpoint} if endpoint else {},
            "nodes": phases,
            "workers": workers_status(observed, name),
            "kubeconfig": kubeconfig_path(name) if endpoint else None,
        }
        for key, value in (("certificates", _certificates(pods, phases)), ("etcd", _etcd(observed.etcd.get(name)))):
            if value:
                status[key] = value
        out[rel] = dump({"apiVersion": API_VERSION, "kind": "ClusterStatus", "metadata": {"name": name},
                         "status": status})
    return out


def _etcd_condition(want: DesiredCluster | None, seen: ObservedEtcd | None, before: dict[str, dict[str, Any]],
                    now: dt.datetime) -> list[dict[str, Any]]:
    """`EtcdSpace`: the database against its quota, and the alarms (none while etcd was not read)."""
    if want is None or seen is None or not seen.members:
        return []
    ok, reason, message = space_condition(want, seen)
    return [condition("EtcdSpace", ok, reason, message, before, now)]


def _hypervisor_documents(model: RepoModel, observed: ObservedState, previous: Callable[[str], bytes | None],
                          now: dt.datetime, placements: dict[str, tuple[str, dict[str, int]]]) -> dict[str, bytes]:
    used: dict[str, int] = {}
    for hypervisor, ports in placements.values():
        used[hypervisor] = used.get(hypervisor, 0) + len(ports)
    out = {}
    for name in sorted(model.hypervisors):
        rel = resource_path("Hypervisor", name)
        seen = observed.hypervisors.get(name)
        reachable = bool(seen and seen.reachable)
        status = {
            "phase": "Ready" if reachable else "Unknown",
            "conditions": [condition("Reachable", reachable, "CRIAnswered" if reachable else "CRIUnreachable",
                                     "" if reachable else (seen.error if seen else "not observed"),
                                     _previous_conditions(previous, rel), now)],
            "pods": sorted(p.node for p in seen.pods) if seen else [],
            "ports": {"used": used.get(name, 0), "total": len(model.hypervisors[name].port_range)},
        }
        out[rel] = dump({"apiVersion": API_VERSION, "kind": "HypervisorStatus", "metadata": {"name": name},
                         "status": status})
    return out


def sip_documents(model: RepoModel, sip: HostSelection, outcome: Outcome, previous: Callable[[str], bytes | None],
                  now: dt.datetime, desired: DesiredState | None = None,
                  placements: dict[str, tuple[str, dict[str, int]]] | None = None) -> dict[str, bytes]:
    """status/SIPCluster/<name>.yaml: the chosen hosts by role, and whether there were enough."""
    out: dict[str, bytes] = {}
    selections = {s.cluster: s for s in sip.selections}
    pending = {c.host for c in sip.changes}
    for name in sorted(model.sip_clusters):
        rel = resource_path("SIPCluster", name)
        selection = selections.get(name)
        if selection is None:
            phase, ready, reason, message, roles = "Unknown", None, "HostsNotListed", \
                "BareMetalHosts could not be listed", {}
        else:
            roles = {r.role: {"active": list(r.active), "standby": list(r.standby)} for r in selection.roles}
            unlabeled = sorted(h for r in selection.roles for h in r.hosts if h in pending)
            if not selection.ready:
                phase, ready = "InsufficientHosts", False
            elif unlabeled:
                phase, ready = "Progressing", False
            else:
                phase, ready = "Ready", True
            reason, message = selection.condition.reason, selection.condition.message
            if ready is False and unlabeled and selection.ready:
                reason, message = "LabelsPending", "not yet labeled: " + ", ".join(unlabeled)
        status = {
            "phase": phase,
            "observedSourceSHA": outcome.applied_sha,
            "conditions": [condition("Ready", ready, reason, message, _previous_conditions(previous, rel), now)],
            "hosts": roles,
            "services": _service_endpoints(model, name, desired, placements or {}),
        }
        out[rel] = dump({"apiVersion": API_VERSION, "kind": "SIPClusterStatus", "metadata": {"name": name},
                         "status": status})
    return out


def _service_endpoints(model: RepoModel, name: str, desired: DesiredState | None,
                       placements: dict[str, tuple[str, dict[str, int]]]) -> dict[str, Any]:
    sip = model.sip_clusters[name]
    out: dict[str, Any] = {}
    for key, node, purpose in (("loadBalancer", f"{name}-lb", "loadbalancer"), ("jumpHost", f"{name}-jump", "ssh")):
        if node in placements and desired is not None and node in desired.pods:
            hv, ports = placements[node]
            out[key] = host_port(model.hypervisors[hv].ip_address, ports[purpose])
    if sip.auth is not None:
        node = auth_node(name)
        auth: dict[str, Any] = {"users": len(sip.auth.users), "clients": sorted(c.client_id for c in sip.auth.clients)}
        if not runs_provider(sip):
            auth.update(oidcIssuerURL=sip.auth.oidc_issuer_url,
                        note="no provider runs: declare users or clients (docs/operations/oidc.md)")
        elif node in placements and desired is not None and node in desired.pods:
            hv, ports = placements[node]
            auth.update(oidcIssuerURL=issuer_url(sip.auth, model.hypervisors[hv], ports["oidc"]),
                        endpoint=host_port(model.hypervisors[hv].ip_address, ports["oidc"]))
        else:
            auth.update(oidcIssuerURL=sip.auth.oidc_issuer_url, note="its provider is not placed yet")
        out["auth"] = auth
    return out


def shard_documents(scope: Scope, clusters: Iterable[str], holder: str, outcome: Outcome) -> dict[str, bytes]:
    """status/Shard/<lease>.yaml for each Lease `holder` holds: the clusters of the repo in it, and how
    this reconcile of them went."""
    names = sorted(clusters)
    out = {}
    for lease in sorted(scope.held):
        out[resource_path("Shard", lease)] = dump({
            "apiVersion": API_VERSION, "kind": "ShardStatus", "metadata": {"name": lease},
            "status": {"holder": holder, "clusters": [c for c in names if scope.lease_of(c) == lease],
                       "observedSourceSHA": outcome.sha, "result": outcome.result.value,
                       "actions": outcome.actions}})
    return out
