"""A cluster's etcd rebuilt, planned as a person reads it first (pure): restored from a snapshot
(spec.restore), or recovered from its one surviving member (spec.recovery, decided before compile by
`gitops.plan.recovery`).

The restore is one `restore-etcd` action (stop the control plane, copy the snapshot to every member,
restore each member's data directory with a new cluster token, record the value) followed by the
cluster's containers started again by the ordinary diff, compared against the cluster as the restore
leaves it (its control-plane containers gone): the etcd members first, the last one waiting for a
quorum, then each API server waiting for its /readyz, then the controller-managers and schedulers.
The restore waits, with a warning saying why, until it can run whole: the snapshot listed and found,
every member's pod and files agent running on a reachable hypervisor, no membership change under way.
"""
from __future__ import annotations

import dataclasses

from gitops.backup.snapshot import Snapshot
from gitops.compile.desired import DesiredPod
from gitops.model.components import APISERVER, ETCD, restore_stopped
from gitops.model.resources import LATEST
from gitops.observe.types import ObservedPod
from gitops.plan.actions import Action, Kind
from gitops.plan.inputs import ClusterInputs
from gitops.plan.payloads import (
    ApiReady,
    CreateContainer,
    EtcdHealth,
    PodRef,
    RecoverEtcd,
    RestoreEtcd,
    RestoreMember,
)
from gitops.pods import (
    AGENT,
    AGENT_ROOT,
    BEFORE_RESTORE,
    RESTORE_DATA,
    RESTORE_LABEL,
    RESTORE_SNAPSHOT,
    RESTORER,
)
from gitops.cri.types import ContainerSpec

#: what a restore stops and starts again, in the order it stops them (etcd last): from the component registry
STOPPED = restore_stopped()


def pending(inputs: ClusterInputs) -> str:
    """The spec.restore.snapshot value to restore now ("" when none is pending)."""
    want, record = inputs.want, inputs.record
    if want is None or want.restore is None or want.backup is None or record is None:
        return ""
    return want.restore.snapshot if record.restore_pending(want.restore.snapshot) else ""


def chosen(value: str, snapshots: tuple[Snapshot, ...]) -> Snapshot | None:
    """The snapshot `value` names: the newest for `latest`, else the one whose id starts with it."""
    if value == LATEST:
        return snapshots[-1] if snapshots else None
    found = [s for s in snapshots if s.id.startswith(value)]
    return found[0] if len(found) == 1 else None


def stopped_view(inputs: ClusterInputs) -> ClusterInputs:
    """The cluster as the restore leaves it: its members' control-plane containers gone."""
    members = set(inputs.record.etcd_members if inputs.record else ())
    have = {node: [dataclasses.replace(p, containers=tuple(c for c in p.containers if c.component not in STOPPED))
                   if node in members else p for p in pods] for node, pods in inputs.have.items()}
    return dataclasses.replace(inputs, have=have)


def hold(inputs: ClusterInputs, value: str) -> str:
    """Why the restore of `value` cannot run now ("" when it can)."""
    want, record = inputs.want, inputs.record
    assert want is not None and record is not None and want.backup is not None
    what = f"cluster {inputs.cluster}: spec.restore.snapshot {value} waits:"
    listing = inputs.snapshots
    if listing is None:
        return f"{what} the snapshots of backup target {want.backup.target} were not listed (an offline plan)"
    if listing.error:
        return f"{what} cannot list the snapshots of backup target {listing.target}: {listing.error}"
    if chosen(value, listing.snapshots) is None:
        listed = ", ".join(s.short_id for s in listing.snapshots[-5:]) or "none"
        return (f"{what} no {'snapshot' if value == LATEST else f'single snapshot {value}'} of it in backup target "
                f"{listing.target} (newest: {listed}; `gitops backup list`)")
    members = sorted(m.node for m in want.etcd_members)
    if members != sorted(record.etcd_members) or record.etcd_learners:
        return (f"{what} its etcd membership is changing (recorded {', '.join(record.etcd_members)}, wanted "
                f"{', '.join(members)}): the restore runs once the members are the ones the repo asks for")
    down = sorted(inputs.down)
    if down:
        return f"{what} hypervisor(s) {', '.join(down)} cannot be reached"
    missing = [n for n in members if _agent(inputs.have.get(n, [])) is None]
    if missing:
        return f"{what} the pod or files agent of {', '.join(missing)} is not running"
    return ""


