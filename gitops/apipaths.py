"""Where gitops keeps objects in a cluster's own API: the REST collections compile's bootstrap
objects are written to, observation lists and a joining worker reads."""
from __future__ import annotations

RBAC = "/apis/rbac.authorization.k8s.io/v1"
CLUSTER_ROLES = f"{RBAC}/clusterroles"
CLUSTER_ROLE_BINDINGS = f"{RBAC}/clusterrolebindings"
PUBLIC_ROLES = f"{RBAC}/namespaces/kube-public/roles"
PUBLIC_ROLE_BINDINGS = f"{RBAC}/namespaces/kube-public/rolebindings"
PUBLIC_CONFIG_MAPS = "/api/v1/namespaces/kube-public/configmaps"
#: the kubeconfig (server and CA) a worker discovers the cluster with
CLUSTER_INFO = f"{PUBLIC_CONFIG_MAPS}/cluster-info"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"

#: every collection gitops writes objects to; observation lists each by the managed-by label
COLLECTIONS = (CLUSTER_ROLES, CLUSTER_ROLE_BINDINGS, PUBLIC_ROLES, PUBLIC_ROLE_BINDINGS, PUBLIC_CONFIG_MAPS)
