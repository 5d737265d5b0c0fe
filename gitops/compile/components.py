"""What runs in each node's pod: containers, certificates, keys and files (pure).

A `controlplane` node runs etcd, kube-apiserver, kube-controller-manager and
kube-scheduler; a `controlplane-ingress` node runs haproxy balancing TCP over
every API server of its cluster. All bind the hypervisor's IP on allocated
ports (host networking). Components read everything from /etc/gitops, a host
directory written by the pod's `files` agent container.
"""
from __future__ import annotations

import ipaddress
import uuid
from dataclasses import asdict, replace

from gitops.compile.desired import (
    CLUSTER,
    MANAGED,
    MANAGER,
    NODE,
    ROLE,
    SPEC_HASH,
    CertificateSpec,
    DesiredContainer,
    DesiredPod,
    EtcdMember,
    FileSpec,
    KeySpec,
    ServiceAccountBundle,
    canonical_json,
    container_summary,
    digest,
    hash_inputs,
    identify,
)
from gitops.cri.types import ContainerSpec, Mount, SandboxSpec
from gitops.model import versions
from gitops.model.resources import CONTROLPLANE, Cluster, Hypervisor, Node
from gitops.model.semantics import is_ip
from gitops.state.records import ClusterRecord, NodeRecord

FILES = "/etc/gitops"
AGENT_ROOT = "/node"
ETCD_DATA = "/var/lib/etcd"
AGENT = "files"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
API_DNS_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")


def node_dir(hv: Hypervisor, node: Node) -> str:
    return f"{hv.data_dir.rstrip('/')}/{node.cluster}/{node.name}"


def service_ip(cluster: Cluster) -> str:
    """The `kubernetes` service IP: the first address of the service network."""
    return str(next(ipaddress.ip_network(cluster.service_cidr).hosts()))


def etcd_member(hv: Hypervisor, node: Node, record: NodeRecord) -> EtcdMember:
    return EtcdMember(
        node=node.name,
        peer_url=f"https://{hv.ip_address}:{record.ports['etcd-peer']}",
        client_url=f"https://{hv.ip_address}:{record.ports['etcd-client']}",
    )


def pod_for(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, cluster_record: ClusterRecord,
            peers: dict[str, tuple[Hypervisor, NodeRecord]]) -> DesiredPod:
    """The desired pod of `node`.

    `peers` maps every desired node of the same cluster (this one included) to
    its hypervisor and record: controlplane nodes feed the ingress backends,
    ingress hypervisors go into the API serving certificate.
    """
    if node.role == CONTROLPLANE:
        files, certs, keys, components = _controlplane(node, cluster, hv, record, cluster_record, peers)
    else:
        files, certs, keys, components = _ingress(node, cluster, hv, record, peers)
    files = (
        FileSpec("ca.crt", cluster_record.authorities["cluster"].cert_pem),
        *(() if node.role != CONTROLPLANE else (
            FileSpec("etcd-ca.crt", cluster_record.authorities["etcd"].cert_pem),
            FileSpec("front-proxy-ca.crt", cluster_record.authorities["front-proxy"].cert_pem),
        )),
        *files,
    )
    pod = assemble_pod(node, hv, cluster.image("agent"), files, certs, keys, components)
    return replace(pod, validity_days=cluster.validity_days, renew_before_days=cluster.renew_before_days)


def assemble_pod(node: Node, hv: Hypervisor, agent_image: str, files: tuple[FileSpec, ...],
                 certs: list[CertificateSpec], keys: tuple[KeySpec, ...],
                 components: tuple[ContainerSpec, ...]) -> DesiredPod:
    """A node's pod: its sandbox identity, the files agent first, then `components` in start order."""
    base = node_dir(hv, node)
    labels = {MANAGED: MANAGER, CLUSTER: node.cluster, NODE: node.name, ROLE: node.role}
    identity = {"cluster": node.cluster, "node": node.name, "hypervisor": hv.name, "dir": base}
    sandbox = SandboxSpec(
        name=node.name,
        namespace=node.cluster,
        uid=str(uuid.uuid5(uuid.NAMESPACE_URL, "gitops:" + canonical_json(identity))),
        labels={**labels, SPEC_HASH: digest(identity)},
        log_directory=f"{base}/logs",
    )
    agent = ContainerSpec(
        name=AGENT,
        image=agent_image,
        command=("sleep", "infinity"),
        mounts=(Mount(AGENT_ROOT, base),),
    )
    containers = tuple(finish_container(spec, labels, files, certs) for spec in (agent, *components))
    return DesiredPod(
        node=node.name, cluster=node.cluster, role=node.role, hypervisor=hv.name, sandbox=sandbox,
        files_dir=f"{base}/files", files=tuple(sorted(files, key=lambda f: f.name)),
        certificates=tuple(sorted(certs, key=lambda c: c.name)), keys=keys, containers=containers,
    )


