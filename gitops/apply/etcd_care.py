"""Apply's handlers of etcd care and recovery: backups, defragmentation, alarms, a rebuild from the survivor,
a restore from a snapshot."""
from __future__ import annotations

import dataclasses
import logging
import tempfile
import time

from gitops import agent
from gitops.apply.containers import start_container
from gitops.apply.run import ApplyError, Run
from gitops.backup.restic import Restic
from gitops.backup.take import back_up
from gitops.cri.types import ContainerState
from gitops.etcdclient import client_context
from gitops.plan.actions import Action
from gitops.plan.payloads import BackupEtcd, EtcdAlarm, EtcdHealth, RecoverEtcd, RestoreEtcd, RestoreMember
from gitops.pods import RESTORE_LABEL, SPEC_HASH

log = logging.getLogger("gitops.apply.executor")
#: seconds `etcdutl snapshot restore` may take on one member (a full 8 GiB database: minutes)
RESTORE_TIMEOUT = 1800


def backup_etcd(run: Run, action: Action, p: BackupEtcd) -> None:
    """Snapshot the cluster's etcd into its target before the plan changes it."""
    record = run.state.clusters[action.cluster]
    context = client_context(run.signer(action.cluster, "etcd"), record.trust_bundle("etcd"))
    snap = back_up(run.connections.backup_target(p.target), action.cluster, p.keep, context, dict(p.members))
    log.info("etcd snapshot %s of %s taken from %s at revision %d (%d bytes) into %s", snap.short_id,
             action.cluster, snap.member, snap.revision, snap.bytes, p.target)


def defragment_etcd(run: Run, action: Action, p: EtcdHealth) -> None:
    """One member's database file rewritten: the others serving before (a leader known, alarms or not),
    leadership handed over if it leads, then it serving again."""
    with run.etcd(action, p.peers or (p.client_url,)) as etcd:
        etcd.wait_serving(list(p.peers), p.timeout, f"before defragmenting etcd on {action.node}")
        etcd.hand_off_leadership(p.client_url, p.timeout, p.prefer)
        etcd.defragment(p.client_url)
        etcd.wait_serving([p.client_url], p.timeout, f"after defragmenting etcd on {action.node}")


def disarm_etcd_alarm(run: Run, action: Action, p: EtcdAlarm) -> None:
    with run.etcd(action, p.client_urls) as etcd:
        cleared = etcd.disarm(p.alarm)
    log.info("%d %s alarm(s) of %s cleared", cleared, p.alarm, action.cluster)


def recover_etcd(run: Run, action: Action, p: RecoverEtcd) -> None:
    """Rebuild etcd from its surviving member: once with --force-new-cluster, then as usual (each time until
    healthy); then record it the only member. A run repeated after a crash forces again (a one-member
    cluster forced again is the same cluster)."""
    for container_id in p.stop:
        run.remove_container(action.hypervisor, container_id, action)
    client = run.client(action.hypervisor)
    spec = p.create.resolved({f.name: run.content(f) for f in p.create.files},
                             run.certificate_digests(action, p.create))
    # labelled apart: should a crash leave it running, the next plan sees a changed spec and replaces it
    forced = dataclasses.replace(spec, args=(*spec.args, "--force-new-cluster"),
                                 labels={**spec.labels, SPEC_HASH: "force-new-cluster"})
    client.pull_image(spec.image)
    forced_id = client.create_container(run.pod(action, p.create.pod).sandbox_id, forced, p.create.sandbox)
    client.start_container(forced_id)
    with run.etcd(action, (p.client_url,)) as etcd:
        etcd.wait_healthy([p.client_url], p.timeout, f"after --force-new-cluster on {action.node}")
    run.remove_container(action.hypervisor, forced_id, action)
    start_container(run, action, p.create)
    with run.etcd(action, (p.client_url,)) as etcd:
        etcd.wait_healthy([p.client_url], p.timeout, f"after rebuilding etcd on {action.node}")
    with run.recording() as state:
        record = state.clusters[action.cluster]
        record.etcd_members, record.etcd_learners = [action.node], []
        record.recovered, record.forcing = p.record, ""
    log.info("etcd of %s rebuilt from %s", action.cluster, action.node)


def restore_etcd(run: Run, action: Action, p: RestoreEtcd) -> None:
    """Copy the snapshot to every member (while the cluster still serves), stop its control plane, restore
    every member's data directory from the snapshot, record the restore (the plan's next actions start
    the containers again). Every step is safe to repeat."""
    restic = Restic(run.connections.backup_target(p.target))
    with tempfile.TemporaryFile() as data:  # unlinked from the start: nothing is left behind, even by SIGKILL
        restic.dump(p.snapshot, action.cluster, data)
        for member in p.members:
            agent.send_snapshot(run.client(member.hypervisor), member.pod.agent_id, data)
    for hypervisor, container_id in p.stop:
        run.remove_container(hypervisor, container_id, action)
    for member in p.members:
        _restore_member(run, action, member)
    for member in p.members:
        agent.swap_restored(run.client(member.hypervisor), member.pod.agent_id, p.token)
    with run.recording() as state:
        record = state.clusters[action.cluster]
        record.restored, record.etcd_learners = p.record, []
    log.info("etcd of %s restored from snapshot %s of %s", action.cluster, p.snapshot[:8], p.target)


def _restore_member(run: Run, action: Action, member: RestoreMember) -> None:
    """`etcdutl snapshot restore` in a one-shot container of the member's pod, until it exits 0."""
    client = run.client(member.hypervisor)
    for stale in client.list_containers({RESTORE_LABEL: member.node}, sandbox_id=member.pod.sandbox_id):
        run.remove_container(member.hypervisor, stale.id, action)  # left by a run that stopped on the way
    client.pull_image(member.restorer.image)
    container_id = client.create_container(member.pod.sandbox_id, member.restorer, member.sandbox)
    client.start_container(container_id)
    deadline = time.monotonic() + RESTORE_TIMEOUT
    status = client.container_status(container_id)
    while status.state != ContainerState.EXITED:
        if time.monotonic() > deadline:
            raise ApplyError(f"etcdutl snapshot restore on {member.node} still runs after {RESTORE_TIMEOUT}s")
        refused = run.refused(action)
        if refused:
            raise ApplyError(f"fenced while restoring etcd on {member.node}: {refused}")
        time.sleep(0.5)
        status = client.container_status(container_id)
    if status.exit_code != 0:
        output = agent.restore_log(client, member.pod.agent_id, member.restorer.log_path)
        raise ApplyError(f"etcdutl snapshot restore on {member.node} exited {status.exit_code}: "
                         f"{output or status.message or status.reason}")
    run.remove_container(member.hypervisor, container_id, action)
