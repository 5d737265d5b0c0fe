"""The components gitops runs in a node's pod, and the roles that group them (data, one entry each).

A component is one container of a pod: its name (the container's name and `component` label), its
`spec.images` key and default image, and how a running one is replaced. A role says where its pods
run, the host ports they bind (allocated in that order) and their components in start order, after
the files agent. Adding a component is an entry here, its container in `gitops.compile.components`
(or `gitops.compile.sip_services`) and its image key in cluster.schema.json (a test keeps the
schema's keys and this registry in step).
"""
from __future__ import annotations

from dataclasses import dataclass

from gitops.pods import AGENT

ETCD = "etcd"
#: talks to its own node's etcd member only (`--etcd-servers`): the plan stops it around that member
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
HAPROXY = "haproxy"
#: beside haproxy in the ingress pods of a cluster with a virtual IP: VRRP decides which one holds it
KEEPALIVED = "keepalived"
JUMPHOST = "jumphost"
#: SIP's OpenID Connect provider (`gitops oidc serve`), behind haproxy terminating TLS in the same pod
OIDC = "oidc"

#: how a running container is replaced: stopped, then started (the default)
STOP_START = ""
#: one etcd member at a time: the others healthy before, this one healthy after
ETCD_MEMBER = "etcd-member"
#: its own /readyz must answer before the plan goes on
READYZ = "readyz"
#: the new one starts beside the old one, which stops a little later: its port never closes
OVERLAP = "overlap"
#: a change of only the files it reads is taken in place: its `reload` command runs in it (any other
#: change replaces it, stop then start)
RELOAD = "reload"

#: the files agent: a small image with sh, openssl and coreutils (see Dockerfile, target `agent`)
DEFAULT_AGENT_IMAGE = "ghcr.io/gitops-infra/gitops-agent:0.1.0"
#: the SIP jump host: Debian's sshd (see `gitops.compile.jumphost`)
DEFAULT_JUMPHOST_IMAGE = "ghcr.io/gitops-infra/gitops-jumphost:0.1.0"
#: SIP's OIDC provider: the controller's own image (see Dockerfile, target `gitops`), which has `gitops oidc serve`
DEFAULT_OIDC_IMAGE = "ghcr.io/gitops-infra/gitops:0.1.0"


@dataclass(frozen=True)
class Component:
    """One container gitops runs in a pod."""

    name: str
    #: its key in a Cluster's `spec.images` ("": not overridable)
    image_key: str
    #: the upstream image; `{kubernetes}` is the cluster's version ("v1.37.2"), `{etcd}` its etcd version ("3.7.3")
    default_image: str
    #: how a running one is replaced (`STOP_START`, `ETCD_MEMBER`, `READYZ`, `OVERLAP`, `RELOAD`)
    rollout: str = STOP_START
    #: `RELOAD`: the command run in the container to make it read its files again
    reload: tuple[str, ...] = ()

    def image(self, overrides: dict[str, str], kubernetes: str, etcd: str) -> str:
        """The image a cluster with these `overrides` and versions runs."""
        if self.image_key in overrides:
            return overrides[self.image_key]
        return self.default_image.format(kubernetes=kubernetes, etcd=etcd.lstrip("v"))


COMPONENTS: dict[str, Component] = {c.name: c for c in (
    Component(AGENT, "agent", DEFAULT_AGENT_IMAGE),
    Component(ETCD, "etcd", "registry.k8s.io/etcd:{etcd}-0", ETCD_MEMBER),
    Component(APISERVER, "kubeApiserver", "registry.k8s.io/kube-apiserver:{kubernetes}", READYZ),
    Component(CONTROLLER_MANAGER, "kubeControllerManager", "registry.k8s.io/kube-controller-manager:{kubernetes}"),
    Component(SCHEDULER, "kubeScheduler", "registry.k8s.io/kube-scheduler:{kubernetes}"),
    Component(HAPROXY, "haproxy", "docker.io/library/haproxy:2.8", OVERLAP),
    # keepalived re-reads its configuration on SIGHUP (pid 1: it runs in the foreground) and keeps the
    # virtual IP where it is; a restart would hand it to another node
    Component(KEEPALIVED, "keepalived", "docker.io/osixia/keepalived:2.0.20", RELOAD, ("kill", "-HUP", "1")),
    Component(JUMPHOST, "", DEFAULT_JUMPHOST_IMAGE),
    Component(OIDC, "", DEFAULT_OIDC_IMAGE),
)}


def reload_of(component: str) -> tuple[str, ...]:
    """The command that makes a running `component` read its files again (empty: it cannot)."""
    known = COMPONENTS.get(component)
    return known.reload if known is not None and known.rollout == RELOAD else ()


def rollout_of(component: str) -> str:
    """How a running `component` is replaced (`STOP_START` for one gitops does not know)."""
    known = COMPONENTS.get(component)
    return known.rollout if known is not None else STOP_START


CONTROLPLANE = "controlplane"
INGRESS = "controlplane-ingress"
#: the port an ingress node of a cluster with a virtual IP answers keepalived's health check on (haproxy's
#: monitor: 200 while haproxy runs and has an API server to send to)
INGRESS_CHECK_PORT = "ingress-check"
SIP_LOADBALANCER = "sip-loadbalancer"
SIP_JUMPHOST = "sip-jumphost"
SIP_AUTH = "sip-auth"


@dataclass(frozen=True)
class Role:
    """What a node of one role runs, and where."""

    name: str
    #: runs on public hypervisors (else on private ones)
    public: bool
    #: the host ports its pod binds on its hypervisor's IP (host networking), allocated in this order
    ports: tuple[str, ...]
    #: its components after the files agent, in start order
    components: tuple[str, ...]


ROLES: dict[str, Role] = {r.name: r for r in (
    Role(CONTROLPLANE, False, ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler"),
         (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)),
    Role(INGRESS, True, ("apiserver",), (HAPROXY,)),
    # SIP support services: pods on public hypervisors, like ingresses
    Role(SIP_LOADBALANCER, True, ("loadbalancer",), (HAPROXY,)),
    Role(SIP_JUMPHOST, True, ("ssh",), (JUMPHOST,)),
    # haproxy terminates TLS on the port, the provider serves it on the same port of 127.0.0.1
    Role(SIP_AUTH, True, ("oidc",), (HAPROXY, OIDC)),
)}
#: the roles a Node of the repo may have (node.schema.json's enum); the others are SIP's services
NODE_ROLES = (CONTROLPLANE, INGRESS)


def restore_stopped() -> tuple[str, ...]:
    """What an etcd restore stops on each member node and starts again, in the order it stops them: every
    component of a control-plane node (the registry's, so a new one is not missed), etcd last."""
    components = ROLES[CONTROLPLANE].components
    return tuple(c for c in components if c != ETCD) + tuple(c for c in components if c == ETCD)
