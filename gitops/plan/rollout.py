"""Rollout: the order and the health gates of one cluster's actions (pure).

`gitops.plan.diff` says what differs, as raw actions; this module decides how they roll out (as
gitops-engine's `pkg/sync` orders what its `pkg/diff` finds): the health gate each container change
gets, etcd members joining (as learners) and leaving one at a time, each API server stopped around its
own etcd member, the changes that wait for a vote or a quorum, where etcd leadership goes, and the
plan's order. `gitops.plan.clusters` drives each cluster through it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gitops.compile.components import INGRESS_COUNTS_IN, SHUTDOWN_DELAY
from gitops.compile.desired import DesiredPod
from gitops.model.components import APISERVER, CONTROLPLANE, ETCD, ETCD_MEMBER, OVERLAP, READYZ, STOP_START
from gitops.nodefiles import AFTER_APPLY
from gitops.observe.types import ObservedPod
from gitops.plan.actions import Action, Kind
from gitops.plan.inputs import ClusterInputs
from gitops.plan.payloads import (ApiReady, BackupEtcd, CreateContainer, EtcdHealth, EtcdMemberChange, Remove,
                                  ServingFirst)
from gitops.pods import AGENT

#: how long a new container replaced with `OVERLAP` (the ingress) runs beside the one it replaces
INGRESS_OVERLAP = 2
_MEMBERSHIP = (Kind.ETCD_MEMBER_ADD, Kind.ETCD_MEMBER_PROMOTE, Kind.ETCD_MEMBER_REMOVE)
_GRACEFUL_STOP = (f"stops gracefully: fails /readyz for {SHUTDOWN_DELAY}s first, so the ingress takes it out "
                  "before it closes")


def ordered(actions: Iterable[Action]) -> tuple[Action, ...]:
    """The plan's order (`Action.sort_key`: phase by kind, then the anchors and steps set here)."""
    return tuple(sorted(actions, key=Action.sort_key))


def roll_out(inputs: ClusterInputs, actions: list[Action], keepers: dict[str, ObservedPod],
             timeout: int) -> tuple[list[Action], list[tuple[str, str]]]:
    """One cluster's raw actions gated and placed, with the etcd membership changes they need, less the
    ones that must wait (with a (node, warning) each)."""
    actions = _agents_first(gate(inputs, actions, keepers, timeout))
    actions = leave_last(inputs, actions + etcd_membership(inputs, timeout))
    actions = drain_api_servers(inputs, actions, keepers, timeout)
    actions, votes = hold_votes(inputs, actions)
    actions, quorum = hold_quorum(inputs, actions)
    actions = serving_first(inputs, leadership_order(count_joined(inputs, actions)), keepers, timeout)
    return back_up_first(inputs, actions), [*votes, *quorum]


def serving_first(inputs: ClusterInputs, actions: list[Action], keepers: dict[str, ObservedPod],
                  timeout: int) -> list[Action]:
    """The first action of the cluster's plan that stops a running API server (a recreate, or a stop around
    its etcd member) waits before it for another one to serve steadily: every later stop follows a start
    that waited so already, but the plan cannot know how long the others have served (a controller killed
    while one started leaves it running, maybe not yet behind the ingress, and the next plan's first stop
    would take the only one the ingress has)."""
    running = {node: c.id for node, pod in keepers.items() if (c := pod.running(APISERVER)) is not None}
    urls = {p.node: p.api_url for p in inputs.wants if p.api_url}
    for index, action in sorted(enumerate(actions), key=lambda pair: pair[1].sort_key()):
        if not (action.component == APISERVER and action.node in running and action.node in urls
                and action.kind in (Kind.RECREATE_CONTAINER, Kind.REMOVE_CONTAINER)
                and action.target_id == running[action.node]
                and isinstance(action.payload, (CreateContainer, Remove))):
            continue
        peers = sorted(n for n in running if n != action.node and n in urls)
        if not peers:
            return actions
        serving = ServingFirst(f"{urls[action.node]}/readyz", tuple(f"{urls[n]}/readyz" for n in peers), timeout,
                               steady=INGRESS_COUNTS_IN)
        gate = (f"before it stops: {' or '.join(peers)} answers /readyz for {serving.steady}s in a row, so the "
                f"ingress has another (up to {timeout}s; not waited for when nothing serves)")
        details = list(action.details)  # in apply's order: the etcd check, this wait, the graceful stop
        details.insert(details.index(_GRACEFUL_STOP) if _GRACEFUL_STOP in details else len(details), gate)
        actions = list(actions)
        actions[index] = dataclasses.replace(action, details=tuple(details),
                                             payload=dataclasses.replace(action.payload, serving=serving))
        return actions
    return actions


