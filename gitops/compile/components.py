"""What runs in each node's pod: containers, certificates, keys and files (pure).

A `controlplane` node runs etcd, kube-apiserver, kube-controller-manager and
kube-scheduler; a `controlplane-ingress` node runs haproxy balancing TCP over
every API server of its cluster. All bind the hypervisor's IP on allocated
ports (host networking). Components read everything from /etc/gitops, a host
directory written by the pod's `files` agent container.
"""
from __future__ import annotations

import ipaddress
import sys
import uuid
from dataclasses import asdict, replace

from gitops.compile.desired import (
    CertificateSpec,
    ClusterTrust,
    DesiredContainer,
    DesiredPod,
    FileSpec,
    KeySpec,
    ServiceAccountBundle,
    VirtualIP,
    canonical_json,
    container_summary,
    digest,
    hash_inputs,
    identify,
)
from gitops.compile.placement import etcd_member
from gitops.cri.types import ContainerSpec, Mount, SandboxSpec
from gitops.hostport import host_port, url_host
from gitops.model.components import (
    APISERVER,
    CONTROLLER_MANAGER,
    CONTROLPLANE,
    ETCD,
    HAPROXY,
    INGRESS_CHECK_PORT,
    KEEPALIVED,
    ROLES,
    SCHEDULER,
    reload_of,
    rollout_of,
)
from gitops.model.resources import Cluster, Hypervisor, Node
from gitops.model.semantics import is_ip
from gitops.pods import AGENT, AGENT_ROOT, CLUSTER, FILES, MANAGED, MANAGER, NODE, ROLE, SPEC_HASH
from gitops.state.records import NodeRecord

ETCD_DATA = "/var/lib/etcd"
#: seconds a stopping API server keeps serving while /readyz fails, so the ingress (a check every
#: second, out at the first failure, 2 s timeout) stops sending it requests before its port closes
SHUTDOWN_DELAY = 3
#: the file of spec.apiServer.oidc.caBundle, beside the others the API server reads
OIDC_CA = "oidc-ca.crt"
#: the ingress's health check of an API server (haproxy): every READY_CHECK_INTER s, READY_CHECK_RISE answers in
#: a row count it in again; so an API server ready on its own /readyz is surely routed to INGRESS_COUNTS_IN s later
READY_CHECK_INTER, READY_CHECK_RISE = 1, 2
INGRESS_COUNTS_IN = READY_CHECK_INTER * READY_CHECK_RISE + 1
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
API_DNS_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")


def node_dir(hv: Hypervisor, node: Node) -> str:
    return f"{hv.data_dir.rstrip('/')}/{node.cluster}/{node.name}"


def service_ip(cluster: Cluster) -> str:
    """The `kubernetes` service IP: the first address of the service network."""
    return str(next(ipaddress.ip_network(cluster.service_cidr).hosts()))


def pod_for(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, trust: ClusterTrust,
            peers: dict[str, tuple[Hypervisor, NodeRecord]], address: VirtualIP | None = None) -> DesiredPod:
    """The desired pod of `node`.

    `trust`: what the cluster's pods trust and present (`ClusterTrust`, from its record). `peers` maps every
    desired node of the same cluster (this one included) to
    its hypervisor and record: controlplane nodes feed the ingress backends,
    ingress hypervisors go into the API serving certificate. `address`: the cluster's virtual IP, which
    its API serving certificate names and its ingress nodes serve (keepalived decides which one holds it).
    """
    if node.role == CONTROLPLANE:
        files, certs, keys, components = _controlplane(node, cluster, hv, record, trust, peers, address)
    else:
        files, certs, keys, components = _ingress(node, cluster, hv, record, peers, address)
    files = (
        FileSpec("ca.crt", trust.bundles["cluster"]),
        *(() if node.role != CONTROLPLANE else (
            FileSpec("etcd-ca.crt", trust.bundles["etcd"]),
            FileSpec("front-proxy-ca.crt", trust.bundles["front-proxy"]),
        )),
        *files,
    )
    pod = assemble_pod(node, hv, cluster.image(AGENT), files, certs, keys, components)
    api_url = f"https://{host_port(hv.ip_address, record.ports['apiserver'])}" if node.role == CONTROLPLANE else ""
    chains = tuple((c.name, trust.chains[c.signer]) for c in pod.certificates
                   if c.server and trust.chains.get(c.signer))
    return replace(pod, validity_days=cluster.validity_days, renew_before_days=cluster.renew_before_days,
                   api_url=api_url, chains=chains)


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
        labels={**labels, SPEC_HASH: sys.intern(digest(identity))},  # shared with the observed pod's
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
    full = identify(replace(spec, image=sys.intern(spec.image), args=_shared(spec.args),
                            log_path=sys.intern(f"{spec.name}.log")), pod_labels, inputs)
    return DesiredContainer(spec=full, spec_hash=full.labels[SPEC_HASH], rollout=rollout_of(spec.name),
                            reload=reload_of(spec.name))


