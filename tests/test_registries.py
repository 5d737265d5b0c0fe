"""The component, role and BareMetalHost provider registries: in step with the schemas, and complete."""
from __future__ import annotations

import dataclasses

from gitops.compile.components import CONTROLPLANE_CONTAINERS
from gitops.model.components import COMPONENTS, CONTROLPLANE, NODE_ROLES, ROLES
from gitops.model.resources import Cluster
from gitops.model.schemas import schema
from gitops.sip.providers import PROVIDERS


def _spec(kind: str) -> dict:
    return schema(kind)["properties"]["spec"]["properties"]


def test_provider_names_are_the_schemas():
    assert _spec("GitopsConfig")["bareMetal"]["properties"]["provider"]["enum"] == list(PROVIDERS)


def test_every_provider_says_where_its_hosts_come_from():
    assert {name: kind.observed for name, kind in PROVIDERS.items()} == {"file": False, "kubernetes": True}
    for kind in PROVIDERS.values():
        assert callable(kind.configured) and callable(kind.record)


def test_image_keys_are_the_schemas():
    keys = [c.image_key for c in COMPONENTS.values() if c.image_key]
    assert sorted(_spec("Cluster")["images"]["properties"]) == sorted(keys)


def test_node_roles_are_the_schemas():
    assert _spec("Node")["role"]["enum"] == list(NODE_ROLES)
    assert set(NODE_ROLES) <= set(ROLES)


def test_every_role_runs_known_components():
    for role in ROLES.values():
        assert role.components and set(role.components) <= set(COMPONENTS), role.name
        assert len(set(role.ports)) == len(role.ports), role.name
    assert set(ROLES[CONTROLPLANE].components) == set(CONTROLPLANE_CONTAINERS)


def test_default_images_and_overrides():
    cluster = Cluster("c", "v1.37.2", "v3.7.3", image_overrides={"kubeScheduler": "example/scheduler:1"})
    assert {name: cluster.image(name) for name in COMPONENTS} == {
        "files": "ghcr.io/gitops-infra/gitops-agent:0.1.0",
        "etcd": "registry.k8s.io/etcd:3.7.3-0",
        "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.37.2",
        "kube-controller-manager": "registry.k8s.io/kube-controller-manager:v1.37.2",
        "kube-scheduler": "example/scheduler:1",
        "haproxy": "docker.io/library/haproxy:2.8",
        "keepalived": "docker.io/osixia/keepalived:2.0.20",
        "jumphost": "ghcr.io/gitops-infra/gitops-jumphost:0.1.0",
        "oidc": "ghcr.io/gitops-infra/gitops:0.1.0",
    }


def test_a_restore_stops_every_control_plane_component_the_registry_lists(monkeypatch):
    """issue #45.2: no second list. The restore stops what a control-plane node runs, etcd last; a component
    added to the role is stopped too."""
    from gitops.model import components
    from gitops.plan import restore

    assert restore.STOPPED == ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
    role = components.ROLES[components.CONTROLPLANE]
    grown = dataclasses.replace(role, components=(*role.components, "kube-newcomer"))
    monkeypatch.setitem(components.ROLES, components.CONTROLPLANE, grown)
    assert components.restore_stopped() == ("kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                            "kube-newcomer", "etcd")
