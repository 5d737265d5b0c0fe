"""SIP support services as pods on public hypervisors (pure): the tenant API load balancer and the jump host.

Each service is a pseudo-node `<sipcluster>-lb` / `<sipcluster>-jump` that the
placement stage puts on a public hypervisor like an ingress node, so the plan,
apply, drift healing and pruning machinery of control planes serves them as is.
* load balancer: haproxy, TCP, `spec.services.loadBalancer.port` on the
  hypervisor's IP, over the `targetPort` of every active ControlPlane host, whose
  addresses come from their networkData;
* jump host: Debian's sshd on an allocated port, keys only, the declared
  `sshAuthorizedKeys` (see `gitops.compile.jumphost`);
* OIDC provider (`<sipcluster>-auth`, once `auth` declares users or clients):
  `gitops oidc serve` on 127.0.0.1 and the allocated port, behind haproxy
  terminating TLS on the hypervisor's IP and that port, with a certificate signed
  by the services' CA (`SERVICE_AUTHORITY`, kept in the recorded state of the
  pseudo-cluster `sip-<name>`). Its signing keys are born in a directory of the
  hypervisor; its configuration (password hashes, SHA-256 of client secrets) is a
  file the agent writes. Clusters that trust it by name get its URL and CA
  (`resolve_issuers`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from gitops.compile.authorities import SERVICE_AUTHORITY
from gitops.compile.components import assemble_pod, files_dir_mount, haproxy_config, haproxy_container, node_dir
from gitops.compile.desired import CertificateSpec, DesiredPod, FileSpec
from gitops.compile.jumphost import jumphost_container, jumphost_files
from gitops.cri.types import ContainerSpec, Mount
from gitops.hostport import host_port, url_host
from gitops.model.components import (
    COMPONENTS,
    DEFAULT_AGENT_IMAGE,
    HAPROXY,
    JUMPHOST,
    OIDC,
    SIP_AUTH,
    SIP_JUMPHOST,
    SIP_LOADBALANCER,
)
from gitops.model.resources import AuthService, BareMetalHost, Hypervisor, Node, RepoModel, SIPCluster
from gitops.model.semantics import is_ip
from gitops.pods import FILES
from gitops.model.networkdata import NetworkDataError, host_ipv4
from gitops.sip.selection import CLUSTER_LABEL, NODE_TYPE_LABEL, STANDBY_LABEL
from gitops.state.records import NodeRecord, State

#: the provider's files and directories: its configuration (beside the others in /etc/gitops), its serving
#: certificate, and where its signing keys are born and kept (a directory of the hypervisor)
PROVIDER_CONFIG = "oidc.json"
SERVING_CERT = "oidc-serving"
KEYS_DIR = "/var/lib/gitops-oidc"
#: the uid the provider drops to once its key directory is its own (the controller image's user)
PROVIDER_UID = 10001
#: POSTs (password checks) one client address may make per minute before the front answers 429
LOGINS_PER_MINUTE = 30


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
        if runs_provider(sip):
            out[auth_node(name)] = Node(auth_node(name), service_cluster(name), SIP_AUTH)
    return out


def auth_node(sip: str) -> str:
    return f"{sip}-auth"


def runs_provider(sip: SIPCluster) -> bool:
    """Whether `sip` runs an OIDC provider: its services.auth declares users or clients."""
    return sip.auth is not None and bool(sip.auth.users or sip.auth.clients)


def issuer_url(auth: AuthService, hv: Hypervisor, port: int) -> str:
    """The provider's issuer: the declared oidcIssuerURL, else its hypervisor's address and port."""
    return (auth.oidc_issuer_url or f"https://{host_port(hv.ip_address, port)}").rstrip("/")


def issuers(model: RepoModel, state: State) -> dict[str, str]:
    """SIPCluster name -> its provider's issuer URL, for those placed."""
    out = {}
    for name, sip in sorted(model.sip_clusters.items()):
        record = state.nodes.get(auth_node(name))
        if runs_provider(sip) and record is not None and record.hypervisor in model.hypervisors \
                and "oidc" in record.ports:
            assert sip.auth is not None
            out[name] = issuer_url(sip.auth, model.hypervisors[record.hypervisor], record.ports["oidc"])
    return out


