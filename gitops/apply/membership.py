"""Apply's handlers of a cluster's etcd membership: add (as a learner), promote, remove; one member at a
time, the others healthy first."""
from __future__ import annotations

from gitops.apply.run import Run
from gitops.plan.actions import Action
from gitops.plan.payloads import EtcdMemberChange


def etcd_member_add(run: Run, action: Action, p: EtcdMemberChange) -> None:
    with run.etcd(action, p.client_urls) as etcd:
        etcd.wait_healthy(list(p.client_urls), p.timeout, f"before adding {p.member}")
        etcd.add(p.peer_url, learner=True)
    with run.recording() as state:
        record = state.clusters[action.cluster]
        node = state.nodes.get(p.member)
        beside = node is not None and bool(node.leaving_peer)  # a learner-first move: the old member stays
        if p.member not in record.etcd_members or (beside and p.member not in record.etcd_learners):
            if p.member not in record.etcd_members:
                record.etcd_members.append(p.member)
            record.etcd_learners.append(p.member)  # until promoted: a run stopped before that promotes next
        if node is not None and not beside:
            node.moved_from = ""  # a member moved off a lost hypervisor: joined again from its new place


def etcd_member_promote(run: Run, action: Action, p: EtcdMemberChange) -> None:
    with run.etcd(action, p.client_urls) as etcd:
        etcd.promote(p.peer_url, p.timeout)
        record = run.state.clusters[action.cluster]
        node = run.state.nodes.get(p.member)
        if p.member in record.etcd_learners or (node is not None and node.moved_from):
            with run.recording():
                if p.member in record.etcd_learners:
                    record.etcd_learners.remove(p.member)
                if node is not None:
                    node.moved_from = ""  # votes from its new place (a learner-first move: the old one leaves next)
        etcd.wait_healthy([p.client_url, *p.client_urls], p.timeout, f"after promoting {p.member}")


def etcd_member_remove(run: Run, action: Action, p: EtcdMemberChange) -> None:
    with run.etcd(action, p.client_urls) as etcd:
        etcd.wait_healthy(list(p.client_urls), p.timeout, f"before removing {p.member}")
        # a removed leader leaves no leader behind; an old member of a learner-first move (`peer_url`)
        # shares its name with the new one, so it is known by its peer URL
        etcd.hand_off_from(p.member, p.timeout, p.client_urls, peer_url=p.peer_url)
        etcd.remove(p.member, p.peer_url)
    with run.recording() as state:
        record = state.clusters[action.cluster]
        node = state.nodes.get(p.member)
        if p.peer_url:
            if node is not None:
                node.leaving_from = node.leaving_peer = ""
                node.leaving_ports = {}
        else:
            record.etcd_members = [m for m in record.etcd_members if m != p.member]
            record.etcd_learners = [m for m in record.etcd_learners if m != p.member]
