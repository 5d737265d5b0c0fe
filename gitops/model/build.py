"""Turn valid documents into the typed `RepoModel` the later stages use."""
from __future__ import annotations

from gitops.model import versions
from gitops.model.config import IngressConfig
from gitops.model.documents import Document
from gitops.model.resources import (
    DATA_DIR_ANNOTATION,
    DEFAULT_DATA_DIR,
    DEFAULT_POD_CIDR,
    DEFAULT_SERVICE_CIDR,
    ApiServerOIDC,
    AuthClient,
    AuthService,
    AuthUser,
    BareMetalHost,
    Cluster,
    ClusterBackup,
    ClusterRecovery,
    ClusterRestore,
    Hypervisor,
    JumpHostService,
    LabelRequirement,
    LabelSelector,
    LoadBalancerService,
    LocalCRIEndpoint,
    Node,
    PortRange,
    RemoteCRIEndpoint,
    RepoModel,
    SIPCluster,
    SIPRole,
)


def build_model(docs: list[Document], ingress: IngressConfig = IngressConfig()) -> RepoModel:
    """Build the model from documents that passed schema and semantic checks (and gitops.yaml's
    spec.ingress, which placement and compilation need)."""
    by_kind: dict[str, list[Document]] = {}
    for doc in docs:
        by_kind.setdefault(doc.kind, []).append(doc)

    def each(kind: str, make):
        return {key: value for key, value in sorted(make(d) for d in by_kind.get(kind, []))}

    return RepoModel(
        hypervisors=each("Hypervisor", lambda d: (d.name, hypervisor(d))),
        clusters=each("Cluster", lambda d: (d.name, cluster(d))),
        nodes=each("Node", lambda d: (d.name, node(d))),
        sip_clusters=each("SIPCluster", lambda d: (d.name, sip_cluster(d))),
        baremetal_hosts=each("BareMetalHost", lambda d: (_bmh_key(d), baremetal_host(d))),
        secrets=each("Secret", lambda d: (_bmh_key(d), d.data)),
        ingress=ingress,
    )


def _labels(doc: Document) -> dict[str, str]:
    return dict(sorted(doc.get(("metadata", "labels"), {}).items()))


def hypervisor(doc: Document) -> Hypervisor:
    spec = doc.spec
    endpoint: LocalCRIEndpoint | RemoteCRIEndpoint
    if "localCRIEndpoint" in spec:
        endpoint = LocalCRIEndpoint(path=spec["localCRIEndpoint"]["criEndpointPath"])
    else:
        remote = spec["remoteCRIEndpoint"]
        endpoint = RemoteCRIEndpoint(
            uri=remote["criEndpointURI"],
            ca_certificate=remote["caCertificate"],
            client_certificate=remote["clientCertificate"]["certificate"],
            client_private_key=remote["clientCertificate"]["privateKey"],
        )
    return Hypervisor(
        name=doc.name,
        public=bool(spec.get("public", False)),
        ip_address=spec["ipAddress"],
        port_range=PortRange(spec["portRange"]["low"], spec["portRange"]["high"]),
        endpoint=endpoint,
        labels=_labels(doc),
        data_dir=doc.get(("metadata", "annotations", DATA_DIR_ANNOTATION), DEFAULT_DATA_DIR),
        cordoned=bool(spec.get("cordoned", False)),
        drain=bool(spec.get("drain", False)),
        interface=spec.get("interface", "eth0"),
        lost=bool(spec.get("lost", False)),
    )


def _auth(spec: dict) -> AuthService:
    return AuthService(
        spec.get("oidcIssuerURL"), spec.get("clientID"), spec.get("tokenTTLSeconds", 600),
        tuple(AuthUser(u["username"], u["email"], u["passwordHash"], tuple(u.get("groups", ())))
              for u in spec.get("users", ())),
        tuple(AuthClient(c["id"], c.get("name", ""), tuple(c.get("redirectURIs", ())), c.get("secret", ""),
                         tuple(c.get("grantTypes", ("authorization_code", "refresh_token"))))
              for c in spec.get("clients", ())))


def _oidc(spec: dict) -> ApiServerOIDC:
    return ApiServerOIDC(spec.get("issuerURL", ""), spec.get("clientID", ""), spec.get("usernameClaim", "email"),
                         spec.get("groupsClaim", "groups"), spec.get("usernamePrefix"), spec.get("groupsPrefix"),
                         spec.get("caBundle", ""), spec.get("sipCluster", ""))


def _etcd_version_field(spec: dict) -> tuple[str, ...]:
    """The field the etcd version comes from: spec.images.etcd, else spec.etcdVersion, else the pairing of
    spec.kubernetesVersion."""
    if "etcd" in spec.get("images", {}):
        return ("spec", "images", "etcd")
    return ("spec", "etcdVersion") if "etcdVersion" in spec else ("spec", "kubernetesVersion")