def finish_container(spec: ContainerSpec, pod_labels: dict[str, str], files: tuple[FileSpec, ...],
                     certs: list[CertificateSpec]) -> DesiredContainer:
    """Attach identity labels and a hash covering the spec and every file it reads.

    A file known only after apply (a service-account bundle with keys the plan
    generates) makes the hash known after apply too: `resolve_container` fills it in.
    """
    text = " ".join(spec.args)
    used = [f for f in files if f"{FILES}/{f.name}" in text]
    text += " ".join(f.content for f in used)  # kubeconfigs name further files
    inputs = hash_inputs(
        container_summary(spec),
        {f.name: f.digest for f in files if f"{FILES}/{f.name}" in text},
        {c.name: asdict(c) for c in certs if f"{FILES}/{c.name}." in text},
    )
    full = identify(replace(spec, log_path=f"{spec.name}.log"), pod_labels, inputs)
    return DesiredContainer(spec=full, spec_hash=full.labels[SPEC_HASH])


def _files_mount(base: str) -> Mount:
    return Mount(FILES, f"{base}/files", readonly=True)


def _controlplane(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, cluster_record: ClusterRecord,
                  peers: dict[str, tuple[Hypervisor, NodeRecord]]):
    ip = hv.ip_address
    ports = record.ports
    base = node_dir(hv, node)
    files_mount = _files_mount(base)
    ingress_ips = sorted({p_hv.ip_address for name, (p_hv, _) in peers.items()
                          if p_hv.public})
    host_ips = [h for h in cluster.endpoint_hosts if is_ip(h)]
    host_names = [h for h in cluster.endpoint_hosts if not is_ip(h)]
    certs = [
        CertificateSpec("etcd-server", "etcd", node.name, dns_names=("localhost", node.name),
                        ip_addresses=(ip, "127.0.0.1"), server=True, client=True),
        CertificateSpec("etcd-peer", "etcd", node.name, dns_names=("localhost", node.name),
                        ip_addresses=(ip, "127.0.0.1"), server=True, client=True),
        CertificateSpec("apiserver-etcd-client", "etcd", "kube-apiserver-etcd-client", client=True),
        CertificateSpec("apiserver", "cluster", "kube-apiserver",
                        dns_names=tuple(sorted({*API_DNS_NAMES, *host_names, node.name})),
                        ip_addresses=tuple(_unique([service_ip(cluster), ip, *ingress_ips, *host_ips, "127.0.0.1"])),
                        server=True),
        CertificateSpec("apiserver-kubelet-client", "cluster", "kube-apiserver-kubelet-client",
                        organizations=("system:masters",), client=True),
        CertificateSpec("front-proxy-client", "front-proxy", "front-proxy-client", client=True),
        CertificateSpec("controller-manager", "cluster", "system:kube-controller-manager", client=True),
        CertificateSpec("scheduler", "cluster", "system:kube-scheduler", client=True),
    ]
    keys = (KeySpec("sa", "service-account"),)
    local_api = f"https://{ip}:{ports['apiserver']}"
    files = (
        _service_account_bundle(cluster.name, cluster_record, peers),
        FileSpec("controller-manager.kubeconfig", kubeconfig_with_files(cluster.name, local_api, "controller-manager")),
        FileSpec("scheduler.kubeconfig", kubeconfig_with_files(cluster.name, local_api, "scheduler")),
    )
    member = etcd_member(hv, node, record)
    etcd = ContainerSpec(
        name="etcd",
        image=cluster.image("etcd"),
        command=("etcd",),
        args=(
            f"--name={node.name}",
            f"--data-dir={ETCD_DATA}",
            f"--listen-client-urls={member.client_url}",
            f"--advertise-client-urls={member.client_url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={record.etcd_initial_cluster}",
            f"--initial-cluster-state={record.etcd_initial_state}",
            f"--initial-cluster-token={cluster.name}",
            "--client-cert-auth=true",
            f"--trusted-ca-file={FILES}/etcd-ca.crt",
            f"--cert-file={FILES}/etcd-server.crt",
            f"--key-file={FILES}/etcd-server.key",
            "--peer-client-cert-auth=true",
            f"--peer-trusted-ca-file={FILES}/etcd-ca.crt",
            f"--peer-cert-file={FILES}/etcd-peer.crt",
            f"--peer-key-file={FILES}/etcd-peer.key",
            "--snapshot-count=10000",
        ),
        mounts=(files_mount, Mount(ETCD_DATA, f"{base}/etcd")),
    )
    apiserver = ContainerSpec(
        name="kube-apiserver",
        image=cluster.image("kubeApiserver"),
        command=("kube-apiserver",),
        args=(
            f"--advertise-address={ip}",
            f"--bind-address={ip}",
            f"--secure-port={ports['apiserver']}",
            f"--etcd-servers={member.client_url}",
            f"--etcd-cafile={FILES}/etcd-ca.crt",
            f"--etcd-certfile={FILES}/apiserver-etcd-client.crt",
            f"--etcd-keyfile={FILES}/apiserver-etcd-client.key",
            f"--client-ca-file={FILES}/ca.crt",
            f"--tls-cert-file={FILES}/apiserver.crt",
            f"--tls-private-key-file={FILES}/apiserver.key",
            f"--kubelet-client-certificate={FILES}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={FILES}/apiserver-kubelet-client.key",
            f"--proxy-client-cert-file={FILES}/front-proxy-client.crt",
            f"--proxy-client-key-file={FILES}/front-proxy-client.key",
            f"--requestheader-client-ca-file={FILES}/front-proxy-ca.crt",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={FILES}/sa-pub.pem",
            f"--service-account-signing-key-file={FILES}/sa.key",
            f"--service-cluster-ip-range={cluster.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--enable-bootstrap-token-auth=true",
            "--allow-privileged=true",
            *_no_insecure_port(cluster, "--insecure-port=0"),
        ),
        mounts=(files_mount,),
    )
    controller_manager = ContainerSpec(
        name="kube-controller-manager",
        image=cluster.image("kubeControllerManager"),
        command=("kube-controller-manager",),
        args=(
            f"--bind-address={ip}",
            f"--secure-port={ports['controller-manager']}",
            f"--kubeconfig={FILES}/controller-manager.kubeconfig",
            f"--authentication-kubeconfig={FILES}/controller-manager.kubeconfig",
            f"--authorization-kubeconfig={FILES}/controller-manager.kubeconfig",
            f"--client-ca-file={FILES}/ca.crt",
            f"--requestheader-client-ca-file={FILES}/front-proxy-ca.crt",
            f"--root-ca-file={FILES}/ca.crt",
            f"--service-account-private-key-file={FILES}/sa.key",
            f"--service-cluster-ip-range={cluster.service_cidr}",
            f"--cluster-cidr={cluster.pod_cidr}",
            "--leader-elect=true",
            "--use-service-account-credentials=true",
            "--controllers=*,bootstrapsigner,tokencleaner",
            *_no_insecure_port(cluster, "--port=0"),
        ),
        mounts=(files_mount,),
    )
    scheduler = ContainerSpec(
        name="kube-scheduler",
        image=cluster.image("kubeScheduler"),
        command=("kube-scheduler",),
        args=(
            f"--bind-address={ip}",
            f"--secure-port={ports['scheduler']}",
            f"--kubeconfig={FILES}/scheduler.kubeconfig",
            f"--authentication-kubeconfig={FILES}/scheduler.kubeconfig",
            f"--authorization-kubeconfig={FILES}/scheduler.kubeconfig",
            "--leader-elect=true",
            *_no_insecure_port(cluster, "--port=0"),
        ),
        mounts=(files_mount,),
    )
    return files, certs, keys, (etcd, apiserver, controller_manager, scheduler)