def back_up_first(inputs: ClusterInputs, actions: list[Action]) -> list[Action]:
    """A cluster with spec.backup whose plan changes its etcd membership, replaces a running etcd member
    (a CA, a certificate, its image) or changes its API servers' image (a version) gets a snapshot of
    its etcd first, while a quorum of its recorded members runs (without one there is nothing to read)."""
    backup, record, want = inputs.want.backup if inputs.want else None, inputs.record, inputs.want
    if backup is None or record is None or want is None or not record.etcd_members or not _has_quorum(inputs):
        return actions
    why = _backup_reason(actions, {p.node: p for p in inputs.wants})
    if not why:
        return actions
    members = tuple((m.node, m.client_url) for m in want.etcd_members if m.node in record.etcd_members)
    return [Action(Kind.BACKUP_ETCD, "", inputs.cluster, "", reason=f"before this plan {why}",
                   details=(f"to backup target {backup.target} (keeps the newest {backup.keep})",
                            f"from the healthy member with the highest revision of those that stay ({', '.join(n for n, _ in members)})"
                            f": {AFTER_APPLY}", f"snapshot id: {AFTER_APPLY}"),
                   payload=BackupEtcd(backup.target, backup.keep, members)), *actions]


def _backup_reason(actions: list[Action], pods: dict[str, DesiredPod]) -> str:
    """What in `actions` (on the desired `pods`, by node) calls for a snapshot first ("" when nothing does)."""
    if any(a.kind in _MEMBERSHIP for a in actions):
        return "changes etcd membership"
    for a in actions:
        if a.kind == Kind.RECREATE_CONTAINER and isinstance(a.payload, CreateContainer) and a.payload.etcd is not None:
            return f"replaces running etcd member {a.node}"
        if (a.kind == Kind.RECREATE_CONTAINER and _rollout(pods.get(a.node), a.component) == READYZ
                and any(d.startswith("image: ") for d in a.details)):
            return f"changes the image of {a.component} on {a.node}"
    return ""


# ------------------------------------------------------------------------------ gates


def gate(inputs: ClusterInputs, actions: list[Action], keepers: dict[str, ObservedPod],
         timeout: int) -> list[Action]:
    """Each container change with the gate it needs, in its payload and its details. A running etcd
    replaced (a deliberate disruption): the other members healthy before, it after. A running API
    server replaced: ready again before the next one goes; a new one while the cluster serves: ready
    before the ingress is given it. A running ingress haproxy: started beside the one it replaces.
    A missing or exited etcd starts without a gate: it is down already, and waiting for quorum could
    wait for members that only start later in the plan."""
    running = {c.id for pod in keepers.values() for c in pod.containers if c.state == "running"}
    serving = _has_quorum(inputs)
    pods = {p.node: p for p in inputs.wants}
    out = []
    for action in actions:
        pod = pods.get(action.node)
        if pod is not None and isinstance(action.payload, CreateContainer):
            if action.kind == Kind.CREATE_CONTAINER and serving:
                action = _gate_start(action, pod, timeout)
            elif action.kind == Kind.RECREATE_CONTAINER and action.target_id in running:
                action = _gate_replacement(action, pod, inputs, timeout)
        out.append(action)
    return out


def _gate_start(action: Action, pod: DesiredPod, timeout: int) -> Action:
    ready = _api_ready(pod, action.component, timeout)
    if ready is None:
        return action
    return dataclasses.replace(action, payload=dataclasses.replace(action.payload, ready=ready), details=(
        *action.details, f"the cluster serves: {_ready_wait(ready)}"))


def _gate_replacement(action: Action, pod: DesiredPod, inputs: ClusterInputs, timeout: int) -> Action:
    payload, name = action.payload, action.component
    assert isinstance(payload, CreateContainer)
    how = _rollout(pod, name)
    etcd = _etcd_health(pod, inputs, timeout) if how == ETCD_MEMBER else None
    ready = _api_ready(pod, name, timeout)
    if etcd is not None:
        payload = dataclasses.replace(payload, etcd=etcd)
        gate = _member_gate(etcd)
    elif ready is not None:
        payload, gate = dataclasses.replace(payload, ready=ready), _ready_gate(ready)
    elif how == OVERLAP and pod.role != CONTROLPLANE:
        payload = dataclasses.replace(payload, overlap=INGRESS_OVERLAP)
        gate = f"started beside the running one, which soft-stops {INGRESS_OVERLAP}s later: the port never closes"
    else:
        return action
    return dataclasses.replace(action, details=(*action.details, gate), payload=payload)


