"""Desired against observed, one cluster at a time: its raw actions (pure).

This module says what differs and why, for people (`reason`, `details`) and for apply (payloads);
`gitops.plan.rollout` orders and gates them. Rules that keep a reconciler safe:
* nothing is planned on an unreachable hypervisor, deletions least of all;
* only objects carrying the managed-by label are ever touched;
* an object whose Node left the repo is removed only when pruning is enabled,
  and such removals count against the mass-delete threshold;
* a container is recreated when anything it runs with changed, and the
  reason names the changed fields (deepdiff of the recorded spec).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gitops.compile.desired import (
    AFTER_APPLY,
    CertificateSpec,
    DesiredCluster,
    DesiredContainer,
    DesiredPod,
)
from gitops.model.components import CONTROLPLANE
from gitops.observe.types import ObservedContainer, ObservedPod
from gitops.pki.facts import certificate_facts
from gitops.plan.actions import Action, Kind
from gitops.plan.payloads import (
    CreateContainer,
    CreatePod,
    GenerateKeys,
    IssueCertificate,
    PodRef,
    Reload,
    Remove,
    WriteFiles,
)
from gitops.pods import AGENT, FILES, SPEC_HASH, NodeFiles, reload_marker
from gitops.plan.inputs import ClusterInputs
from gitops.state.records import ClusterRecord

MAX_LISTED_CHANGES = 6
_PEM_END = "-----END CERTIFICATE-----"


@dataclass(frozen=True)
class DiffOptions:
    prune: bool = True
    #: seconds an etcd step or an API server replacement waits for health (spec.rollout.healthTimeoutSeconds;
    #: `gitops.plan.rollout` reads it)
    health_timeout: int = 60


@dataclass(frozen=True)
class Compared:
    """One cluster's raw actions (neither ordered nor gated) and (node, warning)s. `keepers`: the observed
    pod kept for each node; `until`: the first moment a certificate found fine enters its renewal window
    (None: no certificate involved); `unchecked`: nodes whose files were not checked (their files agent
    starts again in this plan)."""

    actions: list[Action]
    warnings: list[tuple[str, str]]
    keepers: dict[str, ObservedPod]
    until: dt.datetime | None
    unchecked: tuple[str, ...] = ()


def compare(inputs: ClusterInputs, options: DiffOptions, now: dt.datetime) -> Compared:
    """What differs in one cluster: observed pods whose node left the repo, moved or are duplicates, then
    each desired pod's sandbox, keys, files and containers (on reachable hypervisors)."""
    actions: list[Action] = []
    warnings: list[tuple[str, str]] = []
    deadlines: list[dt.datetime] = []
    unchecked: list[str] = []
    desired = {p.node: p for p in inputs.wants}
    keepers = _keepers(inputs, desired, options.prune, actions, warnings)
    for node, want in sorted(desired.items()):
        if want.hypervisor in inputs.down or want.hypervisor in inputs.lost:
            continue
        actions.extend(_pod_actions(want, keepers.get(node), inputs.record, inputs.want, now, deadlines,
                                    unchecked))
    return Compared(actions, warnings, keepers, min(deadlines, default=None), tuple(unchecked))


def _keepers(inputs: ClusterInputs, desired: dict[str, DesiredPod], prune: bool, actions: list[Action],
             warnings: list[tuple[str, str]]) -> dict[str, ObservedPod]:
    """The observed pod kept for each desired node. `actions` gets the removal of the others (their node
    left the repo, moved or changed cluster, or they are duplicates); `warnings`, what pruning leaves."""
    keepers: dict[str, ObservedPod] = {}
    for node, pods in sorted(inputs.have.items()):
        want = desired.get(node)
        candidates = []
        for pod in pods:
            if want is None:
                if prune:
                    actions.append(_remove_pod(pod, f"Node {node} left the repo", prune=True, wipe=True,
                                               forget=True))
                else:
                    warnings.append((node, f"pod of Node {node} on {pod.hypervisor} is no longer in the repo; "
                                           "pruning is disabled, so it is left running"))
            elif pod.hypervisor != want.hypervisor:
                actions.append(_remove_pod(pod, f"Node {node} moved to hypervisor {want.hypervisor}", wipe=True))
            elif pod.cluster != want.cluster:
                actions.append(_remove_pod(pod, f"Node {node} now belongs to Cluster {want.cluster}"))
            else:
                candidates.append(pod)
        if want is None or not candidates:
            continue
        best = max(candidates, key=lambda p: (p.ready, p.spec_hash == want.sandbox.labels.get(SPEC_HASH), p.created_at))
        keepers[node] = best
        for pod in candidates:
            if pod is not best:
                actions.append(_remove_pod(pod, "duplicate pod of the same node"))
    return keepers


