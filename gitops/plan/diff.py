"""Desired against observed: an ordered `Plan` of typed actions (pure).

Rules that keep a reconciler safe:
* nothing is planned on an unreachable hypervisor, deletions least of all;
* only objects carrying the managed-by label are ever touched;
* an object whose Node left the repo is removed only when pruning is enabled,
  and such removals count against the mass-delete threshold;
* a container is recreated when anything it runs with changed, and the
  reason names the changed fields (deepdiff of the recorded spec).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from deepdiff import DeepDiff

from gitops.compile.components import SHUTDOWN_DELAY
from gitops.compile.desired import (
    AFTER_APPLY,
    CertificateSpec,
    DesiredCluster,
    DesiredContainer,
    DesiredPod,
    DesiredState,
)
from gitops.memo import Memo, key_of
from gitops.model.resources import CONTROLPLANE
from gitops.node import AGENT, FILES, SPEC_HASH, NodeFiles
from gitops.observe import ObservedContainer, ObservedPod, ObservedState
from gitops.pki.facts import certificate_facts
from gitops.plan.actions import Action, Kind, Plan, Unknown, UnknownKind, ordered
from gitops.plan.payloads import (
    ApiReady,
    CreateContainer,
    CreatePod,
    EtcdHealth,
    EtcdMemberChange,
    GenerateKeys,
    IssueCertificate,
    PodRef,
    Remove,
    WriteFiles,
)
from gitops.state.records import ClusterRecord, State

MAX_LISTED_CHANGES = 6
#: the ingress component, and how long a new one runs beside the one it replaces
INGRESS = "haproxy"
INGRESS_OVERLAP = 2
_PEM_END = "-----END CERTIFICATE-----"


@dataclass(frozen=True)
class DiffOptions:
    prune: bool = True
    #: seconds an etcd step or an API server replacement waits for health (spec.rollout.healthTimeoutSeconds)
    health_timeout: int = 60


def diff(desired: DesiredState, observed: ObservedState, state: State, options: DiffOptions,
         now: dt.datetime | None = None) -> Plan:
    """Every cluster's actions (its pods, files, containers and etcd membership), each cluster diffed
    once per content of its inputs (see `ClusterInputs`), plus what is unknown."""
    now = now or dt.datetime.now(dt.timezone.utc)
    down = set(observed.unreachable)
    unknowns = tuple(unreachable(name, observed, desired, state) for name in sorted(down))
    actions: list[Action] = []
    warnings: list[tuple[str, str]] = []
    settings = repr(options)
    unchecked: list[str] = []
    for inputs in cluster_inputs(desired, observed, state, down):
        part = CLUSTER_DIFFS.get(inputs.key(settings), lambda: _cluster_diff(inputs, options, now),
                                 fresh=lambda part: part.fresh_at(now))
        actions.extend(part.actions)
        warnings.extend(part.warnings)
        unchecked.extend(part.unchecked)
    warnings.sort(key=lambda item: item[0])  # by node, as the pods were walked
    if unchecked:
        unknowns += (Unknown(UnknownKind.NODE_FILES, "files agent", nodes=tuple(sorted(unchecked))),)
    return Plan(actions=ordered(actions), warnings=tuple(text for _, text in warnings), unknowns=unknowns)


@dataclass(slots=True)
class ClusterInputs:
    """Everything the diff of one cluster reads: its desired pods and members, the observed pods of its
    nodes (and of nodes that left the repo but were labeled with it), its record, the hypervisors its
    recorded etcd members were placed on, and which of the hypervisors it involves are unreachable."""

    cluster: str
    wants: list[DesiredPod]  # by node
    want: DesiredCluster | None
    #: observed pods by node, each node's pods in observation order
    have: dict[str, list[ObservedPod]]
    record: ClusterRecord | None
    members_on: tuple[tuple[str, str], ...]  # (recorded etcd member, its recorded hypervisor)
    down: frozenset[str]

    def key(self, settings: str) -> bytes:
        """A digest of the inputs (`settings`: the diff options as text): content digests of the pods
        and members (each computed once per object), the parts of the record the diff reads."""
        record = self.record
        parts = [settings, self.cluster, self.want.content_digest if self.want is not None else None]
        if record is not None:
            parts.append("\n".join(record.etcd_members))
            for role, authority in sorted(record.authorities.items()):
                parts += (role, authority.cert_pem)
        parts.append(repr((self.members_on, sorted(self.down))))
        parts += [p.content_digest for p in self.wants]
        for node in sorted(self.have):
            parts.append(f"{node}:{len(self.have[node])}")
            parts += [p.content_digest for p in self.have[node]]
        return key_of(*parts)


def cluster_inputs(desired: DesiredState, observed: ObservedState, state: State,
                   down: set[str]) -> list[ClusterInputs]:
    """The diff's inputs split by cluster. An observed pod goes with its node's desired cluster, or,
    when its node left the repo, with the cluster it is labeled with."""
    wants: dict[str, list[DesiredPod]] = {}
    for pod in desired.pods.values():
        wants.setdefault(pod.cluster, []).append(pod)
    have: dict[str, dict[str, list[ObservedPod]]] = {}
    pods = desired.pods
    for hv in observed.hypervisors.values():
        for seen in hv.pods:
            want = pods.get(seen.node)
            have.setdefault(want.cluster if want else seen.cluster, {}).setdefault(seen.node, []).append(seen)
    out = []
    nodes = state.nodes
    for cluster in sorted(wants.keys() | have.keys() | state.clusters.keys()):
        record = state.clusters.get(cluster)
        members_on = () if record is None else tuple(
            (n, nodes[n].hypervisor if n in nodes else "") for n in record.etcd_members)
        mine = wants.get(cluster, [])
        involved = frozenset()
        if down:
            involved = frozenset(down & ({p.hypervisor for p in mine} | {hv for _, hv in members_on}))
        out.append(ClusterInputs(cluster, mine, desired.clusters.get(cluster), have.get(cluster, {}), record,
                                 members_on, involved))
    return out


@dataclass(frozen=True)
class ClusterDiff:
    """One cluster's actions and (node, warning)s, valid from `since` until `until` (the first moment a
    certificate found fine enters its renewal window; None: no certificate involved)."""

    actions: tuple[Action, ...]
    warnings: tuple[tuple[str, str], ...]
    since: dt.datetime
    until: dt.datetime | None
    #: nodes whose files were not checked: their files agent starts again in this plan
    unchecked: tuple[str, ...] = ()

    def fresh_at(self, now: dt.datetime) -> bool:
        return self.since <= now and (self.until is None or now < self.until)


#: per-cluster diffs by a digest of their inputs: a plan diffs again only the clusters that changed
CLUSTER_DIFFS: Memo[bytes, ClusterDiff] = Memo(maxsize=1 << 16)


def _cluster_diff(inputs: ClusterInputs, options: DiffOptions, now: dt.datetime) -> ClusterDiff:
    actions: list[Action] = []
    warnings: list[tuple[str, str]] = []
    deadlines: list[dt.datetime] = []
    unchecked: list[str] = []
    desired = {p.node: p for p in inputs.wants}

    # Pods whose node left the repo, moved, or are duplicates.
    keepers: dict[str, ObservedPod] = {}
    for node, pods in sorted(inputs.have.items()):
        want = desired.get(node)
        candidates = []
        for pod in pods:
            if want is None:
                if options.prune:
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

    serving = _has_quorum(inputs)
    for node, want in sorted(desired.items()):
        if want.hypervisor in inputs.down:
            continue
        actions.extend(_pod_actions(want, keepers.get(node), inputs.record, inputs.want, now, options, deadlines,
                                    unchecked, serving))

    actions.extend(_etcd_membership(inputs, options.health_timeout))
    actions = _drain_api_servers(inputs, actions, keepers, options.health_timeout)
    actions, held = _hold_votes(inputs, actions)
    warnings.extend(held)
    actions, held = _hold_quorum(inputs, actions)
    warnings.extend(held)
    actions = _leadership_order(actions)
    return ClusterDiff(tuple(actions), tuple(warnings), now, min(deadlines, default=None), tuple(unchecked))


def _has_quorum(inputs: ClusterInputs) -> bool:
    """Whether more than half of the recorded etcd members run: the cluster serves, so a new API server
    must be ready before anything routes to it (while it bootstraps or restarts from nothing, its API
    servers become ready only once the members later in the plan run)."""
    members = set(inputs.record.etcd_members) if inputs.record else set()
    return bool(members) and len(_etcd_running(inputs) & members) * 2 > len(members)


def _etcd_running(inputs: ClusterInputs) -> set[str]:
    """The nodes of the cluster with an etcd container running (as observed)."""
    return {node for node, pods in inputs.have.items() if any(p.running("etcd") is not None for p in pods)}


_MEMBERSHIP = (Kind.ETCD_MEMBER_ADD, Kind.ETCD_MEMBER_PROMOTE, Kind.ETCD_MEMBER_REMOVE)
#: the component that talks to its node's etcd member only (`--etcd-servers`)
APISERVER = "kube-apiserver"


def _rolls_member(action: Action) -> bool:
    """Whether `action` replaces a running etcd member of a serving cluster (health-gated: needs quorum)."""
    return (action.kind == Kind.RECREATE_CONTAINER and action.component == "etcd"
            and isinstance(action.payload, CreateContainer) and action.payload.etcd is not None)


def _hold_votes(inputs: ClusterInputs, actions: list[Action]) -> tuple[list[Action], list[tuple[str, str]]]:
    """While a recorded etcd member is on an unreachable hypervisor, its vote cannot be counted on: no node
    of the cluster gets a change that needs quorum (a membership change, a running etcd replaced, a member's
    pod removed). Those nodes' actions wait; the cluster's other changes and other clusters go ahead."""
    away = sorted(n for n, hv in inputs.members_on if hv in inputs.down)
    if not away:
        return actions, []
    recorded = {n for n, _ in inputs.members_on}

    def needs_votes(a: Action) -> bool:
        return (a.kind in _MEMBERSHIP
                or (a.kind == Kind.REMOVE_POD and a.node in recorded)
                or _rolls_member(a))

    waiting = sorted({a.node for a in actions if needs_votes(a)})
    if not waiting:
        return actions, []
    kept = [a for a in actions if a.node not in waiting]
    where = ", ".join(f"{n} on {hv}" for n, hv in inputs.members_on if n in away)
    return kept, [(waiting[0], f"cluster {inputs.cluster}: etcd member {where} is unreachable, so no change that "
                               f"needs its vote is made: {len(actions) - len(kept)} action(s) on "
                               f"{', '.join(waiting)} wait until it answers")]


def _drain_api_servers(inputs: ClusterInputs, actions: list[Action], keepers: dict[str, ObservedPod],
                       timeout: int) -> list[Action]:
    """Each API server uses only its own node's etcd member, so before that member goes away (a running
    member's recreate, a member's removal) the API server stops (gracefully: it leaves the ingress, and
    no request of it meets its member shutting down), and after a recreate it starts again, ready before
    the plan goes on. An API server change of the same plan is made by that start (node by node: etcd
    member, then its API server); a missing or exited one is started after the member, not before."""
    out: list[Action] = []
    desired = {p.node: p for p in inputs.wants}
    own = {a.node: a for a in actions if a.component == APISERVER
           and a.kind in (Kind.CREATE_CONTAINER, Kind.RECREATE_CONTAINER)}
    taken: set[int] = set()
    for action in actions:
        if action.kind == Kind.ETCD_MEMBER_REMOVE:
            out.extend(_before_removal(action, inputs.have.get(action.node, ())))
        elif _rolls_member(action):
            steps, used = _around_member(action, own.get(action.node), desired.get(action.node),
                                         keepers.get(action.node), timeout)
            out.extend(steps)
            if used is not None:
                taken.add(id(used))
            continue
        out.append(action)
    return [a for a in out if id(a) not in taken]


def _before_removal(removal: Action, pods: list[ObservedPod]) -> list[Action]:
    """The leaving member's running API server stopped right before the member is removed."""
    if not isinstance(removal.payload, EtcdMemberChange):
        return []
    staying = EtcdHealth("", removal.payload.client_urls, removal.payload.timeout)
    return [Action(Kind.REMOVE_CONTAINER, pod.hypervisor, removal.cluster, removal.node, component=APISERVER,
                   anchor=removal.kind, step=-1, target_id=running.id,
                   reason="its etcd member (the only one it talks to) leaves next",
                   details=(_healthy_first(staying), _GRACEFUL_STOP), payload=Remove(running.id, etcd=staying))
            for pod in pods if (running := pod.running(APISERVER)) is not None]


