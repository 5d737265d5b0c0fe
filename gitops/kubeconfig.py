"""Kubeconfigs gitops writes and reads: admin kubeconfigs from the recorded admin credential, and
the `cluster-info` kubeconfig (server and CA, no user) workers discover a cluster with."""
from __future__ import annotations

import base64
import ssl
from urllib.parse import urlsplit

import yaml

from gitops.hostport import host_port
from gitops.kubeapi import MemoryFiles
from gitops.state.records import ClusterRecord


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def admin_kubeconfig(cluster: str, record: ClusterRecord, endpoint: str, host_override: str | None = None) -> str:
    """A kubeconfig for `kubernetes-admin` (O=system:masters) at `endpoint` (https://host:port)."""
    if record.admin is None:
        raise ValueError(f"cluster {cluster} has no admin credential yet")
    if host_override:
        parts = urlsplit(endpoint)
        endpoint = f"{parts.scheme}://{host_port(host_override, parts.port)}"
    user = f"{cluster}-admin"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": endpoint,
            "certificate-authority-data": _b64(record.trust_bundle("cluster")),
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": _b64(record.admin.cert_pem),
            "client-key-data": _b64(record.admin.key_pem),
        }}],
        "contexts": [{"name": f"{user}@{cluster}", "context": {"cluster": cluster, "user": user}}],
        "current-context": f"{user}@{cluster}",
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=True)


def cluster_info_kubeconfig(endpoint: str, ca_pem: str) -> str:
    """The kubeconfig `cluster-info` carries: server and CA, no user (as kubeadm publishes it)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "", "cluster": {"certificate-authority-data": _b64(ca_pem), "server": endpoint}}],
        "contexts": [], "current-context": "", "preferences": {}, "users": [],
    }, sort_keys=True)


def parse_cluster_info(text: str) -> tuple[str, str]:
    """(server, CA PEM) of a `cluster-info` kubeconfig; ValueError when it is not one."""
    try:
        cluster = yaml.safe_load(text)["clusters"][0]["cluster"]
        return str(cluster["server"]), base64.b64decode(cluster["certificate-authority-data"]).decode()
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError) as err:
        raise ValueError(f"not a cluster-info kubeconfig: {err}") from None


def admin_credentials(text: str) -> tuple[str, str, str, str]:
    """(server, CA PEM, client certificate PEM, client key PEM) of a kubeconfig with embedded
    credentials (what `admin_kubeconfig` writes), from its current context; ValueError otherwise."""
    try:
        config = yaml.safe_load(text)
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        return (str(cluster["server"]), base64.b64decode(cluster["certificate-authority-data"]).decode(),
                base64.b64decode(user["client-certificate-data"]).decode(),
                base64.b64decode(user["client-key-data"]).decode())
    except (yaml.YAMLError, KeyError, StopIteration, TypeError, ValueError) as err:
        raise ValueError(f"not a kubeconfig with embedded admin credentials: {type(err).__name__}: {err}") from None


def admin_tls(text: str, with_credentials: bool = True) -> tuple[str, int, ssl.SSLContext]:
    """(host, port, TLS context) to reach the API server of a kubeconfig with embedded credentials (what
    `admin_kubeconfig` writes): the context verifies the server with the kubeconfig's CA and, `with_credentials`,
    presents its client certificate (read through anonymous memory files: the key never touches the disk).
    ValueError for any other kubeconfig."""
    server, ca, cert, key = admin_credentials(text)
    context = ssl.create_default_context(cadata=ca)
    if with_credentials:
        with MemoryFiles() as files:
            context.load_cert_chain(files.add("admin-crt", cert), files.add("admin-key", key))
    url = urlsplit(server)
    if url.scheme != "https" or not url.hostname or not url.port:
        raise ValueError(f"kubeconfig server {server!r} is not https://host:port")
    return url.hostname, url.port, context