def _member_gate(etcd: EtcdHealth) -> str:
    return (f"one member at a time: the {len(etcd.peers)} other member(s) healthy before, this one healthy "
            f"after (up to {etcd.timeout}s each)")


def _api_ready(pod: DesiredPod, component: str, timeout: int) -> ApiReady | None:
    """The gate of a controlplane node's own API server: its /readyz, then the ingress counting it in."""
    return _readyz(pod.api_url, timeout) if _rollout(pod, component) == READYZ and pod.api_url else None


def _rollout(pod: DesiredPod | None, component: str) -> str:
    """How `pod`'s running `component` is replaced (`STOP_START` for one it does not run)."""
    found = next((c for c in pod.containers if c.spec.name == component), None) if pod is not None else None
    return found.rollout if found is not None else STOP_START


def _readyz(api_url: str, timeout: int) -> ApiReady:
    """Its /readyz ok, then as long as the ingress's check takes to count it in again: the API server the
    plan stops next may be the only other one the ingress counts (one left, or one not behind it yet)."""
    return ApiReady(f"{api_url}/readyz", timeout, ingress=INGRESS_COUNTS_IN)


def _ready_wait(ready: ApiReady) -> str:
    return f"waits until its /readyz answers ok (up to {ready.timeout}s), then {ready.ingress}s for the ingress " \
           "to count it in"


def _ready_gate(ready: ApiReady) -> str:
    return f"one at a time: {_ready_wait(ready)}"


def _etcd_health(pod: DesiredPod, inputs: ClusterInputs, timeout: int) -> EtcdHealth | None:
    """A running cluster's etcd member: the others must be healthy before its container changes, and it
    after. None while the cluster bootstraps (its members start together) or for a joining learner
    (its promotion waits for it)."""
    record, cluster = inputs.record, inputs.want
    if record is None or cluster is None or pod.node not in record.etcd_members:
        return None
    members = {m.node: m for m in cluster.etcd_members}
    if pod.node not in members:
        return None
    peers = tuple(m.client_url for n, m in sorted(members.items()) if n in record.etcd_members and n != pod.node)
    return EtcdHealth(members[pod.node].client_url, peers, timeout)


def _has_quorum(inputs: ClusterInputs) -> bool:
    """Whether more than half of the recorded etcd members run: the cluster serves, so a new API server
    must be ready before anything routes to it (while it bootstraps or restarts from nothing, its API
    servers become ready only once the members later in the plan run)."""
    members = set(inputs.record.etcd_members) if inputs.record else set()
    return bool(members) and len(_etcd_running(inputs) & members) * 2 > len(members)


def _etcd_running(inputs: ClusterInputs) -> set[str]:
    """The nodes of the cluster with an etcd container running (as observed)."""
    return {node for node, pods in inputs.have.items() if any(p.running(ETCD) is not None for p in pods)}


def _agents_first(actions: list[Action]) -> list[Action]:
    """A pod's files agent (re)starts right after where its pod is created: keys and files go through it."""
    return [dataclasses.replace(a, anchor=Kind.CREATE_POD, step=1)
            if a.component == AGENT and a.kind in (Kind.CREATE_CONTAINER, Kind.RECREATE_CONTAINER) else a
            for a in actions]


# ------------------------------------------------------------------------------ etcd membership


