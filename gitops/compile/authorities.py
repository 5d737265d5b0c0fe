"""Cluster certificate authorities and the admin credential, generated once.

Authority keys stay with the controller (in the state store); leaf keys are
generated on the hypervisors (see `gitops.compile.files`). This module makes
the few things the controller itself holds: the three CAs of a cluster and the
admin client certificate (O=system:masters) used for kubeconfigs, renewed
inside the cluster's renewal window.
"""
from __future__ import annotations

import datetime as dt

from gitops.model.resources import Cluster
from gitops.pki import CertKey, create_ca, issue_cert, load_cert_pem
from gitops.state.records import CertRecord, ClusterRecord

AUTHORITIES = {
    "cluster": "kubernetes-ca",
    "etcd": "etcd-ca",
    "front-proxy": "front-proxy-ca",
}
CA_DAYS = 3650
ADMIN_CN = "kubernetes-admin"
ADMIN_GROUP = "system:masters"


def needs_renewal(cert_pem: str, renew_before_days: int, now: dt.datetime) -> bool:
    expiry = load_cert_pem(cert_pem).not_valid_after_utc
    return expiry - now <= dt.timedelta(days=renew_before_days)


def ensure_authorities(cluster: Cluster, record: ClusterRecord | None, now: dt.datetime) -> ClusterRecord:
    """`record` with every authority present and a valid admin certificate.

    Existing material is reused unchanged; only what is missing (or an admin
    certificate inside its renewal window) is generated.
    """
    record = record or ClusterRecord()
    authorities = dict(record.authorities)
    for role, cn in AUTHORITIES.items():
        if role not in authorities:
            ca = create_ca(f"{cluster.name}-{cn}", days=CA_DAYS, now=now)
            authorities[role] = CertRecord(ca.cert_pem, ca.key_pem)
    admin = record.admin
    if admin is None or needs_renewal(admin.cert_pem, cluster.renew_before_days, now):
        cert = issue_cert(authority(authorities, "cluster"), ADMIN_CN, organizations=(ADMIN_GROUP,),
                          client=True, days=cluster.validity_days, now=now)
        admin = CertRecord(cert.cert_pem, cert.key_pem)
    return ClusterRecord(
        authorities=dict(sorted(authorities.items())),
        admin=admin,
        service_account_keys=dict(record.service_account_keys),
        etcd_members=list(record.etcd_members),
        retired_service_account_keys=list(record.retired_service_account_keys),
    )


def authority(authorities: dict[str, CertRecord], role: str) -> CertKey:
    rec = authorities[role]
    return CertKey.from_pem(rec.cert_pem, rec.key_pem)
