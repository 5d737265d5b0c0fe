"""The files a worker runs on (pure): bootstrap kubeconfig, kubelet and kube-proxy configurations,
a bridge CNI network. Everything lives under one directory, so leaving removes it whole."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class WorkerSpec:
    """One worker: its name and address, where its CRI is, where its files go."""

    name: str
    ip: str
    server: str
    cri_endpoint: str
    dir: Path
    kubelet_port: int = 10250
    proxy_port: int = 10256  # kube-proxy healthz; metrics on the next port
    #: the pod network of this worker's bridge (written when `cni_conf_dir` is set)
    pod_cidr: str = "10.88.0.0/24"
    cni_conf_dir: Path | None = None
    bridge: str = "gitops0"
    #: kubelet's makeIPTablesUtilChains (its KUBE-FIREWALL drops non-loopback sources to 127.0.0.0/8)
    iptables_util_chains: bool = True

    @property
    def bootstrap_kubeconfig(self) -> Path:
        return self.dir / "bootstrap.kubeconfig"

    @property
    def kubeconfig(self) -> Path:
        """Written by the kubelet once its client certificate is signed; kube-proxy uses it too."""
        return self.dir / "kubelet.kubeconfig"

    @property
    def client_certificate(self) -> Path:
        """The kubelet's signed client certificate and key (it writes `kubeconfig` before it has one)."""
        return self.dir / "pki" / "kubelet-client-current.pem"

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def root_dir(self) -> Path:
        return self.dir / "kubelet"

    @property
    def cni_file(self) -> Path | None:
        return self.cni_conf_dir / f"10-{self.bridge}.conflist" if self.cni_conf_dir else None


def bootstrap_kubeconfig(spec: WorkerSpec, token: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": spec.server, "certificate-authority": str(spec.ca_file)}}],
        "users": [{"name": "kubelet-bootstrap", "user": {"token": token}}],
        "contexts": [{"name": "bootstrap", "context": {"cluster": "cluster", "user": "kubelet-bootstrap"}}],
        "current-context": "bootstrap",
    }, sort_keys=True)


def kubelet_config(spec: WorkerSpec) -> str:
    """Serving certificate requested from the cluster (gitops signs it), webhook authn/authz against the API,
    no eviction or image GC (images are imported, not pulled, in the lab and on air-gapped machines).
    `failCgroupV1: false`: kubelet 1.35+ refuses a cgroup v1 host unless told (KEP-5573); on cgroup v2 it
    changes nothing."""
    return yaml.safe_dump({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": spec.ip,
        "port": spec.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(spec.ca_file)}},
        "authorization": {"mode": "Webhook"},
        "serverTLSBootstrap": True,
        "rotateCertificates": True,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": spec.cri_endpoint,
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "clusterDomain": "cluster.local",
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                         "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "volumePluginDir": str(spec.dir / "volume-plugins"),
        "makeIPTablesUtilChains": spec.iptables_util_chains,
    }, sort_keys=True)


def kubelet_args(spec: WorkerSpec) -> list[str]:
    return [
        f"--config={spec.dir / 'kubelet.yaml'}",
        f"--bootstrap-kubeconfig={spec.bootstrap_kubeconfig}",
        f"--kubeconfig={spec.kubeconfig}",
        f"--cert-dir={spec.client_certificate.parent}",
        f"--root-dir={spec.root_dir}",
        f"--node-ip={spec.ip}",
        f"--hostname-override={spec.name}",
        "--v=1",
    ]


def kube_proxy_config(spec: WorkerSpec, cluster_cidr: str) -> str:
    """iptables mode on the node's own credentials; masquerades everything so a pod reaching a Service
    backed by a pod on the same bridge gets its answer back without br_netfilter. NodePorts on 127.0.0.1
    (`localhostNodePorts`) only where the kubelet's own chains are wanted: kube-proxy 1.26+ adds the same
    KUBE-FIREWALL drop of non-loopback sources to 127.0.0.0/8 for them."""
    return yaml.safe_dump({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "bindAddress": spec.ip,
        "healthzBindAddress": f"{spec.ip}:{spec.proxy_port}",
        "metricsBindAddress": f"{spec.ip}:{spec.proxy_port + 1}",
        "clientConnection": {"kubeconfig": str(spec.kubeconfig)},
        "clusterCIDR": cluster_cidr,
        "hostnameOverride": spec.name,
        "mode": "iptables",
        "conntrack": {"maxPerCore": 0},
        "iptables": {"masqueradeAll": True, "localhostNodePorts": spec.iptables_util_chains},
        "nodePortAddresses": ["primary"],
    }, sort_keys=True)


def kube_proxy_args(spec: WorkerSpec) -> list[str]:
    return [f"--config={spec.dir / 'kube-proxy.yaml'}", "--v=1"]


def bridge_network(spec: WorkerSpec) -> str:
    """A bridge with host-local addresses from `pod_cidr` (CNI plugins from Debian's
    containernetworking-plugins); no masquerade of its own (kube-proxy's rules do that)."""
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": spec.bridge,
        "plugins": [
            {"type": "bridge", "bridge": spec.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": spec.pod_cidr}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
        ],
    }, indent=2, sort_keys=True) + "\n"


def systemd_unit(description: str, argv: list[str], after: str = "") -> str:
    quoted = " ".join(a if all(c not in a for c in " \"'\\") else json.dumps(a) for a in argv)
    return (f"[Unit]\nDescription={description}\n" + (f"After={after}\nRequires={after}\n" if after else "")
            + f"\n[Service]\nExecStart={quoted}\nRestart=always\nRestartSec=5\n\n[Install]\nWantedBy=multi-user.target\n")


