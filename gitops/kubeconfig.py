"""Kubeconfigs gitops writes and reads: admin kubeconfigs from the recorded admin credential, a person's
(their token from an exec plugin), and the `cluster-info` kubeconfig (server and CA, no user) workers
discover a cluster with."""
from __future__ import annotations

import base64
from urllib.parse import urlsplit

import yaml

from gitops.hostport import host_port
from gitops.state.records import ClusterRecord


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _kubeconfig(cluster: str, record: ClusterRecord, endpoint: str, host_override: str | None, user: str,
                credential: dict, context: str) -> str:
    """One cluster (the recorded cluster CA, `endpoint` with `host_override` as its host), one user, one
    context, as YAML with sorted keys."""
    if host_override:
        parts = urlsplit(endpoint)
        endpoint = f"{parts.scheme}://{host_port(host_override, parts.port)}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": endpoint,
            "certificate-authority-data": _b64(record.trust_bundle("cluster")),
        }}],
        "users": [{"name": user, "user": credential}],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": user}}],
        "current-context": context,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=True)


def admin_kubeconfig(cluster: str, record: ClusterRecord, endpoint: str, host_override: str | None = None) -> str:
    """A kubeconfig for `kubernetes-admin` (O=system:masters) at `endpoint` (https://host:port)."""
    if record.admin is None:
        raise ValueError(f"cluster {cluster} has no admin credential yet")
    user = f"{cluster}-admin"
    credential = {"client-certificate-data": _b64(record.admin.cert_pem),
                  "client-key-data": _b64(record.admin.key_pem)}
    return _kubeconfig(cluster, record, endpoint, host_override, user, credential, f"{user}@{cluster}")


def person_kubeconfig(cluster: str, record: ClusterRecord, endpoint: str, username: str, plugin_args: list[str],
                      host_override: str | None = None) -> str:
    """A kubeconfig for `username`, whose token `gitops <plugin_args>` prints (an exec credential plugin)."""
    user = f"{username}@{cluster}"
    credential = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "gitops",
                           "args": plugin_args,
                           "installHint": "gitops oidc-login comes with gitops: pip install gitops"}}
    return _kubeconfig(cluster, record, endpoint, host_override, user, credential, user)


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