def _agent(pods: list[ObservedPod]) -> tuple[ObservedPod, str] | None:
    """The node's pod whose files agent runs, and the agent's id."""
    for pod in pods:
        agent = pod.running(AGENT)
        if agent is not None:
            return pod, agent.id
    return None


def restore_action(inputs: ClusterInputs, value: str) -> Action:
    """The `restore-etcd` action of a restore `hold` lets run."""
    want, record, listing = inputs.want, inputs.record, inputs.snapshots
    assert want is not None and record is not None and listing is not None and want.backup is not None
    snapshot = chosen(value, listing.snapshots)
    assert snapshot is not None
    token = f"gitops-{inputs.cluster}-restore-{snapshot.short_id}"
    initial = ",".join(f"{m.node}={m.peer_url}" for m in want.etcd_members)
    pods = {p.node: p for p in inputs.wants}
    members, stop = [], {name: [] for name in STOPPED}
    for m in want.etcd_members:
        found = _agent(inputs.have[m.node])
        assert found is not None
        pod, agent_id = found
        members.append(RestoreMember(m.node, pod.hypervisor, PodRef(pod.sandbox_id, agent_id), pods[m.node].sandbox,
                                     m.peer_url, _restorer(pods[m.node], m.node, m.peer_url, initial, token)))
        for p in inputs.have[m.node]:
            for c in p.containers:
                if c.component in stop:
                    stop[c.component].append((p.hypervisor, c.id))
    stopping = tuple(item for name in STOPPED for item in sorted(stop[name]))
    nodes = ", ".join(m.node for m in members)
    size = f"{snapshot.bytes / 1048576:.1f} MiB"
    when = snapshot.time.isoformat(timespec="seconds")
    details = (
        f"snapshot {snapshot.short_id} of backup target {listing.target}: taken {when} at revision "
        f"{snapshot.revision} from {snapshot.member} ({size})",
        f"LOST: every change to the cluster's API after {when} (revision {snapshot.revision}): objects written "
        "since are gone, objects deleted since are back",
        f"copies the snapshot to each member, then stops every API server, controller-manager and scheduler, "
        f"then every etcd member ({nodes}): "
        "the cluster's API is down until they start again below: every etcd member, then each API server, "
        "controller-manager and scheduler",
        f"restores each member's data directory with the new cluster token {token} "
        f"(its old data kept as {BEFORE_RESTORE} in the node's directory until the next restore)",
        f"records spec.restore.snapshot {value} as restored: it runs once (to restore again, name another "
        "snapshot)",
    )
    reason = f"spec.restore.snapshot: {value}" + (f" (the newest: {snapshot.short_id})" if value == LATEST else "")
    payload = RestoreEtcd(listing.target, snapshot.id, token, initial, tuple(members), stopping, value)
    return Action(Kind.RESTORE_ETCD, "", inputs.cluster, "", reason=reason, details=details, payload=payload)


def _restorer(pod: DesiredPod, node: str, peer_url: str, initial: str, token: str) -> ContainerSpec:
    """The one-shot container that writes the member's restored data directory: the cluster's etcd
    image (etcdutl is in it: etcd 3.6 removed `etcdctl snapshot restore`), the node's directory mounted where
    the files agent sees it."""
    etcd = next(c.spec for c in pod.containers if c.spec.name == ETCD)
    agent = next(c.spec for c in pod.containers if c.spec.name == AGENT)
    mount = next(m for m in agent.mounts if m.container_path == AGENT_ROOT)
    return ContainerSpec(
        name=RESTORER, image=etcd.image, command=("etcdutl",),
        args=("snapshot", "restore", RESTORE_SNAPSHOT, "--name", node, "--initial-cluster", initial,
              "--initial-cluster-token", token, "--initial-advertise-peer-urls", peer_url,
              "--data-dir", RESTORE_DATA),
        mounts=(mount,), labels={RESTORE_LABEL: node}, log_path=f"{RESTORER}.log")