def etcd_membership(inputs: ClusterInputs, timeout: int) -> list[Action]:
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
    order = {p.node: next((i for i, c in enumerate(p.containers) if c.spec.name == ETCD), 0)
             for p in inputs.wants}
    placed_on = dict(inputs.members_on)

    moving = inputs.moving
    old_clients = dict(inputs.leaving_clients)

    def ask(exclude: str) -> tuple[str, ...]:
        """The client URLs of the members that stay and vote now, the changing one excluded. A node moving
        learner-first votes from its old place until its old member is removed (asked there), and from its
        new place once promoted (asked there too; a promotion earlier in this plan adds it to the changes
        after it: `count_joined`); a member moving off a lost hypervisor votes from nowhere."""
        urls: list[str] = []
        for n, m in sorted(members.items()):
            if n not in recorded or n == exclude:
                continue
            if n in old_clients:
                urls.append(old_clients[n])
            if n not in moving:
                urls.append(m.client_url)
        return tuple(urls)

    def beside(node: str) -> tuple[str, ...]:
        """What a node's own join or promotion asks: the others, and its old member while it votes."""
        return (*ask(node), *((old_clients[node],) if node in old_clients else ()))

    leaving = {node for node, _, _ in inputs.leaving}
    for node in recorded:
        if (node in members and node not in moving) or node in leaving:
            continue
        was_on = placed_on.get(node, "")
        if was_on in down:
            continue  # its etcd may still run there: leave the membership until it is reachable
        why = (f"Node {node} moves from {was_on} to {location.get(node)}: its member leaves, then joins again "
               "from there" if node in members else f"Node {node} is no longer a controlplane node of {cluster}")
        actions.append(Action(Kind.ETCD_MEMBER_REMOVE, was_on, cluster, node, reason=why,
                              details=(_asked(ask(node), staying=True),),
                              payload=EtcdMemberChange(node, ask(node), timeout=timeout)))
    learners = set(record.etcd_learners) if record else set()
    for node, member in sorted(members.items()):
        if location.get(node) in down or location.get(node) in inputs.lost:
            continue
        if (node in recorded and node not in learners and node not in moving) or placed_on.get(node) in down:
            continue  # (a moving member whose old hypervisor does not answer: it has not left yet)
        where = location.get(node, "")
        joins = node not in recorded or (node in moving and node not in learners)
        if joins:
            reason = ("new controlplane node joins etcd, as a learner" if node not in moving else
                      f"Node {node} moves from {placed_on.get(node)}: its new member joins from here, as a learner, "
                      "beside the old one" if node in leaving else
                      "the moved node joins etcd again from here, as a learner")
            actions.append(Action(Kind.ETCD_MEMBER_ADD, where, cluster, node, reason=reason,
                                  details=(member.peer_url, _asked(beside(node))),
                                  payload=EtcdMemberChange(node, beside(node), member.peer_url, timeout)))
        actions.append(Action(Kind.ETCD_MEMBER_PROMOTE, where, cluster, node, component=ETCD,
                              order=order.get(node, 0),
                              reason="the learner votes once it has caught up" if joins
                              else "a learner added by an earlier run: it votes once it has caught up",
                              details=(f"then waits until it is healthy (up to {timeout}s)",),
                              payload=EtcdMemberChange(node, beside(node), member.peer_url, timeout,
                                                       member.client_url)))
    for node, was_on, peer_url in inputs.leaving:
        if node not in members:
            continue
        staying = (*ask(node), members[node].client_url)
        actions.append(Action(Kind.ETCD_MEMBER_REMOVE, was_on, cluster, node, **_AFTER_THE_MOVE, step=2,
                              reason=f"Node {node} moved to {location.get(node)}: its old member leaves once the "
                                     "new one votes",
                              details=(peer_url, _asked(staying, staying=True)),
                              payload=EtcdMemberChange(node, staying, peer_url, timeout)))
    return actions


def _asked(client_urls: tuple[str, ...], staying: bool = False) -> str:
    return f"the {len(client_urls)} member(s) {'that stay ' if staying else ''}must be healthy first"


def count_joined(inputs: ClusterInputs, actions: list[Action]) -> list[Action]:
    """The members a change asks to be healthy first include the ones that joined (were promoted) earlier
    in the same plan: a member recreated after a new one joined (a renewal with a scale-up, a node
    replaced) needs the new one healthy too, or stopping it could leave no quorum. The plan's order puts
    a cluster's joins before its recreates; the sort keys say which promotion comes before what."""
    urls = {m.node: m.client_url for m in inputs.want.etcd_members} if inputs.want else {}
    promoted = sorted((a.sort_key(), a.node) for a in actions
                      if a.kind == Kind.ETCD_MEMBER_PROMOTE and a.node in urls)
    if not promoted:
        return actions
    out = []
    for action in actions:
        key = action.sort_key()
        joined = tuple(urls[n] for k, n in promoted if k < key and n != action.node)
        out.append(_asking_also(action, joined) if joined else action)
    return out