def _healthy_first(members: EtcdHealth) -> str:
    count = len(members.peers) + bool(members.client_url)
    return f"the {count} etcd member(s) healthy first (up to {members.timeout}s)"


_GRACEFUL_STOP = (f"stops gracefully: fails /readyz for {SHUTDOWN_DELAY}s first, so the ingress takes it out "
                  "before it closes")


def _around_member(etcd: Action, change: Action | None, want: DesiredPod | None, have: ObservedPod | None,
                   timeout: int) -> tuple[list[Action], Action | None]:
    """A running etcd member's recreate, with its node's API server stopped before (if it runs) and
    started after; `change`: that API server's own action in this plan (a recreate, or the start of a
    missing one), made by the start after the member and so returned as used."""
    running = have.running(APISERVER) if have is not None else None
    container = next((c for c in want.containers if c.spec.name == APISERVER), None) if want else None
    if container is None or want is None or not want.api_url:
        return [etcd], None
    place = dict(anchor=etcd.kind, order=etcd.order)
    if running is None:  # not running: only its own change, if any, waits until after the member
        return ([etcd, dataclasses.replace(change, **place, step=1)], change) if change is not None else ([etcd], None)
    around = dict(hypervisor=etcd.hypervisor, cluster=etcd.cluster, node=etcd.node, component=APISERVER, **place)
    target = change.target_id if change is not None and change.target_id else running.id
    members = etcd.payload.etcd  # type: ignore[union-attr]
    stop = Action(Kind.REMOVE_CONTAINER, **around, step=-1, target_id=target, payload=Remove(target, etcd=members),
                  reason="its etcd member (the only one it talks to) is recreated next",
                  details=(_healthy_first(members), _GRACEFUL_STOP))
    ready = ApiReady(f"{want.api_url}/readyz", timeout)
    if change is not None and isinstance(change.payload, CreateContainer):
        payload = change.payload if change.payload.ready is not None else dataclasses.replace(change.payload,
                                                                                                ready=ready)
        gate = () if change.payload.ready is not None else (_ready_gate(ready),)
        reason, details = f"{change.reason}; starts after its etcd member", (*change.details, *gate)
    else:
        reason, details = "starts again after its etcd member, unchanged", (_ready_gate(ready),)
        payload = CreateContainer(etcd.payload.pod, want.sandbox, container.spec,  # type: ignore[union-attr]
                                  tuple(f for f in want.files if not f.known) if not container.known else (),
                                  ready=ready)
    start = Action(Kind.CREATE_CONTAINER, **around, step=1, reason=reason, details=details, payload=payload)
    return [stop, etcd, start], change


