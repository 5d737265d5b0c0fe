"""Bare-metal host selection for SIPClusters (Airship SIP style).

* `selection` -- pure: which BareMetalHosts each SIPCluster gets, as label changes;
* `providers` -- where hosts live: the repo (`FileProvider`, labels kept in an
  overlay the caller records on the status branch) or a Metal3 management
  cluster (`KubernetesProvider`: list, then label patches guarded by resourceVersion);
* `reconcile` -- the provider a repo configures, and recording a file provider's labels.
A host's address from its networkData Secret is the model's (`gitops.model.networkdata`);
the support-service pods (load balancer, jump host) are compiled like any other
(`gitops.compile.sip_services`, `gitops.compile.jumphost`).
"""
from gitops.errors import GitopsError


class SIPError(GitopsError):
    """A host-selection failure: unreadable hosts, kubeconfig, network data, API errors."""


__all__ = ["SIPError"]
