"""x509 building blocks: keys, a self-signed CA, leaf certificates, PEM round-trips."""
from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Union

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gitops.errors import GitopsError
from gitops.keypair import key_matches_cert

PrivateKey = Union[ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey]
PublicKey = Union[ec.EllipticCurvePublicKey, rsa.RSAPublicKey, ed25519.Ed25519PublicKey]
KeyKind = Literal["ec", "rsa", "ed25519"]

#: Backdating of notBefore, so that slightly skewed clocks accept fresh certificates.
CLOCK_SKEW = dt.timedelta(minutes=5)


class PKIError(GitopsError):
    """Unparseable or inconsistent certificate material."""


@dataclass(frozen=True)
class CertKey:
    """A certificate with its private key."""

    cert: x509.Certificate
    key: PrivateKey

    @property
    def cert_pem(self) -> str:
        return cert_to_pem(self.cert)

    @property
    def key_pem(self) -> str:
        return key_to_pem(self.key)

    @classmethod
    def from_pem(cls, cert_pem: str | bytes, key_pem: str | bytes) -> CertKey:
        """Parse a PEM pair; raises PKIError unless the key belongs to the certificate."""
        cert, key = load_cert_pem(cert_pem), load_key_pem(key_pem)
        if not key_matches_cert(key, cert):
            raise PKIError("private key does not match certificate "
                           f"{cert.subject.rfc4514_string()!r}")
        return cls(cert, key)


def generate_key(kind: KeyKind = "ec") -> PrivateKey:
    """A fresh private key: ECDSA P-256 (default), RSA 2048 or Ed25519."""
    if kind == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise PKIError(f"unknown key kind {kind!r}")


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _hash_for(key: PrivateKey) -> hashes.HashAlgorithm | None:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _validity(days: int, now: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    start = (now or dt.datetime.now(dt.timezone.utc)) - CLOCK_SKEW
    return start, start + CLOCK_SKEW + dt.timedelta(days=days)


def create_ca(common_name: str, *, organizations: Sequence[str] = (), days: int = 3650,
              key: PrivateKey | None = None, now: dt.datetime | None = None) -> CertKey:
    """A self-signed CA certificate (basicConstraints CA:true, keyCertSign/cRLSign)."""
    key = key or generate_key()
    name = _name(common_name, organizations)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder(name, name, key.public_key(), days, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, _hash_for(key))
    )
    return CertKey(cert, key)