def _leadership_order(actions: list[Action]) -> list[Action]:
    """Each running etcd member this plan replaces, if it leads when its turn comes, hands leadership to a
    member already replaced (the latest first), else to one the plan leaves alone, else to the one replaced
    last: so a roll moves leadership once, or twice when the first one replaced leads."""
    rolls = sorted(filter(_rolls_member, actions), key=Action.sort_key)
    if not rolls:
        return actions
    urls = [a.payload.etcd.client_url for a in rolls]  # type: ignore[union-attr]
    preferred = {}
    for i, action in enumerate(rolls):
        etcd = action.payload.etcd  # type: ignore[union-attr]
        prefer = (*reversed(urls[:i]), *(u for u in etcd.peers if u not in urls), *reversed(urls[i + 1:]))
        payload = dataclasses.replace(action.payload, etcd=dataclasses.replace(etcd, prefer=prefer))
        hand_off = (f"if it leads etcd then, leadership first moves to {prefer[0]}",) if prefer else ()
        preferred[id(action)] = dataclasses.replace(action, payload=payload, details=(*action.details, *hand_off))
    return [preferred.get(id(a), a) for a in actions]


def _hold_quorum(inputs: ClusterInputs, actions: list[Action]) -> tuple[list[Action], list[tuple[str, str]]]:
    """A member is removed only if the members that stay keep a quorum of running ones (removals taken in
    plan order, each counting the ones before it). A removal that would break quorum is refused at plan
    time: it and the rest of its node's actions (its pod's removal) wait, with a warning naming the
    members that must run again first."""
    removals = [a for a in actions if a.kind == Kind.ETCD_MEMBER_REMOVE]
    if not removals or inputs.record is None:
        return actions, []
    running = _etcd_running(inputs)
    current = list(inputs.record.etcd_members)
    waiting: set[str] = set()
    held: list[tuple[str, str]] = []
    for action in removals:
        after = [m for m in current if m != action.node]
        alive = [m for m in after if m in running]
        quorum = len(after) // 2 + 1
        if len(alive) < quorum:
            waiting.add(action.node)
            down = sorted(set(after) - running)
            held.append((action.node, f"cluster {inputs.cluster}: removing etcd member {action.node} would leave "
                                      f"{len(alive)} of {len(after)} members running, below the quorum of {quorum}, "
                                      f"so it is not removed: {', '.join(down)} must run again first"))
            continue
        current = after
    return [a for a in actions if a.node not in waiting], held


