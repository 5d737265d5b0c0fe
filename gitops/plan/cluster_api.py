"""Actions inside each cluster's own API (pure): the worker-bootstrap objects, and the node
certificate requests gitops signs as the cluster's signer.

gitops is the signer of `kubernetes.io/kube-apiserver-client-kubelet` (node client
certificates; the controller-manager approves them through the bootstrap RBAC) and of
`kubernetes.io/kubelet-serving` (kubelet serving certificates, which gitops also
approves). It signs only requests that ask for exactly what a node may have: its own
`system:node:NAME` identity in `system:nodes`, the usages of its signer, and (serving)
only DNS and IP names. Anything else is left alone and shown as a warning.
"""
from __future__ import annotations

import ipaddress

from cryptography import x509
from cryptography.x509.oid import NameOID

from gitops.compile.desired import DesiredState
from gitops.model.components import APISERVER
from gitops.observe.types import ObservedCSR, ObservedState
from gitops.pki import PKIError, load_csr_pem
from gitops.plan.actions import Action, Kind, Unknown, UnknownKind
from gitops.plan.payloads import PutObject, SignRequest

CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
NODE_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
#: validity of node certificates; kubelets renew theirs at about 70-90% of it
NODE_CERT_DAYS = 365
_USAGES = {
    CLIENT_SIGNER: {"digital signature", "key encipherment", "client auth"},
    SERVING_SIGNER: {"digital signature", "key encipherment", "server auth"},
}


def cluster_api_actions(desired: DesiredState, observed: ObservedState, health_timeout: int,
                        ) -> tuple[list[Action], list[str], list[Unknown]]:
    """Actions, warnings and unknowns for every cluster with objects to keep (an ingress endpoint)."""
    actions: list[Action] = []
    warnings: list[str] = []
    unknowns: list[Unknown] = []
    down = set(observed.unreachable)
    running = {p.cluster for p in observed.pods() if p.running(APISERVER)}
    for name, cluster in sorted(desired.clusters.items()):
        if not cluster.objects or cluster.api_endpoint is None:
            continue
        seen = observed.clusters.get(name)
        if seen is None and name in running:
            unknowns.append(Unknown(UnknownKind.CLUSTER_API, name, "not observed (no admin credential recorded)"))
            continue
        if seen is None:
            # no API server of the cluster runs yet: the plan starts them, then creates the objects
            if any(p.cluster == name and p.hypervisor in down for p in desired.pods.values()):
                continue  # the hypervisor is reported unknown; nothing to say about its API yet
            actions += [_put(name, cluster.api_endpoint, o, Kind.CREATE_OBJECT, health_timeout,
                             "the cluster's API is new: what joining workers need") for o in cluster.objects]
            continue
        if not seen.reachable:
            unknowns.append(Unknown(UnknownKind.CLUSTER_API, name, seen.error))
            continue
        for obj in cluster.objects:
            found = seen.objects.get(obj.key)
            if found is None:
                actions.append(_put(name, cluster.api_endpoint, obj, Kind.CREATE_OBJECT, 0, "missing"))
            elif found != obj.spec_hash:
                actions.append(_put(name, cluster.api_endpoint, obj, Kind.UPDATE_OBJECT, 0,
                                    f"spec hash {found or '(none)'} != {obj.spec_hash}"))
        for csr in seen.pending_csrs:
            decided = sign_decision(csr)
            if isinstance(decided, str):
                if decided:
                    warnings.append(f"cluster {name}: certificate request {csr.name} not signed: {decided}")
                continue
            payload = SignRequest(cluster=name, server=cluster.api_endpoint, name=csr.name, uid=csr.uid,
                                  request=csr.request, **decided)
            node = decided["common_name"].removeprefix(NODE_PREFIX)
            kind = "serving" if decided.get("server_auth") else "client"
            actions.append(Action(Kind.SIGN_CERTIFICATE_REQUEST, "", name, node, component="kubelet",
                                  reason=f"worker {node} asks for a kubelet {kind} certificate",
                                  details=(f"request {csr.name} from {csr.username}",
                                           *(("approve it (gitops approves kubelet serving requests)",)
                                             if payload.approve else ()),
                                           f"sign for {payload.common_name} O={','.join(payload.organizations)}"
                                           + (f" names={','.join(payload.dns_names + payload.ip_addresses)}"
                                              if payload.dns_names or payload.ip_addresses else "")
                                           + f", {NODE_CERT_DAYS} days"),
                                  target_id=csr.name, payload=payload))
    return actions, warnings, unknowns


def _put(cluster: str, server: str, obj, kind: Kind, wait: int, reason: str) -> Action:
    return Action(kind, "", cluster, obj.kind, component=obj.name, reason=reason,
                  details=(f"at {obj.collection}",), target_id=obj.key,
                  payload=PutObject(cluster, server, obj.collection, obj.body, wait))


def sign_decision(csr: ObservedCSR) -> dict | str:
    """What gitops would sign for `csr` (SignRequest fields), or why not ("" = not ours, or not yet)."""
    if csr.signer not in _USAGES:
        return ""
    if csr.signer == CLIENT_SIGNER and not csr.approved:
        return ""  # the controller-manager approves node client requests; sign once it has
    try:
        request = load_csr_pem(csr.request)
    except PKIError as err:
        return str(err)
    names = request.subject
    common = [a.value for a in names.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [a.value for a in names.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    if len(common) != 1 or not str(common[0]).startswith(NODE_PREFIX) or orgs != [NODES_GROUP] \
            or len(names) != 2:
        return f"subject {names.rfc4514_string()} is not CN=system:node:NAME,O=system:nodes"
    common_name = str(common[0])
    extra = set(csr.usages) - _USAGES[csr.signer]
    if extra:
        return f"usages {sorted(extra)} are not allowed for {csr.signer}"
    dns: list[str] = []
    ips: list[str] = []
    try:
        san = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if csr.signer == CLIENT_SIGNER:
        if san is not None:
            return "a node client certificate names no hosts"
        return {"common_name": common_name, "organizations": (NODES_GROUP,), "client_auth": True,
                "days": NODE_CERT_DAYS}
    if csr.username != common_name or NODES_GROUP not in csr.groups:
        return f"requested by {csr.username}, not by the node {common_name} itself"
    for general in san or ():
        if isinstance(general, x509.DNSName):
            dns.append(general.value)
        elif isinstance(general, x509.IPAddress):
            ips.append(str(ipaddress.ip_address(general.value)))
        else:
            return f"subject alternative name {general} is neither DNS nor IP"
    if not dns and not ips:
        return "a serving certificate needs at least one DNS or IP name"
    return {"common_name": common_name, "organizations": (NODES_GROUP,), "dns_names": tuple(dns),
            "ip_addresses": tuple(ips), "server_auth": True, "days": NODE_CERT_DAYS,
            "approve": not csr.approved}