def _remove_pod(pod: ObservedPod, reason: str, prune: bool = False, wipe: bool = False,
                forget: bool = False) -> Action:
    """Remove a pod; `wipe`: the node leaves this hypervisor, so its files and etcd data go first."""
    agent = pod.running(AGENT) if wipe and pod.ready else None
    components = sorted((c for c in pod.containers if c.component != AGENT and c.state == "running"),
                        key=lambda c: (-c.created_at, c.id))
    return Action(Kind.REMOVE_POD, pod.hypervisor, pod.cluster, pod.node, reason=reason,
                  target_id=pod.sandbox_id, prune=prune,
                  payload=Remove(pod.sandbox_id, wipe_agent_id=agent.id if agent else "", forget=forget,
                                 stop_first=tuple(c.id for c in components)))


def _pod_actions(want: DesiredPod, have: ObservedPod | None, record: ClusterRecord | None,
                 cluster: DesiredCluster | None, now: dt.datetime, deadlines: list[dt.datetime],
                 unchecked: list[str]) -> list[Action]:
    """`unchecked` gets the node when its files could not be read (its running pod's files agent is not)."""
    base = dict(hypervisor=want.hypervisor, cluster=want.cluster, node=want.node)
    actions: list[Action] = []
    fresh = have is None or not have.ready or have.spec_hash != want.sandbox.labels.get(SPEC_HASH)
    if have is not None and fresh:
        why = "pod sandbox is not ready" if not have.ready else "pod identity changed"
        actions.append(_remove_pod(have, why))
    if fresh:
        actions.append(Action(Kind.CREATE_POD, **base, reason="pod does not exist" if have is None
                              else "replacing the pod", details=(f"files agent ({want.containers[0].spec.image})",),
                              payload=CreatePod(want.sandbox, want.containers[0].spec,
                                                tuple(sorted({c.spec.image for c in want.containers})),
                                                _bootstrap(want, record, cluster))))
        files: NodeFiles | None = NodeFiles()
        observed: list[ObservedContainer] = []
        pod = PodRef()
    else:
        assert have is not None
        files = have.files
        observed = list(have.containers)
        agent = have.running(AGENT)
        pod = PodRef(have.sandbox_id, agent.id if agent else "")
    if files is None and any(c.state == "running" and c.component != AGENT for c in observed):
        # components run on files its agent cannot read now: the agent starts again, the files wait for it
        unchecked.append(want.node)
        file_actions = []
    else:
        file_actions = _file_actions(want, files, record, now, base, pod, deadlines)
    actions.extend(file_actions)
    issued = {i.spec.name for a in file_actions if isinstance(a.payload, WriteFiles) for i in a.payload.certificates}
    # certificates re-issued on a running pod: every component that reads one restarts
    renewed = set() if fresh else issued
    desired_names = {c.spec.name for c in want.containers}
    for index, container in enumerate(want.containers):
        if fresh and index == 0:
            continue  # the agent comes with the pod
        mine = sorted((c for c in observed if c.component == container.spec.name), key=lambda c: c.created_at)
        certificates = certificates_read(want, container)
        digests = tuple(sorted((name, _digest_at_start(name, files, issued)) for name in certificates))
        reads = tuple(sorted(renewed & certificates))
        stale = _changed_since_start(mine, digests) if files is not None and not fresh else ()
        actions.extend(_container_actions(want, container, mine, index, base, pod, reads, digests, stale, files))
    for extra in observed:
        if extra.component not in desired_names:
            actions.append(Action(Kind.REMOVE_CONTAINER, **base, component=extra.component,
                                  reason="component is no longer part of this node", target_id=extra.id,
                                  payload=Remove(extra.id)))
    return actions


def _digest_at_start(name: str, files: NodeFiles | None, issued: set[str]) -> str:
    """The digest certificate `name`'s file will have when a container starting in this plan reads it:
    the observed one, or AFTER_APPLY when this plan issues it (or the files could not be read)."""
    if files is None or name in issued:
        return AFTER_APPLY
    return files.digests.get(f"{name}.crt", AFTER_APPLY)


