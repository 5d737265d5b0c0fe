"""Whether a private key is the half of a certificate (pure; no gitops import): the one check, used by
`gitops.pki` (PEM pairs, the repo's Hypervisor client certificates) and by the CRI client (its endpoint's)
without the CRI client depending on the PKI."""
from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa


def key_matches_cert(key: object, cert: x509.Certificate) -> bool:
    """Whether `key` is the private half of `cert`'s public key (never for a key of a kind gitops does not
    use: ECDSA, RSA and Ed25519 only). The one check of a key against its certificate: PEM pairs, the
    repo's Hypervisor client certificates, a CRI endpoint's."""
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey)):
        return False
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    return key.public_key().public_bytes(enc, pub) == cert.public_key().public_bytes(enc, pub)