def _service_account_bundle(cluster: str, record: ClusterRecord,
                            peers: dict[str, tuple[Hypervisor, NodeRecord]]) -> FileSpec:
    """sa-pub.pem: every key recorded for the cluster and the retired ones; known after apply while a
    controlplane peer has no key recorded yet (the plan generates it)."""
    controlplane = sorted(name for name, (p_hv, p_rec) in peers.items()
                          if not p_hv.public and "apiserver" in p_rec.ports)
    missing = tuple(n for n in controlplane if n not in record.service_account_keys)
    if missing:
        return FileSpec("sa-pub.pem", "", ServiceAccountBundle(cluster, missing))
    return FileSpec("sa-pub.pem", "".join(record.trusted_service_account_keys()))


def _no_insecure_port(cluster: Cluster, flag: str) -> tuple[str, ...]:
    """Before 1.24 the components also serve plain HTTP (API server: 8080 on localhost;
    controller-manager and scheduler: 10252/10251 on every address, so two on one
    hypervisor collide) unless this flag turns it off; 1.24 removed the flags."""
    return (flag,) if versions.minor(cluster.kubernetes_version) < 24 else ()


def _ingress(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord,
             peers: dict[str, tuple[Hypervisor, NodeRecord]]):
    backends = sorted(
        (name, f"{p_hv.ip_address}:{p_rec.ports['apiserver']}")
        for name, (p_hv, p_rec) in peers.items()
        if not p_hv.public and "apiserver" in p_rec.ports
    )
    config = haproxy_config(hv.ip_address, record.ports["apiserver"], backends, ready_check_ca=f"{FILES}/ca.crt")
    files = (FileSpec("haproxy.cfg", config),)
    return files, [], (), (haproxy_container(cluster.image("haproxy"), node_dir(hv, node)),)