def cluster(doc: Document) -> Cluster:
    spec = doc.spec
    certs = spec.get("certificates", {})
    api = spec.get("apiServer", {})
    return Cluster(
        name=doc.name,
        labels=dict(doc.get(("metadata", "labels")) or {}),
        kubernetes_version="v" + spec["kubernetesVersion"].lstrip("v"),
        # unless named, the etcd upstream kubeadm pairs with the Kubernetes minor (gitops.model.versions)
        etcd_version=str(spec.get("etcdVersion") or versions.etcd_for(spec["kubernetesVersion"])).lstrip("v"),
        image_overrides=dict(sorted(spec.get("images", {}).items())),
        endpoint_hosts=tuple(api.get("endpointHosts", ())),
        api_port=api.get("port"),
        virtual_ip=api.get("virtualIP"),
        service_cidr=spec.get("serviceCIDR", DEFAULT_SERVICE_CIDR),
        pod_cidr=spec.get("podCIDR", DEFAULT_POD_CIDR),
        node_cidr=spec.get("nodeCIDR"),
        vpn_cidr=spec.get("vpn", {}).get("cidr") if spec.get("vpn", {}).get("enabled", True) else None,
        validity_days=certs.get("validityDays", 365),
        renew_before_days=certs.get("renewBeforeDays", 30),
        api_server_args=tuple(sorted(api.get("extraArgs", {}).items())),
        oidc=_oidc(api["oidc"]) if "oidc" in api else None,
        ca_generation=certs.get("caGeneration", 1),
        ca_generation_at=f"{doc.file}:{doc.line_of(('spec', 'certificates', 'caGeneration'))}",
        version_at=f"{doc.file}:{doc.line_of(('spec', 'kubernetesVersion'))}",
        etcd_version_at=f"{doc.file}:{doc.line_of(_etcd_version_field(spec))}",
        backup=ClusterBackup(spec["backup"]["target"], spec["backup"].get("intervalMinutes", 60),
                             spec["backup"].get("keep", 24)) if "backup" in spec else None,
        restore=ClusterRestore(spec["restore"]["snapshot"]) if "restore" in spec else None,
        recovery=ClusterRecovery(spec["recovery"]["forceNewClusterFrom"]) if "recovery" in spec else None,
        etcd_quota=spec.get("etcd", {}).get("quotaBackendBytes"),
    )


def node(doc: Document) -> Node:
    spec = doc.spec
    return Node(name=doc.name, cluster=spec["cluster"], role=spec["role"], hypervisor=spec.get("hypervisor"))


def label_selector(raw: dict) -> LabelSelector:
    return LabelSelector(
        match_labels=tuple(sorted(raw.get("matchLabels", {}).items())),
        match_expressions=tuple(
            LabelRequirement(e["key"], e["operator"], tuple(e.get("values", ()))) for e in raw.get("matchExpressions", [])
        ),
    )


def sip_cluster(doc: Document) -> SIPCluster:
    spec = doc.spec
    roles = {
        role: SIPRole(
            active=r["count"]["active"],
            standby=r["count"].get("standby", 0),
            selector=label_selector(r.get("labelSelector", {})),
            spread=r.get("spreadTopology", "PerRack"),
        )
        for role, r in sorted(spec["nodes"].items())
    }
    services = spec.get("services", {})
    lb = services.get("loadBalancer")
    jump = services.get("jumpHost")
    auth = services.get("auth")
    return SIPCluster(
        name=doc.name,
        roles=roles,
        load_balancer=LoadBalancerService(
            port=lb["port"],
            target_port=lb.get("targetPort", 6443),
            node_port_range=(lb["nodePortRange"]["start"], lb["nodePortRange"]["end"]) if "nodePortRange" in lb else None,
        ) if lb else None,
        jump_host=JumpHostService(tuple(jump["sshAuthorizedKeys"]), jump.get("port")) if jump else None,
        auth=_auth(auth) if auth is not None else None,
    )


def _bmh_key(doc: Document) -> str:
    return f"{doc.get(('metadata', 'namespace'), 'default')}/{doc.name}"


def baremetal_host(doc: Document) -> BareMetalHost:
    return BareMetalHost(
        name=doc.name,
        namespace=doc.get(("metadata", "namespace"), "default"),
        labels=_labels(doc),
        online=bool(doc.get(("spec", "online"), False)),
        bmc_address=doc.get(("spec", "bmc", "address")),
        network_data=doc.get(("spec", "networkData", "name")),
        provisioning_state=doc.get(("status", "provisioning", "state")),
        operational_status=doc.get(("status", "operationalStatus")),
        powered_on=doc.get(("status", "poweredOn")),
    )