def unreachable(name: str, observed: ObservedState, desired: DesiredState, state: State) -> Unknown:
    """An unreachable hypervisor: the nodes placed there, and those recorded there that left the repo."""
    nodes = {p.node for p in desired.on(name)}
    nodes |= {node for node, record in state.nodes.items() if record.hypervisor == name}
    return Unknown(UnknownKind.HYPERVISOR, name, observed.hypervisors[name].error, tuple(sorted(nodes)))


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
                 cluster: DesiredCluster | None, now: dt.datetime, options: DiffOptions,
                 deadlines: list[dt.datetime], unchecked: list[str], serving: bool = False) -> list[Action]:
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
    # certificates re-issued on a running pod: every component that reads one restarts (rolling, gated)
    renewed = set() if fresh else issued
    desired_names = {c.spec.name for c in want.containers}
    for index, container in enumerate(want.containers):
        if fresh and index == 0:
            continue  # the agent comes with the pod
        mine = sorted((c for c in observed if c.component == container.spec.name), key=lambda c: c.created_at)
        etcd = _etcd_health(want, container, record, cluster, options) if container.spec.name == "etcd" else None
        ready = ApiReady(f"{want.api_url}/readyz", options.health_timeout) \
            if container.spec.name == APISERVER and want.api_url else None
        certificates = certificates_read(want, container)
        digests = tuple(sorted((name, _digest_at_start(name, files, issued)) for name in certificates))
        reads = tuple(sorted(renewed & certificates))
        stale = _changed_since_start(mine, digests) if files is not None and not fresh else ()
        changes = _container_actions(want, container, mine, index, base, pod, etcd, ready, reads, serving,
                                     digests, stale)
        if index == 0:  # the files agent: keys and files go through it, so it (re)starts before them
            changes = [dataclasses.replace(a, anchor=Kind.CREATE_POD, step=1) if a.kind != Kind.REMOVE_CONTAINER
                       else a for a in changes]
        actions.extend(changes)
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