def _asking_also(action: Action, joined: tuple[str, ...]) -> Action:
    """`action` asking the members at `joined` too (after the ones it asked, in the order they joined: a
    leadership hand-off keeps preferring established members), its details saying so."""
    payload = action.payload

    def more(urls: tuple[str, ...], own: str = "") -> tuple[str, ...]:
        return (*urls, *(u for u in joined if u not in urls and u != own))

    if isinstance(payload, CreateContainer) and payload.etcd is not None:
        etcd = dataclasses.replace(payload.etcd, peers=more(payload.etcd.peers, payload.etcd.client_url))
        texts, payload = {_member_gate(payload.etcd): _member_gate(etcd)}, dataclasses.replace(payload, etcd=etcd)
    elif isinstance(payload, Remove) and payload.etcd is not None:
        etcd = dataclasses.replace(payload.etcd, peers=more(payload.etcd.peers, payload.etcd.client_url))
        texts, payload = {_healthy_first(payload.etcd): _healthy_first(etcd)}, dataclasses.replace(payload, etcd=etcd)
    elif isinstance(payload, EtcdMemberChange):
        urls = more(payload.client_urls, payload.client_url)
        texts = {_asked(payload.client_urls, staying): _asked(urls, staying) for staying in (False, True)}
        payload = dataclasses.replace(payload, client_urls=urls)
    else:
        return action
    if payload == action.payload:
        return action
    return dataclasses.replace(action, payload=payload, details=tuple(texts.get(d, d) for d in action.details))


#: a learner-first move ends after its node's new containers (the new member voting): its old API server
#: stops, its old member is removed, its old pod goes (steps 1, 2, 3)
_AFTER_THE_MOVE = dict(anchor=Kind.ETCD_MEMBER_PROMOTE, order=9999)


def leave_last(inputs: ClusterInputs, actions: list[Action]) -> list[Action]:
    """The old pod of a node moving learner-first is removed last, after its old member."""
    old = {(node, hv) for node, hv, _ in inputs.leaving}
    return [dataclasses.replace(a, **_AFTER_THE_MOVE, step=3) if a.kind == Kind.REMOVE_POD
            and (a.node, a.hypervisor) in old else a for a in actions]


def _rolls_member(action: Action) -> bool:
    """Whether `action` replaces a running etcd member of a serving cluster (health-gated: needs quorum)."""
    return (action.kind == Kind.RECREATE_CONTAINER and action.component == ETCD
            and isinstance(action.payload, CreateContainer) and action.payload.etcd is not None)


def leadership_order(actions: list[Action]) -> list[Action]:
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


# ------------------------------------------------------------------------------ API servers around their member


def drain_api_servers(inputs: ClusterInputs, actions: list[Action], keepers: dict[str, ObservedPod],
                      timeout: int) -> list[Action]:
    """Each API server uses only its own node's etcd member, so before that member goes away (a running
    member's recreate, a member's removal) the API server stops (gracefully: it leaves the ingress, and
    no request of it meets its member shutting down), and after a recreate it starts again, ready before
    the plan goes on. An API server change of the same plan is made by that start (node by node: etcd
    member, then its API server); a missing or exited one is started after the member, not before, and
    after a member that is not running and starts again in this plan."""
    out: list[Action] = []
    desired = {p.node: p for p in inputs.wants}
    own = {a.node: a for a in actions if a.component == APISERVER
           and a.kind in (Kind.CREATE_CONTAINER, Kind.RECREATE_CONTAINER)}
    taken: set[int] = set()
    for action in actions:
        if action.kind == Kind.ETCD_MEMBER_REMOVE:
            out.extend(_before_removal(action, [p for p in inputs.have.get(action.node, [])
                                                if p.hypervisor == action.hypervisor]))
        elif _rolls_member(action):
            steps, used = _around_member(action, own.get(action.node), desired.get(action.node),
                                         keepers.get(action.node), timeout)
            out.extend(steps)
            if used is not None:
                taken.add(id(used))
            continue
        elif (action.kind == Kind.RECREATE_CONTAINER and action.component == ETCD and action.node in own
              and id(own[action.node]) not in taken and _has_quorum(inputs)):
            # a stopped member (exited, or left `created` by a run killed while CRI started it) of a
            # serving cluster starts again first: its API server's /readyz needs it (without a quorum,
            # every member starts before any API server, as the plan's order has it)
            change = own[action.node]
            out.extend([action, dataclasses.replace(change, anchor=action.kind, order=action.order, step=1)])
            taken.add(id(change))
            continue
        out.append(action)
    return [a for a in out if id(a) not in taken]


