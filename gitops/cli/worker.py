"""`gitops join-token create`, `gitops join`, `gitops follow` and `gitops leave`: worker machines."""
from __future__ import annotations

import datetime as dt
import re
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

import click

from gitops.cli.reconcile import applied_cluster, repo_argument, state_option
from gitops.errors import GitopsError
from gitops.kubeapi import Credentials, KubeAPI
from gitops.pods import MANAGED, MANAGER
from gitops.worker.configs import WorkerSpec
from gitops.worker.discovery import ca_hash, new_token
from gitops.worker.run import follow as follow_server
from gitops.worker.run import join as join_worker
from gitops.worker.run import leave as leave_worker

TOKEN_GROUP = "system:bootstrappers:gitops"


def _duration(text: str) -> dt.timedelta:
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not match:
        raise click.BadParameter("use a number and a unit: 30m, 24h, 7d")
    return dt.timedelta(seconds=int(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]])


@click.group("join-token")
def join_token() -> None:
    """Bootstrap tokens for workers (kept in the cluster only: never in git or on the status branch)."""


@join_token.command("create")
@repo_argument
@state_option
@click.option("--cluster", required=True, help="Cluster name.")
@click.option("--ttl", default="24h", show_default=True, help="How long the token joins workers (30m, 24h, 7d).")
def join_token_create(repo: Path, state_dir: Path | None, cluster: str, ttl: str) -> None:
    """Create a bootstrap token in CLUSTER and print the `gitops join` command a worker runs."""
    lifetime = _duration(ttl)
    record, endpoint, _ = applied_cluster(repo, state_dir, cluster)
    if endpoint is None:
        raise GitopsError(f"Cluster {cluster} has no controlplane-ingress Node: workers have nothing to join")
    token_id, secret = new_token()
    expires = (dt.datetime.now(dt.timezone.utc) + lifetime).replace(microsecond=0)
    body = {
        "apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system", "labels": {MANAGED: MANAGER}},
        "stringData": {
            "token-id": token_id, "token-secret": secret,
            "expiration": expires.isoformat().replace("+00:00", "Z"),
            "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
            "auth-extra-groups": TOKEN_GROUP, "description": "created by gitops join-token create",
        },
    }
    ca = record.authorities["cluster"].cert_pem  # the pin: the CA that signs (cluster-info holds it)
    with KubeAPI(endpoint, record.trust_bundle("cluster"), Credentials(record.admin.cert_pem, record.admin.key_pem)) as api:
        api.create("/api/v1/namespaces/kube-system/secrets", body)
    click.echo(f"# token {token_id} for cluster {cluster}, valid until {expires.isoformat()}; on the worker:")
    click.echo(f"gitops join {endpoint} --token {token_id}.{secret} --ca-cert-hash {ca_hash(ca)}")


def _default_ip(server: str) -> str:
    """The address this machine uses to reach `server` (no packet is sent)."""
    host = urlsplit(server).hostname or ""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def _binary(name: str, given: str | None) -> str:
    if given:
        return given
    found = shutil.which(name)
    if found:
        return found
    from gitops.lab import kubebin  # the binaries scripts/build-kubernetes.sh cached
    from gitops.lab.errors import LabError

    try:
        return str(kubebin.binary(name))
    except LabError as err:
        raise GitopsError(f"no {name} on PATH and {err}; or pass --{name} PATH") from None


@click.command()
@click.argument("server")
@click.option("--token", required=True, help="ID.SECRET from `gitops join-token create`.")
@click.option("--ca-cert-hash", required=True, help="sha256:HEX pin of the cluster CA's public key.")
@click.option("--node-name", default=lambda: socket.gethostname(), show_default="the host name")
@click.option("--node-ip", help="Address kubelet serves on and registers; default: the one that reaches SERVER.")
@click.option("--cri-endpoint", default="unix:///run/containerd/containerd.sock", show_default=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/var/lib/gitops-worker"), show_default=True,
              help="Everything of this worker: configuration, certificates, kubelet root, logs.")
@click.option("--kubelet-port", type=int, default=10250, show_default=True)
@click.option("--proxy-port", type=int, default=10256, show_default=True,
              help="kube-proxy healthz port (metrics on the next one).")
@click.option("--cni-conf-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write a bridge network here (the CRI's CNI configuration directory).")
@click.option("--pod-cidr", default="10.88.0.0/24", show_default=True, help="The bridge network's addresses.")
@click.option("--cluster-cidr", default="10.88.0.0/16", show_default=True,
              help="All pod addresses (kube-proxy: traffic from elsewhere is masqueraded).")
@click.option("--bridge", default="gitops0", show_default=True)
@click.option("--kubelet", help="kubelet binary (default: PATH, then gitops's cached build of the newest release).")
@click.option("--kube-proxy", help="kube-proxy binary (default: PATH, then the cached build).")
@click.option("--systemd-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write systemd units here instead of starting kubelet and kube-proxy.")
@click.option("--timeout", type=float, default=600, show_default=True,
              help="Seconds to wait for the node's client certificate.")
@click.option("--kubelet-iptables-util-chains/--no-kubelet-iptables-util-chains", default=True, show_default=True,
              help="kubelet's makeIPTablesUtilChains: its KUBE-FIREWALL chain drops new connections from a "
                   "non-loopback source to 127.0.0.0/8. Off on a worker that reaches its cluster at a loopback "
                   "address of another network namespace (the lab's workers).")
def join(server: str, token: str, ca_cert_hash: str, node_name: str, node_ip: str | None, cri_endpoint: str,
         directory: Path, kubelet_port: int, proxy_port: int, cni_conf_dir: Path | None, pod_cidr: str,
         cluster_cidr: str, bridge: str, kubelet: str | None, kube_proxy: str | None, systemd_dir: Path | None,
         timeout: float, kubelet_iptables_util_chains: bool) -> None:
    """Join this machine to the cluster at SERVER as a worker (run on the worker, as root)."""
    spec = WorkerSpec(name=node_name, ip=node_ip or _default_ip(server), server=server, cri_endpoint=cri_endpoint,
                      dir=directory.resolve(), kubelet_port=kubelet_port, proxy_port=proxy_port, pod_cidr=pod_cidr,
                      cni_conf_dir=cni_conf_dir.resolve() if cni_conf_dir else None, bridge=bridge,
                      iptables_util_chains=kubelet_iptables_util_chains)
    join_worker(spec, token, ca_cert_hash, kubelet=_binary("kubelet", kubelet),
                kube_proxy=_binary("kube-proxy", kube_proxy), cluster_cidr=cluster_cidr, systemd_dir=systemd_dir,
                timeout=timeout, say=click.echo)


@click.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/var/lib/gitops-worker"), show_default=True)
def leave(directory: Path) -> None:
    """Take this worker out: stop kubelet and kube-proxy, delete its Node, clean the machine."""
    if not leave_worker(directory.resolve(), say=click.echo):
        click.echo(f"no worker in {directory}")


@click.command()
@click.argument("server")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/var/lib/gitops-worker"), show_default=True)
@click.option("--timeout", type=float, default=120, show_default=True,
              help="Seconds to wait for the node to be Ready through SERVER.")
def follow(server: str, directory: Path, timeout: float) -> None:
    """Point this joined worker at SERVER, its cluster's new API endpoint (a plan said it moves: a second
    ingress node gives the cluster a virtual IP). SERVER must serve the same cluster; kubelet and kube-proxy
    restart on it (run on the worker, as root)."""
    follow_server(directory.resolve(), server, timeout=timeout, say=click.echo)


COMMANDS: list[click.Command] = [join_token, join, follow, leave]