def _ready_gate(ready: ApiReady) -> str:
    return f"one at a time: waits until its /readyz answers ok (up to {ready.timeout}s)"


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


def _etcd_health(pod: DesiredPod, container: DesiredContainer, record: ClusterRecord | None,
                 cluster: DesiredCluster | None, options: DiffOptions) -> EtcdHealth | None:
    """A running cluster's etcd member: the others must be healthy before its container changes, and it
    after. None while the cluster bootstraps (its members start together) or for a joining learner
    (its promotion waits for it)."""
    if record is None or cluster is None or pod.node not in record.etcd_members:
        return None
    members = {m.node: m for m in cluster.etcd_members}
    if pod.node not in members:
        return None
    peers = tuple(m.client_url for n, m in sorted(members.items()) if n in record.etcd_members and n != pod.node)
    return EtcdHealth(members[pod.node].client_url, peers, options.health_timeout)


def _container_actions(pod: DesiredPod, want: DesiredContainer, have: list[ObservedContainer], index: int,
                       base: dict, ref: PodRef, etcd: EtcdHealth | None = None,
                       ready: ApiReady | None = None, renewed: tuple[str, ...] = (),
                       serving: bool = False, certificates: tuple[tuple[str, str], ...] = (),
                       stale: tuple[str, ...] = ()) -> list[Action]:
    """`etcd`: the member's health gate, used when a running etcd is replaced (a deliberate disruption);
    `ready`: the same for a running API server, which must be ready again before the next one goes,
    and for a new one while the cluster `serving`, ready before the ingress is given it.
    A missing or exited etcd is started without one: it is down already, and waiting for quorum
    before starting it could wait for members that only start later in the plan. A running ingress
    haproxy is replaced by one started beside it (`CreateContainer.overlap`). `renewed`: certificates it
    reads that this plan re-issues; `stale`: ones written since it started; either restarts it."""
    name = want.spec.name
    pending = tuple(f for f in pod.files if not f.known) if not want.known else ()
    payload = CreateContainer(ref, pod.sandbox, want.spec, pending, certificates=certificates)
    if not have:
        details: tuple[str, ...] = (want.spec.image,)
        if ready is not None and serving:
            payload = dataclasses.replace(payload, ready=ready)
            details += (f"the cluster serves: waits until its /readyz answers ok (up to {ready.timeout}s)",)
        return [Action(Kind.CREATE_CONTAINER, **base, component=name, order=index, reason="container is missing",
                       details=details, payload=payload)]
    latest = have[-1]
    out = [Action(Kind.REMOVE_CONTAINER, **base, component=name, order=index, target_id=old.id,
                  reason="superseded container", payload=Remove(old.id)) for old in have[:-1]]
    if latest.spec_hash != want.spec_hash or ((renewed or stale) and latest.state == "running"):
        gate: tuple[str, ...] = ()
        if etcd is not None and latest.state == "running":
            payload = dataclasses.replace(payload, etcd=etcd)
            gate = (f"one member at a time: the {len(etcd.peers)} other member(s) healthy before, this one "
                    f"healthy after (up to {etcd.timeout}s each)",)
        if ready is not None and latest.state == "running":
            payload = dataclasses.replace(payload, ready=ready)
            gate = (_ready_gate(ready),)
        if name == INGRESS and pod.role != CONTROLPLANE and latest.state == "running":
            payload = dataclasses.replace(payload, overlap=INGRESS_OVERLAP)
            gate = (f"started beside the running one, which soft-stops {INGRESS_OVERLAP}s later: the port "
                    "never closes",)
        if latest.spec_hash != want.spec_hash:
            reason, what = "spec changed", changed_fields(latest.inputs, want.summary)
        elif renewed:
            reason, what = f"certificate {', '.join(renewed)} re-issued: restarts to read it", []
        else:
            reason, what = (f"certificate {', '.join(stale)} written since it started: restarts to read it",
                            [])
        out.append(Action(Kind.RECREATE_CONTAINER, **base, component=name, order=index, target_id=latest.id,
                          reason=reason, details=(*what, *gate), payload=payload))
    elif latest.state != "running":
        out.append(Action(Kind.RECREATE_CONTAINER, **base, component=name, order=index, target_id=latest.id,
                          reason=f"container is {latest.state}", payload=payload))
    return out