def haproxy_container(image: str, base: str) -> ContainerSpec:
    """haproxy in the foreground on the `haproxy.cfg` the files agent wrote under `base`."""
    return ContainerSpec(
        name="haproxy",
        image=image,
        command=("haproxy",),
        args=("-W", "-db", "-f", f"{FILES}/haproxy.cfg"),
        mounts=(_files_mount(base),),
    )


def haproxy_config(ip: str, port: int, backends: list[tuple[str, str]], ready_check_ca: str | None = None) -> str:
    """TCP pass-through to every backend: TLS and client certificates stay end to end.

    With `ready_check_ca` (a CA file in the pod), a backend takes traffic only while its
    `GET /readyz` over TLS (verified against that CA) answers 200, so an API server that is
    starting or stopping gets none; otherwise a TCP connect is the check. A connection
    refused by a backend that just went away is retried on another one.
    """
    lines = [
        "global",
        "  maxconn 4096",
        "defaults",
        "  mode tcp",
        "  timeout connect 5s",
        "  timeout client 1h",
        "  timeout server 1h",
        "  timeout check 2s",
        "  retries 3",
        "  option redispatch 1",
        "frontend apiserver",
        f"  bind {ip}:{port}",
        "  default_backend apiservers",
        "backend apiservers",
        "  balance roundrobin",
    ]
    if ready_check_ca:
        lines += ["  option httpchk", "  http-check send meth GET uri /readyz", "  http-check expect status 200"]
        check = f"check check-ssl verify required ca-file {ready_check_ca} inter 1s fall 1 rise 2"
    else:
        lines += ["  option tcp-check"]
        check = "check inter 2s fall 2 rise 1"
    lines += [f"  server {name} {address} {check}" for name, address in backends]
    return "\n".join(lines) + "\n"


def kubeconfig_with_files(cluster: str, server: str, user: str) -> str:
    """A kubeconfig that points at certificate files instead of embedding them."""
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {FILES}/ca.crt\n"
        f"users:\n- name: {user}\n  user:\n    client-certificate: {FILES}/{user}.crt\n"
        f"    client-key: {FILES}/{user}.key\n"
        f"contexts:\n- name: {user}@{cluster}\n  context:\n    cluster: {cluster}\n    user: {user}\n"
        f"current-context: {user}@{cluster}\n"
    )


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
