"""x509 helpers."""
from __future__ import annotations

import ipaddress

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gitops import pki


@pytest.fixture(scope="module")
def ca() -> pki.CertKey:
    return pki.create_ca("test-ca", organizations=["gitops"])


def test_ca_is_self_signed_ca(ca: pki.CertKey) -> None:
    assert ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert pki.is_signed_by(ca.cert, ca.cert)


def test_server_cert_has_sans_usages_and_org(ca: pki.CertKey) -> None:
    leaf = pki.issue_cert(ca, "apiserver", organizations=["system:masters", "x"],
                          dns_names=["kubernetes.default"], ip_addresses=["127.0.10.1", "::1"],
                          server=True, client=True)
    san = leaf.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["kubernetes.default"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.10.1"),
                                                       ipaddress.ip_address("::1")]
    eku = leaf.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    orgs = [a.value for a in leaf.cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters", "x"]
    assert not leaf.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert pki.is_signed_by(leaf.cert, ca.cert)
    assert not pki.is_signed_by(leaf.cert, pki.create_ca("other").cert)


@pytest.mark.parametrize("kind", ["ec", "rsa", "ed25519"])
def test_pem_round_trip_and_key_match(ca: pki.CertKey, kind: str) -> None:
    leaf = pki.issue_cert(ca, "client", client=True, key=pki.generate_key(kind))  # type: ignore[arg-type]
    again = pki.CertKey.from_pem(leaf.cert_pem, leaf.key_pem)
    assert again.cert == leaf.cert
    assert pki.key_matches_cert(again.key, leaf.cert)
    assert not pki.key_matches_cert(pki.generate_key(), leaf.cert)
    assert pki.load_certs_pem(leaf.cert_pem + ca.cert_pem) == [leaf.cert, ca.cert]


def test_errors_are_gitops_errors(ca: pki.CertKey) -> None:
    leaf = pki.issue_cert(ca, "s", server=True)
    with pytest.raises(pki.PKIError, match="does not match"):
        pki.CertKey.from_pem(leaf.cert_pem, ca.key_pem)
    with pytest.raises(pki.PKIError, match="PEM certificate"):
        pki.load_cert_pem("garbage")
    with pytest.raises(pki.PKIError, match="private key"):
        pki.load_key_pem("garbage")
    with pytest.raises(pki.PKIError, match="server and/or client"):
        pki.issue_cert(ca, "nothing")
    with pytest.raises(pki.PKIError, match="IP address"):
        pki.issue_cert(ca, "s", server=True, ip_addresses=["not-an-ip"])