def changed_fields(before: dict | None, after: dict) -> list[str]:
    """Human list of what differs between the recorded and the desired container inputs."""
    if before is None:
        return ["previous spec unknown"]
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


def _etcd_membership(inputs: ClusterInputs, timeout: int) -> list[Action]:
    """Members join and leave one at a time, around their pods; a new member joins as a learner
    and is promoted right after its etcd container started and caught up (etcd 3.4+)."""
    actions: list[Action] = []
    record, cluster, down = inputs.record, inputs.cluster, inputs.down
    recorded = list(record.etcd_members) if record else []
    if not recorded:
        return actions  # not bootstrapped yet: the first members start together
    members = {m.node: m for m in inputs.want.etcd_members} if inputs.want else {}
    if not members:
        return actions  # the whole control plane goes: its pods are removed, etcd with them
    location = {p.node: p.hypervisor for p in inputs.wants}
    order = {p.node: next((i for i, c in enumerate(p.containers) if c.spec.name == "etcd"), 0)
             for p in inputs.wants}
    placed_on = dict(inputs.members_on)

    def ask(exclude: str) -> tuple[str, ...]:
        """The client URLs of the members that stay, the changing one excluded."""
        return tuple(m.client_url for n, m in sorted(members.items()) if n in recorded and n != exclude)

    for node in recorded:
        if node in members:
            continue
        was_on = placed_on.get(node, "")
        if was_on in down:
            continue  # its etcd may still run there: leave the membership until it is reachable
        actions.append(Action(Kind.ETCD_MEMBER_REMOVE, was_on, cluster, node,
                              reason=f"Node {node} is no longer a controlplane node of {cluster}",
                              details=(f"the {len(ask(node))} member(s) that stay must be healthy first",),
                              payload=EtcdMemberChange(node, ask(node), timeout=timeout)))
    for node, member in sorted(members.items()):
        if node not in recorded and location.get(node) not in down:
            where = location.get(node, "")
            actions.append(Action(Kind.ETCD_MEMBER_ADD, where, cluster, node,
                                  reason="new controlplane node joins etcd, as a learner",
                                  details=(member.peer_url, f"the {len(ask(node))} member(s) must be healthy first"),
                                  payload=EtcdMemberChange(node, ask(node), member.peer_url, timeout)))
            actions.append(Action(Kind.ETCD_MEMBER_PROMOTE, where, cluster, node, component="etcd",
                                  order=order.get(node, 0),
                                  reason="the learner votes once it has caught up",
                                  details=(f"then waits until it is healthy (up to {timeout}s)",),
                                  payload=EtcdMemberChange(node, ask(node), member.peer_url, timeout,
                                                           member.client_url)))
    return actions


__all__ = ["DiffOptions", "diff", "unreachable", "certificate_problem", "changed_fields"]