def _before_removal(removal: Action, pods: list[ObservedPod]) -> list[Action]:
    """The leaving member's running API server stopped right before the member is removed."""
    if not isinstance(removal.payload, EtcdMemberChange):
        return []
    staying = EtcdHealth("", removal.payload.client_urls, removal.payload.timeout)
    return [Action(Kind.REMOVE_CONTAINER, pod.hypervisor, removal.cluster, removal.node, component=APISERVER,
                   anchor=removal.anchor or removal.kind, order=removal.order, step=removal.step - 1,
                   target_id=running.id,
                   reason="its etcd member (the only one it talks to) leaves next",
                   details=(_healthy_first(staying), _GRACEFUL_STOP), payload=Remove(running.id, etcd=staying))
            for pod in pods if (running := pod.running(APISERVER)) is not None]


def _healthy_first(members: EtcdHealth) -> str:
    count = len(members.peers) + bool(members.client_url)
    return f"the {count} etcd member(s) healthy first (up to {members.timeout}s)"


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
    ready = _readyz(want.api_url, timeout)
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


# ------------------------------------------------------------------------------ changes that wait


def hold_votes(inputs: ClusterInputs, actions: list[Action]) -> tuple[list[Action], list[tuple[str, str]]]:
    """While a recorded etcd member is on an unreachable hypervisor, its vote cannot be counted on: no node
    of the cluster gets a change that needs quorum (a membership change, a running etcd replaced, a member's
    pod removed). Those nodes' actions wait; the cluster's other changes and other clusters go ahead."""
    away = sorted(n for n, hv in inputs.members_on if hv in inputs.down)
    gone = sorted(n for n, hv in inputs.members_on if hv in inputs.lost)
    if not away and not gone:
        return actions, []
    recorded = {n for n, _ in inputs.members_on}

    def needs_votes(a: Action) -> bool:
        return (a.kind in _MEMBERSHIP
                or (a.kind == Kind.REMOVE_POD and a.node in recorded)
                or _rolls_member(a))

    # a member lost for good and moving is replaced (removed, added back); a moving one whose old hypervisor
    # does not answer cannot leave there yet, so nothing of its move is made
    replaced = set() if away else set(gone) & inputs.moving
    stuck = {n for n in inputs.moving if n in away}
    waiting = sorted(({a.node for a in actions if needs_votes(a)} - replaced) | {a.node for a in actions if a.node in stuck})
    if not waiting:
        return actions, []
    kept = [a for a in actions if a.node not in waiting]
    count = f"{len(actions) - len(kept)} action(s) on {', '.join(waiting)}"
    if away:
        where = ", ".join(f"{n} on {hv}" for n, hv in inputs.members_on if n in away)
        return kept, [(waiting[0], f"cluster {inputs.cluster}: etcd member {where} is unreachable, so no change that "
                                   f"needs its vote is made: {count} wait until it answers (if it is gone for good, "
                                   "mark its Hypervisor spec.lost: true)")]
    where = ", ".join(f"{n} on {hv}" for n, hv in inputs.members_on if n in gone)
    return kept, [(waiting[0], f"cluster {inputs.cluster}: etcd member {where} is lost (spec.lost) and replaced one at a "
                               f"time, so no other change that needs a vote is made: {count} wait until it has joined "
                               "again")]


def hold_quorum(inputs: ClusterInputs, actions: list[Action]) -> tuple[list[Action], list[tuple[str, str]]]:
    """A member is removed only if the members that stay keep a quorum of running ones (removals taken in
    plan order, each counting the ones before it). A removal that would break quorum is refused at plan
    time: it and the rest of its node's actions (its pod's removal) wait, with a warning naming the
    members that must run again first."""
    removals = [a for a in actions if a.kind == Kind.ETCD_MEMBER_REMOVE]
    if not removals or inputs.record is None:
        return actions, []
    running = _etcd_running(inputs)
    current = list(inputs.record.etcd_members)
    leaving = {node for node, _, _ in inputs.leaving}
    waiting: set[str] = set()
    held: list[tuple[str, str]] = []
    for action in removals:
        # (the old member of a learner-first move leaves beside its node's new one, which stays)
        after = current if action.node in leaving else [m for m in current if m != action.node]
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


__all__ = ["count_joined", "drain_api_servers", "etcd_membership", "gate", "hold_quorum", "hold_votes",
           "leadership_order", "ordered", "roll_out"]
