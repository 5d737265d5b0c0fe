"""Apply's dispatch table: the one handler of each kind of action, by family (`tests/test_plan_contract.py`
checks that every kind has one and that each takes the payload type `gitops.plan.actions.KINDS` names)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gitops.apply import cluster_api, containers, etcd_care, hosts, membership, records, waves
from gitops.apply.run import Run
from gitops.plan.actions import Action, Kind

Handler = Callable[[Run, Action, Any], None]

HANDLERS: dict[Kind, Handler] = {
    # pods, keys, files and containers on a hypervisor
    Kind.CREATE_POD: containers.create_pod,
    Kind.GENERATE_KEYS: containers.generate_keys,
    Kind.WRITE_FILES: containers.write_files,
    Kind.CREATE_CONTAINER: containers.create_container,
    Kind.RECREATE_CONTAINER: containers.recreate_container,
    Kind.RELOAD_CONTAINER: containers.reload_container,
    Kind.REMOVE_CONTAINER: containers.remove_container,
    Kind.REMOVE_POD: containers.remove_pod,
    # etcd membership
    Kind.ETCD_MEMBER_ADD: membership.etcd_member_add,
    Kind.ETCD_MEMBER_PROMOTE: membership.etcd_member_promote,
    Kind.ETCD_MEMBER_REMOVE: membership.etcd_member_remove,
    # etcd care and recovery
    Kind.BACKUP_ETCD: etcd_care.backup_etcd,
    Kind.DEFRAGMENT_ETCD: etcd_care.defragment_etcd,
    Kind.DISARM_ETCD_ALARM: etcd_care.disarm_etcd_alarm,
    Kind.RECOVER_ETCD: etcd_care.recover_etcd,
    Kind.RESTORE_ETCD: etcd_care.restore_etcd,
    # inside a cluster's own API
    Kind.CREATE_OBJECT: cluster_api.create_object,
    Kind.UPDATE_OBJECT: cluster_api.create_object,  # a server-side apply either way
    Kind.SIGN_CERTIFICATE_REQUEST: cluster_api.sign_certificate_request,
    # bare-metal hosts
    Kind.LABEL_HOST: hosts.label_host,
    # the recorded state alone
    Kind.ADVANCE_CA_ROTATION: records.advance_ca_rotation,
    # a rollout wave: its clusters watched, the rollout halted on a breach
    Kind.START_WAVE: waves.start_wave,
    Kind.SOAK_WAVE: waves.soak_wave,
}