def cross_sign(ca: CertKey, issuer: CertKey, now: dt.datetime | None = None) -> x509.Certificate:
    """`ca`'s certificate (same subject and key, CA:true) issued by `issuer`, valid as long as
    `issuer`: a client that trusts only `issuer` verifies what `ca` signs when it is sent along."""
    start = (now or dt.datetime.now(dt.timezone.utc)) - CLOCK_SKEW
    return (
        x509.CertificateBuilder()
        .subject_name(ca.cert.subject)
        .issuer_name(issuer.cert.subject)
        .public_key(ca.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(start, issuer.cert.not_valid_before_utc))
        .not_valid_after(issuer.cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca.key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False)
        .sign(issuer.key, _hash_for(issuer.key))
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key: PublicKey, days: int,
             now: dt.datetime | None) -> x509.CertificateBuilder:
    """What every certificate has: names, key, a random serial and its validity window."""
    not_before, not_after = _validity(days, now)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def _san(dns_names: Iterable[str], ip_addresses: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    for ip in ip_addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError as err:
            raise PKIError(f"invalid IP address for subjectAltName: {ip!r}") from err
    return names


def issue_cert(ca: CertKey, common_name: str, *, organizations: Sequence[str] = (),
               dns_names: Sequence[str] = (), ip_addresses: Sequence[str] = (),
               server: bool = False, client: bool = False, days: int = 365,
               key: PrivateKey | None = None, now: dt.datetime | None = None) -> CertKey:
    """A leaf certificate signed by `ca`, for TLS server and/or client authentication.

    `organizations` become O= attributes (Kubernetes maps them to groups).
    """
    key = key or generate_key()
    cert = sign_public_key(ca, key.public_key(), common_name, organizations=organizations,
                           dns_names=dns_names, ip_addresses=ip_addresses, server=server,
                           client=client, days=days, now=now)
    return CertKey(cert, key)


def sign_public_key(ca: CertKey, public_key: PublicKey, common_name: str, *,
                    organizations: Sequence[str] = (), dns_names: Sequence[str] = (),
                    ip_addresses: Sequence[str] = (), server: bool = False, client: bool = False,
                    days: int = 365, now: dt.datetime | None = None) -> x509.Certificate:
    """A leaf certificate for a public key whose private half lives elsewhere (e.g. a CSR's)."""
    if not (server or client):
        raise PKIError("a certificate must be for server and/or client authentication")
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    is_rsa = isinstance(public_key, rsa.RSAPublicKey)
    builder = (
        _builder(_name(common_name, organizations), ca.cert.subject, public_key, days, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=is_rsa,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    san = _san(dns_names, ip_addresses)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(ca.key, _hash_for(ca.key))


def load_csr_pem(pem: str | bytes) -> x509.CertificateSigningRequest:
    """A PEM certificate signing request whose self-signature verifies (proof of key possession)."""
    try:
        csr = x509.load_pem_x509_csr(_bytes(pem))
    except ValueError as err:
        raise PKIError(f"not a PEM certificate request: {err}") from err
    if not csr.is_signature_valid:
        raise PKIError("certificate request signature does not verify")
    return csr


def cert_to_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def key_to_pem(key: PrivateKey) -> str:
    """Unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _bytes(pem: str | bytes) -> bytes:
    return pem.encode() if isinstance(pem, str) else pem


def load_cert_pem(pem: str | bytes) -> x509.Certificate:
    """The first certificate in `pem`."""
    return load_certs_pem(pem)[0]


def load_certs_pem(pem: str | bytes) -> list[x509.Certificate]:
    """All certificates in `pem` (a chain or bundle); at least one."""
    try:
        certs = x509.load_pem_x509_certificates(_bytes(pem))
    except ValueError as err:
        raise PKIError(f"not a PEM certificate: {err}") from err
    if not certs:
        raise PKIError("no PEM certificate found")
    return certs


def load_key_pem(pem: str | bytes) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(_bytes(pem), password=None)
    except (ValueError, TypeError) as err:
        raise PKIError(f"not an unencrypted PEM private key: {err}") from err
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey,
                            ed25519.Ed25519PrivateKey)):
        raise PKIError(f"unsupported private key type {type(key).__name__}")
    return key


def is_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether `ca` directly issued `cert` (issuer name matches and the signature verifies)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_hash(public_key: object) -> str:
    """`sha256:<hex>` of a public key's SubjectPublicKeyInfo (kubeadm's pin format): how a CA or a machine's
    key is named where only hashes travel (a worker's `--ca-cert-hash`, `gitops hypervisor`)."""
    der = public_key.public_bytes(serialization.Encoding.DER,  # type: ignore[attr-defined]
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def self_signed(key: PrivateKey, common_name: str, ip_addresses: Sequence[str] = (), days: int = 1) -> x509.Certificate:
    """A certificate of `key` signed by itself (no CA): what a peer pins by the key's hash (`key_hash`)."""
    name = _name(common_name)
    builder = _builder(name, name, key.public_key(), days, None)
    san = _san((), ip_addresses)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(key, _hash_for(key))


def make_csr(key: PrivateKey, common_name: str, ip_addresses: Sequence[str] = ()) -> str:
    """A PEM certificate request for `key` (it proves the key is held; the signer decides the contents)."""
    builder = x509.CertificateSigningRequestBuilder().subject_name(_name(common_name))
    san = _san((), ip_addresses)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(key, _hash_for(key)).public_bytes(serialization.Encoding.PEM).decode()