def _shared(items: tuple[str, ...]) -> tuple[str, ...]:
    """`items` interned: most arguments are the same text in every pod of a role (file paths, fixed
    flags) or of a hypervisor (addresses, ports), and compiled pods stay cached for the whole fleet."""
    return tuple(map(sys.intern, items))


def files_dir_mount(base: str) -> Mount:
    """The node's files directory (under `base`), read-only at /etc/gitops."""
    return Mount(FILES, f"{base}/files", readonly=True)


def _controlplane(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, trust: ClusterTrust,
                  peers: dict[str, tuple[Hypervisor, NodeRecord]], address: VirtualIP | None = None):
    """Files, certificates, keys and the components of a controlplane node (its role's), in start order."""
    files_mount = files_dir_mount(node_dir(hv, node))
    local_api = f"https://{host_port(hv.ip_address, record.ports['apiserver'])}"
    files = (
        _service_account_bundle(cluster.name, trust, peers),
        FileSpec("controller-manager.kubeconfig", kubeconfig_with_files(cluster.name, local_api, "controller-manager")),
        FileSpec("scheduler.kubeconfig", kubeconfig_with_files(cluster.name, local_api, "scheduler")),
        # the CA of the issuer people log in through (spec.apiServer.oidc.caBundle), which the API server checks
        *((FileSpec(OIDC_CA, cluster.oidc.ca_bundle),) if cluster.oidc is not None and cluster.oidc.ca_bundle else ()),
    )
    components = tuple(CONTROLPLANE_CONTAINERS[name](node, cluster, hv, record, files_mount)
                       for name in ROLES[node.role].components)
    return files, _controlplane_certificates(node, cluster, hv, peers, address), (_SERVICE_ACCOUNT_KEY,), components


def _controlplane_certificates(node: Node, cluster: Cluster, hv: Hypervisor,
                               peers: dict[str, tuple[Hypervisor, NodeRecord]],
                               address: VirtualIP | None = None) -> list[CertificateSpec]:
    """The node's leaf certificates; the API server's names every way a client reaches it."""
    ip = hv.ip_address
    ingress_ips = sorted({p_hv.ip_address for p_hv, _ in peers.values() if p_hv.public})
    if address is not None:
        ingress_ips.append(address.address)
    host_ips = [h for h in cluster.endpoint_hosts if is_ip(h)]
    host_names = [h for h in cluster.endpoint_hosts if not is_ip(h)]
    local_names, local_ips = ("localhost", node.name), (ip, "127.0.0.1")
    return [
        CertificateSpec("etcd-server", "etcd", node.name, dns_names=local_names,
                        ip_addresses=local_ips, server=True, client=True),
        CertificateSpec("etcd-peer", "etcd", node.name, dns_names=local_names,
                        ip_addresses=local_ips, server=True, client=True),
        _APISERVER_ETCD_CLIENT,
        CertificateSpec("apiserver", "cluster", "kube-apiserver",
                        dns_names=tuple(sorted({*API_DNS_NAMES, *host_names, node.name})),
                        ip_addresses=tuple(_unique([service_ip(cluster), ip, *ingress_ips, *host_ips, "127.0.0.1"])),
                        server=True),
        *_CLIENT_CERTIFICATES,
    ]


