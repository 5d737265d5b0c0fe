"""Small, generic x509 helpers (CA, server/client certificates, PEM) on `cryptography`.

Cluster PKI (etcd, apiserver, ...) and the lab's mTLS certificates are built on these.
"""
from gitops.pki.x509 import (
    CertKey,
    PKIError,
    PrivateKey,
    cert_to_pem,
    create_ca,
    cross_sign,
    generate_key,
    is_signed_by,
    issue_cert,
    key_hash,
    key_matches_cert,
    key_to_pem,
    load_cert_pem,
    load_certs_pem,
    load_csr_pem,
    load_key_pem,
    sign_public_key,
)

__all__ = [
    "CertKey",
    "PKIError",
    "PrivateKey",
    "cert_to_pem",
    "create_ca",
    "cross_sign",
    "generate_key",
    "is_signed_by",
    "issue_cert",
    "key_hash",
    "key_matches_cert",
    "key_to_pem",
    "load_cert_pem",
    "load_certs_pem",
    "load_csr_pem",
    "load_key_pem",
    "sign_public_key",
]
