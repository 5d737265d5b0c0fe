"""Bare-metal host selection for SIPClusters (Airship SIP style).

* `selection` -- pure: which BareMetalHosts each SIPCluster gets (`HostSelection`), as label changes;
* `hosts` -- pure: a provider's interface (`BMHProvider`) and the host documents it reads;
* `providers` -- the providers by name (`spec.bareMetal.provider`): `file` (`fileprovider`: the
  repo's hosts, labels kept in an overlay recorded on the status branch) and `kubernetes`
  (`kubeprovider`: a Metal3 management cluster, list, then label patches guarded by resourceVersion).
A host's address from its networkData Secret is the model's (`gitops.model.networkdata`);
the support-service pods (load balancer, jump host) are compiled like any other
(`gitops.compile.sip_services`, `gitops.compile.jumphost`).
"""
from gitops.errors import GitopsError


class SIPError(GitopsError):
    """A host-selection failure: unreadable hosts, kubeconfig, network data, API errors."""


__all__ = ["SIPError"]
