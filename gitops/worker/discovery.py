"""Finding a cluster from the worker: `cluster-info` fetched without trust, then trusted by the CA's pin.

As kubeadm does it: the ConfigMap is read anonymously (TLS unverified: nothing is
trusted yet), its CA is accepted only if the SHA-256 of its public key matches the
hash the join command carries, and from then on every request verifies the server
against that CA. The bootstrap token is checked before anything is written.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass


from gitops.apipaths import CLUSTER_INFO, CSRS
from gitops.errors import GitopsError
from gitops.kubeapi import Credentials, KubeAPI, KubeAPIError
from gitops.kubeconfig import parse_cluster_info
from gitops.pki import PKIError, cert_to_pem, key_hash, load_cert_pem, load_certs_pem

TOKEN = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")


class JoinError(GitopsError):
    pass


@dataclass(frozen=True)
class Discovered:
    #: where the worker reaches the API (as given to `gitops join`)
    server: str
    ca_pem: str
    #: the endpoint cluster-info announces
    announced: str = ""
    #: the gitVersion the API server answers /version with ("v1.37.2"; "" if it did not say)
    server_version: str = ""


def ca_hash(ca_pem: str) -> str:
    """`sha256:<hex>` of the CA certificate's SubjectPublicKeyInfo (kubeadm's pin format)."""
    return key_hash(load_cert_pem(ca_pem).public_key())


def new_token() -> tuple[str, str]:
    """A bootstrap token's id and secret ([a-z0-9]{6} and {16})."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return ("".join(secrets.choice(alphabet) for _ in range(6)),
            "".join(secrets.choice(alphabet) for _ in range(16)))


def discover(server: str, token: str, pin: str, timeout: float = 10.0) -> Discovered:
    """The cluster at `server`, its CA checked against `pin` and `token` checked against the API."""
    if not TOKEN.match(token):
        raise JoinError("the token must look like abcdef.0123456789abcdef ([a-z0-9]{6}.[a-z0-9]{16})")
    if not pin.startswith("sha256:"):
        raise JoinError("--ca-cert-hash must be sha256:<hex of the CA's public key>")
    try:
        with KubeAPI(server, "", timeout=timeout) as untrusted:
            info = untrusted.get(CLUSTER_INFO)
    except KubeAPIError as err:
        raise JoinError(f"cannot read cluster-info from {server}: {err}") from None
    if info is None:
        raise JoinError(f"{server} has no cluster-info in kube-public: is it a gitops cluster, applied?")
    try:
        announced, ca_pem = parse_cluster_info((info.get("data") or {}).get("kubeconfig", ""))
        hashes = [ca_hash(cert_to_pem(cert)) for cert in load_certs_pem(ca_pem)]
        found = pin if pin in hashes else ", ".join(hashes)
    except (ValueError, PKIError) as err:
        raise JoinError(f"cluster-info at {server} is not a usable kubeconfig: {err}") from None
    if found != pin:  # during a CA rotation cluster-info holds old and new: either may be pinned
        raise JoinError(f"the cluster CA at {server} does not match the pinned hash: got {found}, expected {pin}; "
                        "refusing to trust it")
    with KubeAPI(server, ca_pem, Credentials(token=token), timeout=timeout) as api:
        try:
            api.request("GET", CSRS, query={"limit": "1"})
        except KubeAPIError as err:
            if err.status == 401:
                raise JoinError("the bootstrap token was refused (invalid or expired): create a new one with "
                                "`gitops join-token create`") from None
            if err.status != 403:
                raise JoinError(f"cannot check the bootstrap token: {err}") from None
        try:
            server_version = str(api.request("GET", "/version").get("gitVersion", ""))
        except KubeAPIError as err:
            raise JoinError(f"cannot read the API server's version at {server}: {err}") from None
    return Discovered(server=server, ca_pem=ca_pem, announced=announced, server_version=server_version)