#: the controlplane's client certificates that are the same on every node (one object for the whole fleet:
#: compiled pods stay cached)
_APISERVER_ETCD_CLIENT = CertificateSpec("apiserver-etcd-client", "etcd", "kube-apiserver-etcd-client", client=True)
_CLIENT_CERTIFICATES = (
    CertificateSpec("apiserver-kubelet-client", "cluster", "kube-apiserver-kubelet-client",
                    organizations=("system:masters",), client=True),
    CertificateSpec("front-proxy-client", "front-proxy", "front-proxy-client", client=True),
    CertificateSpec("controller-manager", "cluster", "system:kube-controller-manager", client=True),
    CertificateSpec("scheduler", "cluster", "system:kube-scheduler", client=True),
)
_SERVICE_ACCOUNT_KEY = KeySpec("sa", "service-account")


def _etcd(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, files_mount: Mount) -> ContainerSpec:
    member = etcd_member(hv, node, record)
    return ContainerSpec(
        name=ETCD,
        image=cluster.image(ETCD),
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
            # a member cut off from the others (a partition) campaigns alone; without pre-vote each campaign
            # raises its term, and when it is back that higher term deposes the healthy leader: a second,
            # needless election, every API server unready for a second (measured: 10 failed requests through
            # the ingress 9 s after a heal). With pre-vote it first asks whether it could win. (Default from
            # etcd 3.5 on; 3.4 has the flag, off.)
            "--pre-vote=true",
            *((f"--quota-backend-bytes={cluster.etcd_quota}",) if cluster.etcd_quota else ()),
        ),
        mounts=(files_mount, Mount(ETCD_DATA, f"{node_dir(hv, node)}/etcd")),
    )


def _apiserver(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, files_mount: Mount) -> ContainerSpec:
    """Stacked etcd, as kubeadm sets it up: each API server talks to its node's own member only. Its etcd
    client spreads calls over every endpoint it is given, and a call that reaches a
    member while that member's TLS listener shuts down fails unretried; with one endpoint, the plan stops
    the API server before its member changes (gitops.plan.diff)."""
    ip = hv.ip_address
    return ContainerSpec(
        name=APISERVER,
        image=cluster.image(APISERVER),
        command=("kube-apiserver",),
        args=(
            f"--advertise-address={ip}",
            f"--bind-address={ip}",
            f"--secure-port={record.ports['apiserver']}",
            f"--etcd-servers={etcd_member(hv, node, record).client_url}",
            f"--etcd-cafile={FILES}/etcd-ca.crt",
            f"--etcd-certfile={FILES}/apiserver-etcd-client.crt",
            f"--etcd-keyfile={FILES}/apiserver-etcd-client.key",
            f"--client-ca-file={FILES}/ca.crt",
            f"--tls-cert-file={FILES}/apiserver.crt",
            f"--tls-private-key-file={FILES}/apiserver.key",
            f"--kubelet-client-certificate={FILES}/apiserver-kubelet-client.crt",
            f"--kubelet-client-key={FILES}/apiserver-kubelet-client.key",
            # kubelets serve with certificates gitops signs (gitops.plan.csrs): verified, reached by node IP
            f"--kubelet-certificate-authority={FILES}/ca.crt",
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
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
            # stopped, it first only fails /readyz for this long while serving as usual: the ingress
            # (checking every second) takes it out before it closes its port (SHUTDOWN_DELAY)
            f"--shutdown-delay-duration={SHUTDOWN_DELAY}s",
            *(cluster.oidc.flags(f"{FILES}/{OIDC_CA}") if cluster.oidc is not None else ()),
            *(f"--{name}={value}" for name, value in cluster.api_server_args),
        ),
        mounts=(files_mount,),
    )


