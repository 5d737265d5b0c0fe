"""What a certificate says, parsed and verified once per content (no clock involved).

Planning checks every node certificate and each cluster's admin certificate on every plan; the
answers for a given PEM and authority never change, so they are kept in a bounded memo.
"""
from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass
from functools import lru_cache

from cryptography import x509

from gitops.memo import Memo, key_of
from gitops.pki.x509 import is_signed_by, load_cert_pem


@dataclass(frozen=True, slots=True)
class CertificateFacts:
    """What a certificate says, once parsed and checked against an authority; no clock involved."""

    #: directly issued by the authority (True when there is none to check against)
    signed: bool
    not_after: dt.datetime
    common_names: tuple[str, ...]
    organizations: tuple[str, ...]  # sorted, as are the SANs
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]


#: one entry per (certificate, authority) content: 24 node certificates and the admin's per cluster, ~0.5 KiB each
CERTIFICATE_FACTS: Memo[bytes, CertificateFacts | None] = Memo(maxsize=1 << 19)


def certificate_facts(pem: str, ca_pem: str | None) -> CertificateFacts | None:
    """The facts of `pem` (None: unreadable), parsed and verified once per content of `pem` and `ca_pem`."""
    return CERTIFICATE_FACTS.get(key_of(pem, ca_pem), lambda: _read_certificate(pem, ca_pem))


def _read_certificate(pem: str, ca_pem: str | None) -> CertificateFacts | None:
    try:
        cert = load_cert_pem(pem)
        subject = cert.subject
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            dns = sorted(san.get_values_for_type(x509.DNSName))
            ips = sorted(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
        except x509.ExtensionNotFound:
            dns, ips = [], []
    except Exception:  # noqa: BLE001 - any unreadable certificate is reissued
        return None
    return CertificateFacts(
        signed=ca_pem is None or is_signed_by(cert, _authority(ca_pem)),
        not_after=cert.not_valid_after_utc,
        common_names=_attributes(subject, x509.NameOID.COMMON_NAME),
        organizations=tuple(sorted(_attributes(subject, x509.NameOID.ORGANIZATION_NAME))),
        dns_names=tuple(map(sys.intern, dns)),
        ip_addresses=tuple(map(sys.intern, ips)),
    )


def _attributes(subject: x509.Name, oid: x509.ObjectIdentifier) -> tuple[str, ...]:
    return tuple(sys.intern(str(a.value)) for a in subject.get_attributes_for_oid(oid))


@lru_cache(maxsize=4096)
def _authority(ca_pem: str) -> x509.Certificate:
    """An authority's certificate, parsed once (a cluster's three CAs sign ~24 node certificates)."""
    return load_cert_pem(ca_pem)