def resolve_issuers(model: RepoModel, state: State, notes: list[str]) -> RepoModel:
    """`model` with every Cluster that trusts a SIPCluster's provider by name given its issuer URL, the CA of
    that SIPCluster's services and (unless it names one) the services' client id. One whose provider is not
    placed yet trusts no issuer for now (a note says so)."""
    found = issuers(model, state)
    clusters = dict(model.clusters)
    for name, cluster in model.clusters.items():
        oidc = cluster.oidc
        if oidc is None or not oidc.sip_cluster:
            continue
        sip = model.sip_clusters.get(oidc.sip_cluster)
        record = state.clusters.get(service_cluster(oidc.sip_cluster))
        if sip is None or sip.auth is None or oidc.sip_cluster not in found or record is None:
            notes.append(f"Cluster {name}: the OIDC provider of SIPCluster {oidc.sip_cluster} is not placed yet; "
                         "its API servers trust no issuer until it is")
            clusters[name] = dataclasses.replace(cluster, oidc=None)
            continue
        clusters[name] = dataclasses.replace(cluster, oidc=dataclasses.replace(
            oidc, issuer_url=found[oidc.sip_cluster], ca_bundle=record.trust_bundle(SERVICE_AUTHORITY),
            client_id=oidc.client_id or sip.auth.client_id or ""))
    return dataclasses.replace(model, clusters=clusters)


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
        elif node.role == SIP_AUTH:
            pods[node.name] = _provider(node, sip, hv, record)
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


def _provider(node: Node, sip: SIPCluster, hv: Hypervisor, record: NodeRecord) -> DesiredPod:
    assert sip.auth is not None
    port = record.ports["oidc"]
    issuer = issuer_url(sip.auth, hv, port)
    host = urlsplit(issuer).hostname or hv.ip_address
    names = sorted({host} - {hv.ip_address})
    cert = CertificateSpec(SERVING_CERT, SERVICE_AUTHORITY, node.name,
                           dns_names=tuple(n for n in names if not is_ip(n)),
                           ip_addresses=(hv.ip_address, *(n for n in names if is_ip(n))), server=True)
    base = node_dir(hv, node)
    files = (FileSpec("haproxy.cfg", provider_front_config(hv.ip_address, port)),
             FileSpec(PROVIDER_CONFIG, provider_config(sip.auth, issuer)))
    provider = ContainerSpec(
        name=OIDC, image=COMPONENTS[OIDC].default_image, command=("gitops", "oidc", "serve"),
        args=("--config", f"{FILES}/{PROVIDER_CONFIG}", "--keys", KEYS_DIR, "--listen", f"127.0.0.1:{port}",
              "--user", str(PROVIDER_UID)),
        mounts=(files_dir_mount(base), Mount(KEYS_DIR, f"{base}/oidc-keys")),
        user=0)  # root until its key directory is its own, then PROVIDER_UID (the image may say another user)
    return assemble_pod(node, hv, DEFAULT_AGENT_IMAGE, files, [cert], (),
                        (haproxy_container(COMPONENTS[HAPROXY].default_image, base), provider))


def provider_config(auth: AuthService, issuer: str) -> str:
    """The provider's configuration (`gitops oidc serve --config`): its users with their password hashes, its
    clients with the SHA-256 of their secrets (never the secrets)."""
    return json.dumps({
        "issuer": issuer, "tokenTTL": auth.token_ttl,
        "users": [{"username": u.username, "email": u.email, "passwordHash": u.password_hash,
                   "groups": list(u.groups)} for u in auth.users],
        "clients": [{"id": c.client_id, "name": c.name, "redirectURIs": list(c.redirect_uris),
                     "grantTypes": list(c.grant_types),
                     **({"secretSHA256": hashlib.sha256(c.secret.encode()).hexdigest()} if c.secret else {})}
                    for c in auth.clients],
    }, indent=2, sort_keys=True) + "\n"


def provider_front_config(ip: str, port: int, files: str = FILES) -> str:
    """haproxy in front of the provider: TLS on `ip:port` with the serving certificate (its key beside it,
    `<name>.key`), HTTP to the provider on 127.0.0.1:`port`, with X-Forwarded-Proto, and at most
    LOGINS_PER_MINUTE POSTs (password checks) per client address and minute. `files`: where the
    certificate is (the pod's /etc/gitops)."""
    return "\n".join([
        "global",
        "  maxconn 1024",
        "  ssl-load-extra-del-ext",
        "  ssl-default-bind-options ssl-min-ver TLSv1.2",
        "defaults",
        "  mode http",
        "  timeout connect 5s",
        "  timeout client 30s",
        "  timeout server 30s",
        "  timeout http-request 10s",
        "frontend oidc",
        f"  bind {url_host(ip)}:{port} ssl crt {files}/{SERVING_CERT}.crt",
        "  stick-table type ip size 100k expire 60s store http_req_rate(60s)",
        "  http-request track-sc0 src if METH_POST",
        f"  http-request deny deny_status 429 if METH_POST {{ sc_http_req_rate(0) gt {LOGINS_PER_MINUTE} }}",
        "  http-request set-header X-Forwarded-Proto https",
        "  default_backend provider",
        "backend provider",
        "  retries 3",  # (no health check: with one server it would only hold requests back once it is up again)
        f"  server provider 127.0.0.1:{port}",
    ]) + "\n"
