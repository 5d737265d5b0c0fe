"""SIP support services as pods on public hypervisors (pure): the tenant API load balancer and the jump host.

Each service is a pseudo-node `<sipcluster>-lb` / `<sipcluster>-jump` that the
placement stage puts on a public hypervisor like an ingress node, so the plan,
apply, drift healing and pruning machinery of control planes serves them as is.
* load balancer: haproxy, TCP, `spec.services.loadBalancer.port` on the
  hypervisor's IP, over the `targetPort` of every active ControlPlane host, whose
  addresses come from their networkData;
* jump host: Debian's sshd on an allocated port, keys only, the declared
  `sshAuthorizedKeys` (see `gitops.compile.jumphost`);
* OIDC auth: no OIDC server is installable on these machines, so `auth` is
  recorded in status but no pod is run for it.
"""
from __future__ import annotations

from collections.abc import Iterable

from gitops.compile.components import assemble_pod, haproxy_config, haproxy_container, node_dir
from gitops.compile.desired import DesiredPod, FileSpec
from gitops.compile.jumphost import jumphost_container, jumphost_files
from gitops.cri.types import ContainerSpec
from gitops.hostport import host_port
from gitops.model.components import COMPONENTS, DEFAULT_AGENT_IMAGE, HAPROXY, JUMPHOST, SIP_JUMPHOST, SIP_LOADBALANCER
from gitops.model.resources import BareMetalHost, Hypervisor, Node, RepoModel, SIPCluster
from gitops.model.networkdata import NetworkDataError, host_ipv4
from gitops.sip.selection import CLUSTER_LABEL, NODE_TYPE_LABEL, STANDBY_LABEL
from gitops.state.records import NodeRecord



def service_cluster(sip: str) -> str:
    return f"sip-{sip}"


def service_nodes(model: RepoModel) -> dict[str, Node]:
    """The pseudo-nodes of every SIPCluster's services, by name."""
    out = {}
    for name, sip in sorted(model.sip_clusters.items()):
        if sip.load_balancer is not None:
            out[f"{name}-lb"] = Node(f"{name}-lb", service_cluster(name), SIP_LOADBALANCER)
        if sip.jump_host is not None:
            out[f"{name}-jump"] = Node(f"{name}-jump", service_cluster(name), SIP_JUMPHOST)
    return out


def pinned_ports(model: RepoModel) -> dict[str, tuple[str, int]]:
    return {f"{name}-lb": ("loadbalancer", sip.load_balancer.port)
            for name, sip in model.sip_clusters.items() if sip.load_balancer is not None}


def control_plane_backends(sip: str, hosts: Iterable[BareMetalHost], model: RepoModel,
                           notes: list[str]) -> list[tuple[str, str]]:
    """(host name, IP) of the active ControlPlane hosts labeled for `sip`, sorted."""
    out = []
    for host in sorted(hosts, key=lambda h: (h.namespace, h.name)):
        labels = host.labels
        if labels.get(CLUSTER_LABEL) != sip or labels.get(NODE_TYPE_LABEL) != "ControlPlane" \
                or labels.get(STANDBY_LABEL) == "true":
            continue
        try:
            out.append((host.name, host_ipv4(host, model.secrets.values())))
        except NetworkDataError as err:
            notes.append(f"SIPCluster {sip}: {err}; the host is left out of the load balancer")
    return out


def service_pods(model: RepoModel, placed: dict[str, tuple[Hypervisor, NodeRecord]],
                 hosts: Iterable[BareMetalHost], notes: list[str]) -> dict[str, DesiredPod]:
    hosts = list(hosts)
    pods = {}
    for node in service_nodes(model).values():
        if node.name not in placed:
            continue
        hv, record = placed[node.name]
        sip_name = node.cluster.removeprefix("sip-")
        sip = model.sip_clusters[sip_name]
        if node.role == SIP_LOADBALANCER:
            pods[node.name] = _load_balancer(node, sip, hv, record, control_plane_backends(sip_name, hosts, model,
                                                                                         notes))
        else:
            pods[node.name] = _jump_host(node, sip, hv, record)
    return pods


def _pod(node: Node, hv: Hypervisor, files: tuple[FileSpec, ...], component: ContainerSpec) -> DesiredPod:
    return assemble_pod(node, hv, DEFAULT_AGENT_IMAGE, files, [], (), (component,))


def _load_balancer(node: Node, sip: SIPCluster, hv: Hypervisor, record: NodeRecord,
                   backends: list[tuple[str, str]]) -> DesiredPod:
    assert sip.load_balancer is not None
    servers = [(name, host_port(ip, sip.load_balancer.target_port)) for name, ip in backends]
    files = (FileSpec("haproxy.cfg", haproxy_config(hv.ip_address, record.ports["loadbalancer"], servers)),)
    return _pod(node, hv, files, haproxy_container(COMPONENTS[HAPROXY].default_image, node_dir(hv, node)))


def _jump_host(node: Node, sip: SIPCluster, hv: Hypervisor, record: NodeRecord) -> DesiredPod:
    assert sip.jump_host is not None
    keys = tuple(sip.jump_host.authorized_keys)
    base = node_dir(hv, node)
    files = tuple(FileSpec(name, content) for name, content in sorted(jumphost_files(keys).items()))
    sshd = jumphost_container(JUMPHOST, hv.ip_address, record.ports["ssh"], keys, f"{base}/files",
                              state_dir_host=f"{base}/host-keys")
    return _pod(node, hv, files, sshd)