def _changed_since_start(mine: list[ObservedContainer], digests: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The certificates whose files changed since the running container started (a run stopped between
    writing them and restarting their readers). A container that recorded none is not judged."""
    running = [c for c in mine if c.state == "running"]
    recorded = running[-1].read_certificates if running else None
    if not recorded:
        return ()
    return tuple(name for name, now in digests if now != AFTER_APPLY and recorded.get(name, now) != now)


def certificates_read(pod: DesiredPod, container: DesiredContainer) -> set[str]:
    """The pod's certificates a container reads: named in its arguments or in a file they name
    (a kubeconfig pointing at its client certificate)."""
    text = " ".join(container.spec.args)
    text += "".join(f.content for f in pod.files if f"{FILES}/{f.name}" in text)
    return {c.name for c in pod.certificates if f"{FILES}/{c.name}." in text}


def _bootstrap(want: DesiredPod, record: ClusterRecord | None, cluster: DesiredCluster | None) -> tuple[str, ...]:
    """A control plane with no etcd members yet: its first members start together."""
    if want.role != CONTROLPLANE or record is None or record.etcd_members or cluster is None:
        return ()
    return tuple(m.node for m in cluster.etcd_members)


def _container_actions(pod: DesiredPod, want: DesiredContainer, have: list[ObservedContainer], index: int,
                       base: dict, ref: PodRef, renewed: tuple[str, ...] = (),
                       certificates: tuple[tuple[str, str], ...] = (), stale: tuple[str, ...] = (),
                       files: NodeFiles | None = None) -> list[Action]:
    """A container missing, superseded, changed or not running; with no health gate (`gitops.plan.rollout`
    adds the one a change needs). `renewed`: certificates it reads that this plan re-issues; `stale`: ones
    written since it started; either restarts it when it runs. A running component that reloads in place
    (`RELOAD`) whose files alone changed is reloaded, unless `files` say it was reloaded to this spec."""
    name = want.spec.name
    pending = tuple(f for f in pod.files if not f.known) if not want.known else ()
    payload = CreateContainer(ref, pod.sandbox, want.spec, pending, certificates=certificates)
    if not have:
        return [Action(Kind.CREATE_CONTAINER, **base, component=name, order=index, reason="container is missing",
                       details=(want.spec.image,), payload=payload)]
    latest = have[-1]
    out = [Action(Kind.REMOVE_CONTAINER, **base, component=name, order=index, target_id=old.id,
                  reason="superseded container", payload=Remove(old.id)) for old in have[:-1]]
    if (latest.state == "running" and latest.spec_hash != want.spec_hash and want.known and not renewed
            and not stale and _files_alone_changed(latest.inputs, want.summary) and (command := want.reload)):
        marker = reload_marker(files, name, latest.id, want.spec_hash)
        if marker is not None:
            out.append(Action(Kind.RELOAD_CONTAINER, **base, component=name, order=index, target_id=latest.id,
                              reason="only the files it reads changed: it reloads them in place",
                              details=(*changed_fields(latest.inputs, want.summary), f"runs: {' '.join(command)}"),
                              payload=Reload(ref, latest.id, command, *marker)))
        return out
    if latest.spec_hash != want.spec_hash or ((renewed or stale) and latest.state == "running"):
        if latest.spec_hash != want.spec_hash:
            reason, what = "spec changed", changed_fields(latest.inputs, want.summary)
        elif renewed:
            reason, what = f"certificate {', '.join(renewed)} re-issued: restarts to read it", []
        else:
            reason, what = (f"certificate {', '.join(stale)} written since it started: restarts to read it",
                            [])
        out.append(Action(Kind.RECREATE_CONTAINER, **base, component=name, order=index, target_id=latest.id,
                          reason=reason, details=tuple(what), payload=payload))
    elif latest.state != "running":
        out.append(Action(Kind.RECREATE_CONTAINER, **base, component=name, order=index, target_id=latest.id,
                          reason=f"container is {latest.state}", payload=payload))
    return out


def _files_alone_changed(before: dict | None, after: dict) -> bool:
    """Whether a container's inputs differ in the contents of the files it reads alone (the same files)."""
    if before is None or before.get("files", {}).keys() != after["files"].keys():
        return False
    return {k: v for k, v in before.items() if k != "files"} == {k: v for k, v in after.items() if k != "files"}


def changed_fields(before: dict | None, after: dict) -> list[str]:
    """Human list of what differs between the recorded and the desired container inputs."""
    if before is None:
        return ["previous spec unknown"]
    from deepdiff import DeepDiff  # here: its import costs a quarter second of every cold `gitops plan`

    delta = DeepDiff(before, after, ignore_order=False, view="tree")
    paths: list[str] = []
    for change_type, items in sorted(delta.items()):
        for item in items:
            path = item.path(output_format="list")
            shown = _path_text(path)
            if change_type == "values_changed" and item.t2 == AFTER_APPLY:
                paths.append(f"{shown}: {AFTER_APPLY}")
            elif change_type == "values_changed" and _scalar(item.t1) and _scalar(item.t2):
                paths.append(f"{shown}: {_short(item.t1)} -> {_short(item.t2)}")
            elif "added" in change_type:
                paths.append(f"{shown}: added")
            elif "removed" in change_type:
                paths.append(f"{shown}: removed")
            else:
                paths.append(f"{shown}: changed")
    paths = sorted(set(paths))
    if len(paths) > MAX_LISTED_CHANGES:
        paths = paths[:MAX_LISTED_CHANGES] + [f"... and {len(paths) - MAX_LISTED_CHANGES} more"]
    return paths


def _path_text(path: list) -> str:
    parts = [p for p in path if p != "container"]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "spec"


def _scalar(value: object) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _file_actions(want: DesiredPod, files: NodeFiles | None, record: ClusterRecord | None, now: dt.datetime,
                  base: dict, pod: PodRef, deadlines: list[dt.datetime]) -> list[Action]:
    """`deadlines` gets, for each certificate found fine, when it enters its renewal window."""
    if files is None:  # nothing could be checked: everything is written again
        return [Action(Kind.WRITE_FILES, **base, reason="files agent is not running; files cannot be checked",
                       details=("verify and rewrite every file",),
                       payload=WriteFiles(pod, want.cluster,
                                          tuple(IssueCertificate(c, want.validity_days) for c in want.certificates),
                                          want.files))]
    keys = [k for k in want.keys if k.name not in files.keys]
    key_actions = []
    if keys:
        key_actions.append(Action(Kind.GENERATE_KEYS, **base, reason="keys missing on the hypervisor",
                                  details=tuple(f"{k.name}.key" for k in keys), payload=GenerateKeys(pod, tuple(keys))))
    details: list[str] = []
    issue: list[IssueCertificate] = []
    write = []
    chains = dict(want.chains)
    for cert in want.certificates:
        chain = chains.get(cert.name, "")
        problem = certificate_problem(cert, files, record.authorities[cert.signer].cert_pem
                                      if record and cert.signer in record.authorities else None,
                                      want.renew_before_days, now, deadlines, chain)
        if problem:
            details.append(f"certificate {cert.name}: {problem}")
            issue.append(IssueCertificate(cert, want.validity_days, chain))
    for spec in want.files:
        have = files.digests.get(spec.name)
        if spec.bundle is not None:
            details.append(f"file {spec.name}: {spec.bundle.describe()}")
        elif have is None:
            details.append(f"file {spec.name}: missing")
        elif have != spec.digest:
            details.append(f"file {spec.name}: content changed")
        else:
            continue
        write.append(spec)
    if details:
        key_actions.append(Action(Kind.WRITE_FILES, **base, reason=f"{len(details)} file(s) to write",
                                  details=tuple(details), payload=WriteFiles(pod, want.cluster, tuple(issue),
                                                                             tuple(write))))
    return key_actions


def certificate_problem(spec: CertificateSpec, files: NodeFiles, ca_pem: str | None, renew_before_days: int,
                        now: dt.datetime, deadlines: list[dt.datetime] | None = None, chain: str = "") -> str | None:
    """Why the node's copy of `spec` must be (re)issued, or None when it is fine (and then, in
    `deadlines`, when it enters its renewal window: the answer holds until then). `chain`: what must
    follow the certificate in its file (a CA rotation's cross-signed CA)."""
    pem = files.certificates.get(spec.name)
    if pem is None:
        return "missing"
    if spec.name not in files.keys:
        return "its key is missing"
    facts = certificate_facts(pem, ca_pem)
    if facts is None:
        return "unreadable"
    if not facts.signed:
        return "not signed by the current authority"
    tail = pem.split(_PEM_END, 1)[1].strip()
    if tail != chain.strip():
        return ("to be served with the new CA cross-signed by the old one (CA rotation)" if chain
                else "still served with the cross-signed CA of the CA rotation")
    renew_at = facts.not_after - dt.timedelta(days=renew_before_days)
    if now >= renew_at:
        return f"expires {facts.not_after:%Y-%m-%d} (renewal window {renew_before_days} days)"
    if facts.common_names != (spec.common_name,) or facts.organizations != tuple(sorted(spec.organizations)):
        return "subject changed"
    if facts.dns_names != tuple(sorted(spec.dns_names)) or facts.ip_addresses != tuple(sorted(spec.ip_addresses)):
        return "subject alternative names changed"
    if deadlines is not None:
        deadlines.append(renew_at)
    return None


__all__ = ["Compared", "DiffOptions", "compare",
           "certificate_problem", "certificates_read", "changed_fields"]
