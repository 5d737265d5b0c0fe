"""Rules a JSON Schema cannot express: uniqueness, references, addresses, PEM material.

Every check takes schema-valid documents and returns diagnostics; none raises.
"""
from __future__ import annotations

import ipaddress
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING

from gitops.model import versions
from gitops.model.components import CONTROLPLANE, INGRESS, ROLES
from gitops.model.diagnostics import Diagnostic
from gitops.model.documents import Document
from gitops.model.networkdata import NetworkDataError, first_ipv4, network_data_from_secret
from gitops.model.resources import API_SERVER_FLAGS, DATA_DIR_ANNOTATION, REMOVED_API_SERVER_FLAGS
from gitops.secrets import is_armored

if TYPE_CHECKING:
    from cryptography import x509

HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$")

Check = Callable[[list[Document], list[Document]], Iterable[Diagnostic]]


def check_all(valid: list[Document], everything: list[Document]) -> list[Diagnostic]:
    """Run every semantic rule.

    `valid` are the documents that passed their schema (rules may rely on
    their shape); `everything` also holds the rest, so that a reference to a
    document with a schema error is not reported a second time as missing.
    """
    out: list[Diagnostic] = []
    groups = {id(valid): (valid, _by_kind(valid)), id(everything): (everything, _by_kind(everything))}
    token = _GROUPS.set(groups)
    try:
        for check in CHECKS:
            out.extend(check(valid, everything))
    finally:
        _GROUPS.reset(token)
    return out


#: the documents of `check_all`'s lists grouped by kind once (its rules ask for a kind many times)
_GROUPS: ContextVar[dict[int, tuple[list[Document], dict[str, list[Document]]]]] = ContextVar("groups", default={})


def _by_kind(docs: list[Document]) -> dict[str, list[Document]]:
    out: dict[str, list[Document]] = defaultdict(list)
    for doc in docs:
        out[doc.kind].append(doc)
    return out


def _of_kind(docs: list[Document], kind: str) -> list[Document]:
    found = _GROUPS.get().get(id(docs))
    if found is not None and found[0] is docs:
        return list(found[1].get(kind, ()))
    return [d for d in docs if d.kind == kind]


def unique_names(valid: list[Document], everything: list[Document]) -> Iterable[Diagnostic]:
    seen: dict[tuple[str, str, str], Document] = {}
    for doc in everything:
        if not doc.kind or not doc.name:
            continue
        key = (doc.kind, str(doc.get(("metadata", "namespace"), "")), doc.name)
        first = seen.setdefault(key, doc)
        if first is not doc:
            yield doc.error(("metadata", "name"), f"duplicate {doc.kind} {doc.name!r} "
                            f"(first defined at {first.file}:{first.line_of(('metadata', 'name'))})")


def node_references(valid: list[Document], everything: list[Document]) -> Iterable[Diagnostic]:
    clusters = {d.name for d in _of_kind(everything, "Cluster")}
    hypervisors = {d.name: d for d in _of_kind(everything, "Hypervisor")}
    for node in _of_kind(valid, "Node"):
        cluster = node.spec.get("cluster")
        if cluster not in clusters:
            yield node.error(("spec", "cluster"), f"Cluster {cluster!r} does not exist" + _known(clusters))
        pinned = node.spec.get("hypervisor")
        if pinned is None:
            continue
        hv = hypervisors.get(pinned)
        if hv is None:
            yield node.error(("spec", "hypervisor"), f"Hypervisor {pinned!r} does not exist" + _known(hypervisors))
            continue
        public = hv.spec.get("public", False) is True
        role = ROLES.get(node.spec.get("role"))
        wants_public = role is not None and role.public
        if public != wants_public:
            need = "public" if wants_public else "private"
            yield node.error(("spec", "hypervisor"), f"role {node.spec.get('role')} runs on {need} hypervisors, "
                             f"but Hypervisor {pinned!r} is {'public' if public else 'private'}")


def _known(names: Iterable[str]) -> str:
    names = sorted(names)
    if not names:
        return " (none defined)"
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f" (defined: {shown})"


