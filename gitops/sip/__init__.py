"""Bare-metal host selection for SIPClusters (Airship SIP style).

* `selection` -- pure: which BareMetalHosts each SIPCluster gets, as label changes;
* `providers` -- where hosts live: the repo (`FileProvider`, labels kept in an
  overlay the caller records on the status branch) or a Metal3 management
  cluster (`KubernetesProvider`: list, then label patches guarded by resourceVersion);
* `networkdata` -- a host's IPv4 address from its Metal3 networkData secret.
"""
from gitops.errors import GitopsError


class SIPError(GitopsError):
    """A host-selection failure: unreadable hosts, kubeconfig, network data, API errors."""


__all__ = ["SIPError"]