def restart_gates(inputs: ClusterInputs, actions: list[Action], timeout: int) -> list[Action]:
    """The restored control plane's starts, ordered as the restore needs them: component by component
    across the members (every etcd, then the API servers...), the last etcd member waiting until the
    members have a quorum, each API server until its /readyz answers ok."""
    members = set(inputs.record.etcd_members if inputs.record else ())
    pods = {p.node: p for p in inputs.wants}
    etcds = sorted(a.node for a in actions if _restarts(a, members) and a.component == ETCD)
    out = []
    for action in actions:
        if _restarts(action, members):
            payload, details = action.payload, action.details
            assert isinstance(payload, CreateContainer)
            if action.component == ETCD and etcds and action.node == etcds[-1]:
                url = next(m.client_url for m in inputs.want.etcd_members if m.node == action.node)
                payload = dataclasses.replace(payload, etcd=EtcdHealth(url, (), timeout))
                details = (*details, f"the last member: waits until the members have a quorum (its health answers, "
                                     f"up to {timeout}s)")
            elif action.component == APISERVER and pods[action.node].api_url:
                payload = dataclasses.replace(payload, ready=ApiReady(f"{pods[action.node].api_url}/readyz", timeout))
                details = (*details, f"waits until its /readyz answers ok (up to {timeout}s)")
            action = dataclasses.replace(action, anchor=Kind.RECREATE_CONTAINER, reason="started again after the "
                                         "restore", details=details, payload=payload)
        out.append(action)
    return out


def _restarts(action: Action, members: set[str]) -> bool:
    return action.kind == Kind.CREATE_CONTAINER and action.node in members and action.component in STOPPED


# ------------------------------------------------------------------------------ recovery


def survivor_view(inputs: ClusterInputs) -> ClusterInputs:
    """The cluster as a recovery (`gitops.plan.recovery`) leaves it: its survivor's etcd container gone (the
    recovery starts it again)."""
    survivor = inputs.record.forcing if inputs.record else ""
    have = {node: [dataclasses.replace(p, containers=tuple(c for c in p.containers if c.component != ETCD))
                   if node == survivor else p for p in pods] for node, pods in inputs.have.items()}
    return dataclasses.replace(inputs, have=have)


def recover_action(inputs: ClusterInputs, actions: list[Action], timeout: int) -> list[Action]:
    """`actions` (planned against `survivor_view(inputs)`) with the survivor's etcd start made the recovery,
    which first removes the etcd containers `inputs` observed there."""
    record, want = inputs.record, inputs.want
    assert record is not None and want is not None
    survivor = record.forcing
    start = next((a for a in actions if a.kind == Kind.CREATE_CONTAINER and a.node == survivor
                  and a.component == ETCD), None)
    member = next((m for m in want.etcd_members if m.node == survivor), None)
    if start is None or member is None:
        return actions
    assert isinstance(start.payload, CreateContainer)
    stop = tuple(c.id for p in inputs.have.get(survivor, []) for c in p.containers if c.component == ETCD)
    others = ", ".join(m.node for m in want.etcd_members if m.node != survivor) or "none"
    recover = Action(
        Kind.RECOVER_ETCD, start.hypervisor, inputs.cluster, survivor, order=start.order,
        reason=f"spec.recovery.forceNewClusterFrom: {survivor}: its etcd lost its quorum for good",
        details=(f"restarts etcd on {survivor} once with --force-new-cluster: a one-member cluster on its own data "
                 "(writes it had not received are lost), healthy within "
                 f"{timeout}s", "then restarts it as usual, healthy again",
                 f"records spec.recovery.forceNewClusterFrom {survivor} as done; the other members ({others}) "
                 "join again below, one at a time, as learners"),
        payload=RecoverEtcd(start.payload, stop, member.client_url, timeout, survivor))
    return [recover if a is start else a for a in actions]
