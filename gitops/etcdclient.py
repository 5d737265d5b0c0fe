"""TLS to etcd members for the controller: a short-lived client certificate from the etcd CA.

The controller holds the etcd CA, so it issues itself a one-day client certificate; Python's ssl
module loads a key only from a file, so the key is handed over as an anonymous in-memory file
(`MemoryFiles`) and never touches the disk. Membership changes (`gitops.apply.etcd`) and snapshots
(`gitops.backup`) both talk to etcd's v3 JSON gateway through this context.
"""
from __future__ import annotations

import datetime as dt
import ssl

from gitops.kubeapi import MemoryFiles
from gitops.pki import CertKey, issue_cert


def client_context(ca: CertKey, trust: str = "") -> ssl.SSLContext:
    """A context presenting a fresh client certificate signed by `ca`, verifying members against
    `trust` (default: `ca`'s certificate; during a CA rotation, the bundle of old and new)."""
    cert = issue_cert(ca, "gitops-controller", client=True, days=1, now=dt.datetime.now(dt.timezone.utc))
    context = ssl.create_default_context(cadata=trust or ca.cert_pem)
    with MemoryFiles() as files:  # read once: the context keeps them
        context.load_cert_chain(files.add("etcd-client-cert", cert.cert_pem), files.add("etcd-client-key", cert.key_pem))
    return context