def hypervisor_addresses(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """IPs parse, port ranges are ordered and do not overlap on one IP."""
    by_ip: dict[str, list[tuple[int, int, Document]]] = defaultdict(list)
    for hv in _of_kind(docs, "Hypervisor"):
        raw_ip = hv.spec.get("ipAddress", "")
        try:
            parsed = ipaddress.ip_address(raw_ip)
            ip = str(parsed)
        except ValueError:
            yield hv.error(("spec", "ipAddress"), f"{raw_ip!r} is not an IP address")
            ip = None
        else:
            if parsed.version == 6:  # compiled into host:port and https://host:port without brackets
                yield hv.error(("spec", "ipAddress"), f"{raw_ip!r} is an IPv6 address; only IPv4 is supported")
                ip = None
        low, high = hv.get(("spec", "portRange", "low")), hv.get(("spec", "portRange", "high"))
        if low > high:
            yield hv.error(("spec", "portRange"), f"low ({low}) is greater than high ({high})")
        elif ip is not None:
            by_ip[ip].append((low, high, hv))
    for ip, ranges in by_ip.items():
        ranges.sort(key=lambda r: (r[0], r[1], r[2].name))
        for (lo1, hi1, first), (lo2, hi2, second) in zip(ranges, ranges[1:]):
            if lo2 <= hi1:
                yield second.error(("spec", "portRange"), f"ports {lo2}-{hi2} on {ip} overlap Hypervisor "
                                   f"{first.name!r} ({lo1}-{hi1}, {first.file}:{first.line_of(('spec', 'portRange'))})")


def hypervisor_tls(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """Remote endpoints: CA and client certificate parse, and the key matches the certificate."""
    for hv in _of_kind(docs, "Hypervisor"):
        remote = hv.spec.get("remoteCRIEndpoint")
        if not isinstance(remote, dict):
            continue
        base = ("spec", "remoteCRIEndpoint")
        ca = _certificate(hv, base + ("caCertificate",))
        if isinstance(ca, Diagnostic):
            yield ca
        elif not _is_ca(ca):
            yield hv.error(base + ("caCertificate",), "certificate is not a CA (basicConstraints ca=false)")
        cert = _certificate(hv, base + ("clientCertificate", "certificate"))
        if isinstance(cert, Diagnostic):
            yield cert
        key_path = base + ("clientCertificate", "privateKey")
        if is_armored(hv.get(key_path)):
            continue  # not decrypted (no identity, or an error already reported): nothing to compare
        from cryptography.hazmat.primitives import serialization  # (only remote hypervisors need it)

        from gitops.pki import key_matches_cert

        try:
            key = serialization.load_pem_private_key(hv.get(key_path).encode(), password=None)
        except (ValueError, TypeError):
            yield hv.error(key_path, "not a PEM private key (unencrypted PKCS#8, PKCS#1 or SEC1)")
            continue
        if not isinstance(cert, Diagnostic) and not key_matches_cert(key, cert):
            yield hv.error(key_path, "private key does not match clientCertificate.certificate")


#: directories of the host's system: a data dir may not be one, nor lie under a pseudo-filesystem
SYSTEM_DIRS = frozenset({"/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
                         "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
                         "/var/lib", "/var/run", "/usr/local"})
PSEUDO_FS = ("/proc", "/sys", "/dev")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def hypervisor_data_dirs(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """The data-dir annotation is an absolute, normalized path of its own: not `/`, not a system
    directory, not under /proc, /sys or /dev, no control characters (node directories and etcd
    data are created and removed under it on the hypervisor)."""
    path = ("metadata", "annotations", DATA_DIR_ANNOTATION)
    for hv in _of_kind(docs, "Hypervisor"):
        raw = hv.get(path)
        if raw is None:
            continue
        normal = "/" + os.path.normpath(raw).lstrip("/") if raw.startswith("/") else raw
        if _CONTROL.search(raw):
            yield hv.error(path, f"{raw!r} holds a control character (a newline?)")
        elif not raw.startswith("/"):
            yield hv.error(path, f"{raw!r} is not an absolute path (e.g. /var/lib/gitops)")
        elif normal == "/":
            yield hv.error(path, "'/' is not allowed: use a directory of its own, e.g. /var/lib/gitops")
        elif normal != raw:
            yield hv.error(path, f"{raw!r} is not a normalized path (write {normal!r})")
        elif raw in SYSTEM_DIRS or any(raw.startswith(fs + "/") for fs in PSEUDO_FS):
            yield hv.error(path, f"{raw!r} is a system directory; use a directory of its own, e.g. /var/lib/gitops")


def _certificate(doc: Document, path: tuple[str, ...]) -> x509.Certificate | Diagnostic:
    from cryptography import x509  # here: only a remote hypervisor's certificates need it

    text = doc.get(path)
    try:
        return x509.load_pem_x509_certificate(text.encode())
    except ValueError:
        return doc.error(path, "not a PEM certificate (expected one -----BEGIN CERTIFICATE----- block)")


def _is_ca(cert: x509.Certificate) -> bool:
    from cryptography import x509

    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


#: etcd members of a cluster: more make every write slower and a quorum no safer
MAX_CONTROLPLANE_NODES = 7
#: haproxy fronts of a cluster
MAX_INGRESS_NODES = 7


def node_counts(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """A cluster has at most `MAX_CONTROLPLANE_NODES` controlplane Nodes (etcd members) and
    `MAX_INGRESS_NODES` controlplane-ingress ones; each one past the bound is an error."""
    seen: dict[tuple[str, str], int] = defaultdict(int)
    bounds = {CONTROLPLANE: MAX_CONTROLPLANE_NODES, INGRESS: MAX_INGRESS_NODES}
    for node in _of_kind(docs, "Node"):
        cluster, role = node.spec.get("cluster"), node.spec.get("role")
        if role not in bounds:
            continue
        seen[cluster, role] += 1
        if seen[cluster, role] > bounds[role]:
            yield node.error(("spec", "role"), f"Cluster {cluster!r} has more than {bounds[role]} {role} Nodes "
                             f"(at most {bounds[role]})")


def ingress_spread(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """A cluster's controlplane-ingress Nodes sit on distinct public Hypervisors (a virtual IP moves between
    them): with two or more, the repo must hold as many public Hypervisors open to new nodes (not cordoned,
    drained or lost), and no two of them may be pinned to the same Hypervisor."""
    open_public = sorted(hv.name for hv in _of_kind(docs, "Hypervisor")
                         if hv.spec.get("public") and not any(hv.spec.get(k) for k in ("cordoned", "drain", "lost")))
    by_cluster: dict[str, list[Document]] = defaultdict(list)
    for node in _of_kind(docs, "Node"):
        if node.spec.get("role") == INGRESS:
            by_cluster[node.spec.get("cluster")].append(node)
    for cluster, nodes in sorted(by_cluster.items(), key=lambda kv: str(kv[0])):
        if len(nodes) < 2:
            continue
        nodes = sorted(nodes, key=lambda d: d.name)
        for extra in nodes[len(open_public):]:
            yield extra.error(("spec", "role"), f"Cluster {cluster!r} has {len(nodes)} {INGRESS} Nodes, and they sit "
                              f"on distinct public Hypervisors, but the repo has {len(open_public)} open to new "
                              f"nodes{_known(open_public)}: add a public Hypervisor or remove an ingress Node")
        pinned: dict[str, str] = {}
        for node in nodes:
            hv = node.spec.get("hypervisor")
            if hv and hv in pinned:
                yield node.error(("spec", "hypervisor"), f"Node {pinned[hv]!r} of Cluster {cluster!r} is an ingress "
                                 f"Node pinned to Hypervisor {hv!r} too: a cluster's ingress Nodes sit on distinct "
                                 "public Hypervisors")
            elif hv:
                pinned[hv] = node.name


def recovery_survivors(docs: list[Document], everything: list[Document]) -> Iterable[Diagnostic]:
    """spec.recovery.forceNewClusterFrom names a controlplane Node of the same cluster."""
    nodes = {d.name: d for d in _of_kind(everything, "Node")}
    for cluster in _of_kind(docs, "Cluster"):
        name = cluster.get(("spec", "recovery", "forceNewClusterFrom"))
        if name is None:
            continue
        node = nodes.get(name)
        if node is None or node.spec.get("cluster") != cluster.name or node.spec.get("role") != CONTROLPLANE:
            yield cluster.error(("spec", "recovery", "forceNewClusterFrom"),
                                f"no controlplane Node {name!r} of Cluster {cluster.name!r}")


def kubernetes_versions(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    for doc in _of_kind(docs, "Cluster"):
        why = versions.problem(str(doc.spec.get("kubernetesVersion", "")))
        if why:
            yield doc.error(("spec", "kubernetesVersion"), why)


def cluster_networks(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """CIDRs parse (no host bits), service and pod networks are disjoint, endpoint hosts are names or IPs."""
    for cluster in _of_kind(docs, "Cluster"):
        nets = {}
        for key in ("serviceCIDR", "podCIDR", "nodeCIDR"):
            nets[key] = _network(cluster, ("spec", key))
        nets["vpn.cidr"] = _network(cluster, ("spec", "vpn", "cidr"))
        for key, net in nets.items():
            if isinstance(net, Diagnostic):
                yield net
        svc, pod = nets["serviceCIDR"], nets["podCIDR"]
        if isinstance(svc, ipaddress._BaseNetwork) and isinstance(pod, ipaddress._BaseNetwork):
            if svc.version == pod.version and svc.overlaps(pod):
                yield cluster.error(("spec", "podCIDR"), f"pod network {pod} overlaps service network {svc}")
        for i, host in enumerate(cluster.get(("spec", "apiServer", "endpointHosts"), [])):
            if not (HOSTNAME.match(host) or is_ip(host)):
                yield cluster.error(("spec", "apiServer", "endpointHosts", i), f"{host!r} is neither a DNS name nor an IP")
        validity = cluster.get(("spec", "certificates", "validityDays"), 365)
        renew = cluster.get(("spec", "certificates", "renewBeforeDays"), 30)
        if renew >= validity:
            yield cluster.error(("spec", "certificates", "renewBeforeDays"),
                                f"renewal window ({renew} days) must be shorter than validity ({validity} days)")


def api_server_args(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """spec.apiServer.extraArgs may not set a flag gitops sets itself (its value would be ambiguous), nor one
    Kubernetes removed (the API server would refuse it and never start)."""
    for cluster in _of_kind(docs, "Cluster"):
        for name in sorted(cluster.get(("spec", "apiServer", "extraArgs"), {})):
            if name in API_SERVER_FLAGS:
                yield cluster.error(("spec", "apiServer", "extraArgs", name),
                                    f"--{name} is set by gitops itself and cannot be overridden")
            elif name in REMOVED_API_SERVER_FLAGS:
                yield cluster.error(("spec", "apiServer", "extraArgs", name),
                                    f"--{name} was removed from kube-apiserver in Kubernetes "
                                    f"{REMOVED_API_SERVER_FLAGS[name]}: the API server would not start")


def api_server_oidc(docs: list[Document], everything: list[Document]) -> Iterable[Diagnostic]:
    """spec.apiServer.oidc: a caBundle is one or more PEM certificates, nothing else; a sipCluster names a
    SIPCluster whose services.auth runs a provider, and the client (clientID, else that provider's) is one of
    its clients."""
    sips = {d.name: d for d in _of_kind(everything, "SIPCluster")}
    for cluster in _of_kind(docs, "Cluster"):
        base = ("spec", "apiServer", "oidc")
        if cluster.get(base) is None:
            continue
        yield from _system_prefixes(cluster, base)
        name = cluster.get(base + ("sipCluster",))
        if name is not None:
            yield from _sip_issuer(cluster, base, sips.get(name))
        path = base + ("caBundle",)
        bundle = cluster.get(path)
        if bundle is None:
            continue
        try:
            certs = _load_pem_certificates(bundle)
        except ValueError:
            certs = []
        if not certs:
            yield cluster.error(path, "not PEM certificates (expected -----BEGIN CERTIFICATE----- blocks)")


SYSTEM = "system:"


def spells_system(prefix: str, name: str = "") -> bool:
    """Whether `prefix` put before `name` makes a name of Kubernetes' own (system:masters is every right,
    system:node:X a node's), in any case: or, with no name, whether some name after `prefix` could."""
    whole = (prefix + name).lower()
    return whole.startswith(SYSTEM) or (not name and bool(prefix) and SYSTEM.startswith(whole))


def _system_prefixes(cluster: Document, base: tuple[str, ...]) -> Iterable[Diagnostic]:
    """usernamePrefix and groupsPrefix: neither is, nor begins, a system: name (the API server puts them before
    every name the issuer sends: a prefix system: turns a group masters into system:masters, sys one named
    tem:masters). With this and sip_auth's rule on the names a provider declares, no prefix and name together
    spell one."""
    for key in ("usernamePrefix", "groupsPrefix"):
        prefix = cluster.get(base + (key,))
        if prefix is not None and prefix != "-" and spells_system(prefix):
            yield cluster.error(base + (key,), f"{prefix!r}: put before a name it spells, or can spell, a system: "
                                "name (Kubernetes' own users and groups: system:masters is every right); take "
                                "a prefix of your own such as oidc:")


def _load_pem_certificates(text: str) -> list:
    from cryptography import x509  # here: only a cluster trusting an issuer's own CA needs it

    return x509.load_pem_x509_certificates(text.encode())


def _sip_issuer(cluster: Document, base: tuple[str, ...], sip: Document | None) -> Iterable[Diagnostic]:
    name = cluster.get(base + ("sipCluster",))
    auth = sip.get(("spec", "services", "auth")) if sip is not None else None
    if sip is None:
        yield cluster.error(base + ("sipCluster",), f"no SIPCluster {name!r} in the repo")
        return
    if not auth or not (auth.get("users") or auth.get("clients")):
        yield cluster.error(base + ("sipCluster",), f"SIPCluster {name} runs no OIDC provider: declare "
                            "users or clients in its spec.services.auth")
        return
    client = cluster.get(base + ("clientID",)) or auth.get("clientID")
    clients = [c["id"] for c in auth.get("clients", [])]
    if not client:
        yield cluster.error(base, f"no clientID, and SIPCluster {name}'s services.auth names none")
    elif client not in clients:
        yield cluster.error(base + (("clientID",) if cluster.get(base + ("clientID",)) else ("sipCluster",)),
                            f"client {client!r} is not a client of SIPCluster {name}'s provider "
                            f"(its clients: {', '.join(clients) or 'none'})")


def _network(doc: Document, path: tuple[str, ...]):
    raw = doc.get(path)
    if raw is None:
        return None
    try:
        return ipaddress.ip_network(raw, strict=True)
    except ValueError as err:
        return doc.error(path, f"{raw!r} is not a CIDR: {err}")


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def sip_selectors(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """Selector operators have the values they need; port ranges are ordered."""
    for sip in _of_kind(docs, "SIPCluster"):
        for role, spec in sorted(sip.get(("spec", "nodes"), {}).items()):
            for i, expr in enumerate(spec.get("labelSelector", {}).get("matchExpressions", [])):
                path = ("spec", "nodes", role, "labelSelector", "matchExpressions", i)
                values = expr.get("values", [])
                if expr["operator"] in ("In", "NotIn") and not values:
                    yield sip.error(path, f"operator {expr['operator']} needs a non-empty 'values'")
                if expr["operator"] in ("Exists", "DoesNotExist") and values:
                    yield sip.error(path + ("values",), f"operator {expr['operator']} takes no 'values'")
        ports = sip.get(("spec", "services", "loadBalancer", "nodePortRange"))
        if ports and ports["start"] > ports["end"]:
            yield sip.error(("spec", "services", "loadBalancer", "nodePortRange"),
                            f"start ({ports['start']}) is greater than end ({ports['end']})")


def sip_auth(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """services.auth: users with a password hash (never a password), each name, email and client id once, and
    a redirect URI for each client of the code flow."""
    for sip in _of_kind(docs, "SIPCluster"):
        base = ("spec", "services", "auth")
        users, clients = sip.get(base + ("users",), []), sip.get(base + ("clients",), [])
        if not users and not clients:
            continue
        from gitops.oidc.passwords import is_hash  # here: only a SIPCluster with users needs it

        seen: dict[tuple[str, str], int] = {}
        for i, user in enumerate(users):
            if not is_hash(user["passwordHash"]):
                yield sip.error(base + ("users", i, "passwordHash"),
                                "not a bcrypt ($2b$...) or argon2id ($argon2id$...) hash: a password is never written "
                                "in the repo; put its hash (gitops oidc hash-password)")
            for j, group in enumerate(user.get("groups", [])):
                if spells_system("", group):
                    yield sip.error(base + ("users", i, "groups", j),
                                    f"{group!r}: the system: groups are Kubernetes' own (system:masters is every "
                                    "right); an OIDC user may not claim one")
            if spells_system("", user["email"]):  # (the schema keeps : out of usernames)
                yield sip.error(base + ("users", i, "email"), f"{user['email']!r}: the system: names are "
                                "Kubernetes' own (system:node:X is a node, system:kube-controller-manager a "
                                "controller); an OIDC user may not take one")
            for key in ("username", "email"):
                first = seen.setdefault((key, user[key].lower()), i)
                if first != i:
                    yield sip.error(base + ("users", i, key), f"{user[key]!r} is also the {key} of users[{first}]")
        trusted = sip.get(base + ("clientID",))
        if trusted is not None and clients and trusted not in {c["id"] for c in clients}:
            yield sip.error(base + ("clientID",), f"{trusted!r} is not one of the clients declared below")
        ids: dict[str, int] = {}
        for i, client in enumerate(clients):
            first = ids.setdefault(client["id"], i)
            if first != i:
                yield sip.error(base + ("clients", i, "id"), f"{client['id']!r} is also the id of clients[{first}]")
            for j, uri in enumerate(client.get("redirectURIs", [])):
                problem = _redirect_problem(uri)
                if problem:
                    yield sip.error(base + ("clients", i, "redirectURIs", j), problem)
            grants = client.get("grantTypes", ["authorization_code", "refresh_token"])
            if "authorization_code" in grants and not client.get("redirectURIs"):
                yield sip.error(base + ("clients", i),
                                "a client of the code flow (grantTypes authorization_code) needs redirectURIs")


def _redirect_problem(uri: str) -> str:
    """Why a client's redirect URI is refused ("" when it is not): https to a host, or http to loopback only (a
    CLI's own listener); no user info, no fragment."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
        host = parts.hostname or ""
        parts.port  # noqa: B018 -- a port that is not a number raises here
    except ValueError as err:
        return f"{uri!r} is not a URL: {err}"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return f"{uri!r} carries user info: a redirect URI names a host only"
    if parts.fragment or not host:
        return f"{uri!r} needs a host and no fragment"
    if parts.scheme == "http" and host not in ("127.0.0.1", "localhost", "::1"):
        return f"{uri!r}: http only to loopback (127.0.0.1, localhost, ::1); https otherwise"
    if parts.scheme not in ("http", "https"):
        return f"{uri!r}: https, or http to loopback"
    return ""


def network_data(docs: list[Document], _everything: list[Document]) -> Iterable[Diagnostic]:
    """A networkData Secret in the repo must give its host an IPv4 address.

    A host whose Secret is not in the repo is fine here (an inventory export often
    comes without Secrets); the plan says so if the address is needed.
    """
    secrets = {(d.get(("metadata", "namespace"), "default"), d.name): d for d in _of_kind(docs, "Secret")}
    for host in _of_kind(docs, "BareMetalHost"):
        name = host.get(("spec", "networkData", "name"))
        namespace = host.get(("metadata", "namespace"), "default")
        secret = secrets.get((namespace, name)) if name else None
        if secret is None:
            continue
        try:
            first_ipv4(network_data_from_secret(secret.data, host=host.name), host=host.name, secret=name)
        except NetworkDataError as err:
            yield secret.error(("stringData" if "stringData" in secret.data else "data", "networkData"), str(err))


CHECKS: tuple[Check, ...] = (
    unique_names,
    node_references,
    hypervisor_addresses,
    hypervisor_tls,
    hypervisor_data_dirs,
    node_counts,
    ingress_spread,
    recovery_survivors,
    kubernetes_versions,
    cluster_networks,
    api_server_args,
    api_server_oidc,
    sip_selectors,
    sip_auth,
    network_data,
)