def _leader_elected(name: str, image: str, hv: Hypervisor, port: int, kubeconfig: str, cluster: Cluster,
                    files_mount: Mount, before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> ContainerSpec:
    """A component that serves on its own port, talks to the local API server and elects a leader
    (controller-manager, scheduler): the flags they share, with their own `before` and `after`
    --leader-elect (the order is part of the spec hash, so it stays as it always was)."""
    return ContainerSpec(
        name=name,
        image=image,
        command=(name,),
        args=(
            f"--bind-address={hv.ip_address}",
            f"--secure-port={port}",
            f"--kubeconfig={FILES}/{kubeconfig}",
            f"--authentication-kubeconfig={FILES}/{kubeconfig}",
            f"--authorization-kubeconfig={FILES}/{kubeconfig}",
            *before,
            "--leader-elect=true",
            *after,
        ),
        mounts=(files_mount,),
    )


def _controller_manager(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord,
                        files_mount: Mount) -> ContainerSpec:
    return _leader_elected(
        CONTROLLER_MANAGER, cluster.image(CONTROLLER_MANAGER), hv, record.ports["controller-manager"],
        "controller-manager.kubeconfig", cluster, files_mount, before=(
            f"--client-ca-file={FILES}/ca.crt",
            f"--requestheader-client-ca-file={FILES}/front-proxy-ca.crt",
            f"--root-ca-file={FILES}/ca.crt",
            f"--service-account-private-key-file={FILES}/sa.key",
            f"--service-cluster-ip-range={cluster.service_cidr}",
            f"--cluster-cidr={cluster.pod_cidr}",
        ), after=("--use-service-account-credentials=true", "--controllers=*,bootstrapsigner,tokencleaner"))


def _scheduler(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord, files_mount: Mount) -> ContainerSpec:
    return _leader_elected(SCHEDULER, cluster.image(SCHEDULER), hv, record.ports["scheduler"],
                           "scheduler.kubeconfig", cluster, files_mount)


#: how each controlplane component's container is built (`ROLES` says which run, in start order)
CONTROLPLANE_CONTAINERS = {ETCD: _etcd, APISERVER: _apiserver, CONTROLLER_MANAGER: _controller_manager,
                           SCHEDULER: _scheduler}


def _service_account_bundle(cluster: str, trust: ClusterTrust,
                            peers: dict[str, tuple[Hypervisor, NodeRecord]]) -> FileSpec:
    """sa-pub.pem: every key recorded for the cluster and the retired ones; known after apply while a
    controlplane peer has no key recorded yet (the plan generates it)."""
    controlplane = sorted(name for name, (p_hv, p_rec) in peers.items()
                          if not p_hv.public and "apiserver" in p_rec.ports)
    missing = tuple(n for n in controlplane if n not in trust.keyed)
    if missing:
        return FileSpec("sa-pub.pem", "", ServiceAccountBundle(cluster, missing))
    return FileSpec("sa-pub.pem", trust.service_account_keys)  # one per cluster


def _ingress(node: Node, cluster: Cluster, hv: Hypervisor, record: NodeRecord,
             peers: dict[str, tuple[Hypervisor, NodeRecord]], address: VirtualIP | None = None):
    """haproxy on the node's own address; with a virtual IP also on that address (bound before it is here:
    `transparent`), with a health page for keepalived, which runs beside it and holds the address while
    this node is the VRRP master."""
    backends = sorted(
        (name, host_port(p_hv.ip_address, p_rec.ports['apiserver']))
        for name, (p_hv, p_rec) in peers.items()
        if not p_hv.public and "apiserver" in p_rec.ports
    )
    base = node_dir(hv, node)
    check_port = record.ports.get(INGRESS_CHECK_PORT) if address is not None else None
    config = haproxy_config(hv.ip_address, record.ports["apiserver"], backends, ready_check_ca=f"{FILES}/ca.crt",
                            virtual=(address.address, address.port) if check_port else None,
                            health_port=check_port)
    files = [FileSpec("haproxy.cfg", config)]
    containers = [haproxy_container(cluster.image(HAPROXY), base, transparent=bool(check_port))]
    if address is not None and check_port:
        peer_ips = sorted(p_hv.ip_address for name, (p_hv, _) in peers.items()
                          if name != node.name and p_hv.public and p_hv.ip_address != hv.ip_address)
        files.append(FileSpec("keepalived.conf", keepalived_config(node.name, cluster.name, hv, peer_ips, address,
                                                                  check_port)))
        containers.append(keepalived_container(cluster.image(KEEPALIVED), base))
    return tuple(files), [], (), tuple(containers)


#: VRRP advertisements every VRRP_ADVERT s: a backup takes the address over 3 adverts (plus a skew under one)
#: after the master's last one, about 0.8 s
VRRP_ADVERT = 0.25


def keepalived_config(node: str, cluster: str, hv: Hypervisor, peers: list[str], address: VirtualIP,
                      check_port: int) -> str:
    """keepalived's VRRP instance for the cluster's virtual IP on this ingress node: unicast to the other
    ingress nodes' hypervisors, every node a backup of equal priority that does not take the address back
    (nopreempt: a node that returns leaves it where it is), out while haproxy's health page fails."""
    family = "/128" if ":" in address.address else "/32"
    lines = [
        "global_defs {",
        f"  router_id {node}",
        "  vrrp_version 3",
        "  script_user root",
        "  enable_script_security",
        "  vrrp_garp_master_refresh 10",
        "}",
        "vrrp_script haproxy {",
        f'  script "/usr/bin/wget -q -T 1 -O /dev/null http://{url_host(hv.ip_address)}:{check_port}/healthz"',
        "  interval 1",
        "  timeout 2",
        "  fall 2",
        "  rise 2",
        "}",
        f"vrrp_instance {cluster} {{",
        "  state BACKUP",
        "  nopreempt",
        f"  interface {hv.interface}",
        f"  virtual_router_id {address.vrrp_id}",
        "  priority 100",
        f"  advert_int {VRRP_ADVERT}",
        f"  unicast_src_ip {hv.ip_address}",
        "  unicast_peer {",
        *(f"    {peer}" for peer in peers),
        "  }",
        "  virtual_ipaddress {",
        f"    {address.address}{family} dev {hv.interface}",
        "  }",
        "  track_script {",
        "    haproxy",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def keepalived_container(image: str, base: str) -> ContainerSpec:
    """keepalived in the foreground (VRRP only) on the `keepalived.conf` the files agent wrote; it adds and
    removes the virtual IP on the hypervisor's interface (host network) and speaks VRRP: NET_ADMIN, NET_RAW."""
    return ContainerSpec(
        name=KEEPALIVED,
        image=image,
        command=("keepalived",),
        args=("--dont-fork", "--log-console", "--log-detail", "--vrrp", "--use-file", f"{FILES}/keepalived.conf",
              "--pid", "/tmp/keepalived.pid", "--vrrp_pid", "/tmp/keepalived-vrrp.pid"),
        mounts=(files_dir_mount(base),),
        capabilities=("NET_ADMIN", "NET_RAW", "NET_BROADCAST"),
    )


def haproxy_container(image: str, base: str, transparent: bool = False) -> ContainerSpec:
    """haproxy in the foreground on the `haproxy.cfg` the files agent wrote under `base`; `transparent`: it
    binds an address this machine may not hold yet (a virtual IP: NET_ADMIN)."""
    return ContainerSpec(
        name=HAPROXY,
        image=image,
        command=("haproxy",),
        args=("-W", "-db", "-f", f"{FILES}/haproxy.cfg"),
        mounts=(files_dir_mount(base),),
        capabilities=("NET_ADMIN",) if transparent else (),
    )


def haproxy_config(ip: str, port: int, backends: list[tuple[str, str]], ready_check_ca: str | None = None,
                   virtual: tuple[str, int] | None = None, health_port: int | None = None) -> str:
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
        f"  bind {url_host(ip)}:{port}",
        *([f"  bind {url_host(virtual[0])}:{virtual[1]} transparent"] if virtual else []),
        "  default_backend apiservers",
        "backend apiservers",
        "  balance roundrobin",
    ]
    if ready_check_ca:
        lines += ["  option httpchk", "  http-check send meth GET uri /readyz", "  http-check expect status 200"]
        check = (f"check check-ssl verify required ca-file {ready_check_ca} inter {READY_CHECK_INTER}s fall 1 "
                 f"rise {READY_CHECK_RISE}")
    else:
        lines += ["  option tcp-check"]
        check = "check inter 2s fall 2 rise 1"
    lines += [f"  server {name} {address} {check}" for name, address in backends]
    if health_port:  # keepalived's check: 200 while haproxy runs and has an API server to send to
        lines += ["frontend health", "  mode http", f"  bind {url_host(ip)}:{health_port}", "  timeout client 5s",
                  "  monitor-uri /healthz", "  monitor fail if { nbsrv(apiservers) lt 1 }"]
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
