"""Cluster certificate authorities and the admin credential, generated once; CA rotation.

Authority keys stay with the controller (in the state store); leaf keys are
generated on the hypervisors (see `gitops.compile.files`). This module makes
the few things the controller itself holds: the three CAs of a cluster and the
admin client certificate (O=system:masters) used for kubeconfigs, renewed
inside the cluster's renewal window (and re-issued when its CA changed).

CA rotation: a Cluster whose spec.certificates.caGeneration is above the recorded
one rotates all three authorities (cluster, etcd, front-proxy) in three phases,
one per plan: each phase's plan ends with an `advance-ca-rotation` action that
records the next phase (`ClusterRecord.next_phase`) once the phase's actions ran:
trust-both (new CAs generated; every bundle holds old + new), re-issue (the new
CAs sign every leaf and the admin credential; server certificates carry the new
CA cross-signed by the old one, so old clients still verify them), drop-old
(bundles hold only the new CAs). Once drop-old's actions ran the rotation is over
and the old CAs are forgotten. What a plan says about it: `gitops.plan.rotation`.
"""
from __future__ import annotations

import dataclasses
import datetime as dt

from gitops.errors import GitopsError
from gitops.model.resources import Cluster
from gitops.pki import CertKey, create_ca, cross_sign, issue_cert
from gitops.pki.facts import certificate_facts
from gitops.pki.x509 import cert_to_pem
from gitops.state.records import TRUST_BOTH, CARotation, CertRecord, ClusterRecord

AUTHORITIES = {
    "cluster": "kubernetes-ca",
    "etcd": "etcd-ca",
    "front-proxy": "front-proxy-ca",
}
CA_DAYS = 3650
ADMIN_CN = "kubernetes-admin"
ADMIN_GROUP = "system:masters"


class CAGenerationError(GitopsError):
    """spec.certificates.caGeneration went down."""


def ensure_authorities(cluster: Cluster, record: ClusterRecord | None, now: dt.datetime) -> ClusterRecord:
    """`record` with every authority present and a valid admin certificate.

    Existing material is reused unchanged; only what is missing (or an admin
    certificate inside its renewal window, or signed by a CA that no longer
    signs) is generated. A caGeneration above the recorded one starts a
    rotation (its new CAs made here, once); one below is a CAGenerationError.
    """
    # every other field as recorded (a deep copy: a field added to the record is never dropped here)
    record = ClusterRecord(ca_generation=cluster.ca_generation) if record is None else record.copy()
    if not record.authorities:  # a new cluster starts at the generation it asks for
        record.ca_generation = cluster.ca_generation
    authorities = dict(record.authorities)
    for role, cn in AUTHORITIES.items():
        if role not in authorities:
            ca = create_ca(ca_name(cluster.name, cn, record.ca_generation), days=CA_DAYS, now=now)
            authorities[role] = CertRecord(ca.cert_pem, ca.key_pem)
    rotation = record.rotation.copy() if record.rotation is not None else None
    target = rotation.generation if rotation is not None else record.ca_generation
    if cluster.ca_generation < target:
        where = "the rotation to generation" if rotation is not None else "generation"
        raise CAGenerationError(f"{cluster.ca_generation_at}: Cluster/{cluster.name}: spec.certificates.caGeneration: "
                                f"{cluster.ca_generation} is below {where} {target} the cluster already has; "
                                "a CA generation only goes up")
    if rotation is None and cluster.ca_generation > record.ca_generation:
        new = {role: _new_ca(ca_name(cluster.name, cn, cluster.ca_generation), now) for role, cn in AUTHORITIES.items()}
        # (a state read from the status branch's public part has no keys: `plan --against-status` shows the
        # phase without cross-signing; it never applies)
        cross = {role: cert_to_pem(cross_sign(authority(new, role), authority(authorities, role), now))
                 for role in new if authorities[role].key_pem}
        rotation = CARotation(cluster.ca_generation, TRUST_BOTH, dict(sorted(new.items())), dict(sorted(cross.items())))
    admin = record.admin
    facts = certificate_facts(admin.cert_pem, authorities["cluster"].cert_pem) if admin is not None else None
    stale = facts is None or not facts.signed or \
        facts.not_after - now <= dt.timedelta(days=cluster.renew_before_days)
    if stale and authorities["cluster"].key_pem:  # (no key: a public state, as above)
        cert = issue_cert(authority(authorities, "cluster"), ADMIN_CN, organizations=(ADMIN_GROUP,),
                          client=True, days=cluster.validity_days, now=now)
        admin = CertRecord(cert.cert_pem, cert.key_pem)
    return dataclasses.replace(record, authorities=dict(sorted(authorities.items())), admin=admin,
                               rotation=rotation)


#: the authority of a SIPCluster's services (the pseudo-cluster `sip-<name>`): it signs its OIDC provider's
#: serving certificate, and API servers trusting that provider trust it
SERVICE_AUTHORITY = "auth"


def ensure_service_authority(cluster: str, record: ClusterRecord | None, now: dt.datetime) -> ClusterRecord:
    """`record` of a SIPCluster's services (`cluster`: `sip-<name>`) with its authority, made once."""
    record = ClusterRecord() if record is None else record.copy()
    if SERVICE_AUTHORITY not in record.authorities:
        record.authorities = {**record.authorities, SERVICE_AUTHORITY: _new_ca(f"{cluster}-auth-ca", now)}
    return record


def ca_name(cluster: str, cn: str, generation: int) -> str:
    """A CA's common name; generations after the first are numbered (distinct subjects keep chains apart)."""
    return f"{cluster}-{cn}" if generation <= 1 else f"{cluster}-{cn}-{generation}"


def _new_ca(name: str, now: dt.datetime) -> CertRecord:
    ca = create_ca(name, days=CA_DAYS, now=now)
    return CertRecord(ca.cert_pem, ca.key_pem)


def authority(authorities: dict[str, CertRecord], role: str) -> CertKey:
    rec = authorities[role]
    return CertKey.from_pem(rec.cert_pem, rec.key_pem)
