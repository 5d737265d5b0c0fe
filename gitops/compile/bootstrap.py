"""What a cluster's own API must hold so workers can join it (pure).

TLS bootstrapping as kubeadm sets it up, with one difference: gitops, not the
controller-manager, signs node certificates (see `gitops.plan.cluster_api`), so the
cluster CA key stays with the controller.

* `system:bootstrappers` (bootstrap tokens) may create node-client certificate
  requests, and the controller-manager approves them (its csrapproving
  controller acts on these bindings); nodes may renew their own client
  certificates the same way;
* kube-proxy runs on a node's own credentials: `system:nodes` get `system:node-proxier`;
* a node may delete its Node object when it leaves (`gitops leave`): RBAC grants `system:nodes`
  delete on nodes, and the NodeRestriction admission plugin limits each node to its own;
* `cluster-info` in `kube-public`: a kubeconfig with the API endpoint and the CA,
  readable anonymously, which `gitops join` fetches and pins by the CA's hash.
"""
from __future__ import annotations

from typing import Any

from gitops.apipaths import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    PUBLIC_CONFIG_MAPS,
    PUBLIC_ROLE_BINDINGS,
    PUBLIC_ROLES,
)
from gitops.compile.desired import KubeObject, canonical_json, digest
from gitops.kubeconfig import cluster_info_kubeconfig
from gitops.pods import MANAGED, MANAGER, SPEC_HASH

BOOTSTRAPPERS = "system:bootstrappers"
NODES = "system:nodes"


def bootstrap_objects(endpoint: str, ca_pem: str) -> tuple[KubeObject, ...]:
    """The objects for a cluster reached at `endpoint` (the ingress) whose CA is `ca_pem`."""
    objects = [
        _binding("gitops:kubelet-bootstrap", "system:node-bootstrapper", BOOTSTRAPPERS),
        _binding("gitops:node-autoapprove-bootstrap",
                 "system:certificates.k8s.io:certificatesigningrequests:nodeclient", BOOTSTRAPPERS),
        _binding("gitops:node-autoapprove-certificate-rotation",
                 "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", NODES),
        _binding("gitops:node-proxier", "system:node-proxier", NODES),
        _object(CLUSTER_ROLES, "ClusterRole", "rbac.authorization.k8s.io/v1", "gitops:node-self-delete", "",
                {"rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}]}),
        _binding("gitops:node-self-delete", "gitops:node-self-delete", NODES),
        _object(PUBLIC_ROLES, "Role", "rbac.authorization.k8s.io/v1",
                "gitops:cluster-info-reader", "kube-public", {
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"],
                               "verbs": ["get"]}]}),
        _object(PUBLIC_ROLE_BINDINGS, "RoleBinding", "rbac.authorization.k8s.io/v1",
                "gitops:cluster-info-reader", "kube-public", {
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": "gitops:cluster-info-reader"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": "system:anonymous"}]}),
        _object(PUBLIC_CONFIG_MAPS, "ConfigMap", "v1", "cluster-info", "kube-public",
                {"data": {"kubeconfig": cluster_info_kubeconfig(endpoint, ca_pem)}}),
    ]
    return tuple(sorted(objects, key=lambda o: o.key))


def _binding(name: str, role: str, group: str) -> KubeObject:
    return _object(CLUSTER_ROLE_BINDINGS, "ClusterRoleBinding", "rbac.authorization.k8s.io/v1", name, "", {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]})


def _object(collection: str, kind: str, api_version: str, name: str, namespace: str,
            content: dict[str, Any]) -> KubeObject:
    metadata: dict[str, Any] = {"name": name, "labels": {MANAGED: MANAGER}}
    if namespace:
        metadata["namespace"] = namespace
    body = {"apiVersion": api_version, "kind": kind, "metadata": metadata, **content}
    spec_hash = digest(body)
    body["metadata"]["annotations"] = {SPEC_HASH: spec_hash}
    return KubeObject(collection=collection, kind=kind, name=name, body=canonical_json(body), spec_hash=spec_hash)
