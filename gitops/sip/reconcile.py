"""SIP in the reconcile: which BareMetalHosts exist, and labeling them."""
from __future__ import annotations

from gitops.model.config import RepoConfig
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip.providers import BMHProvider, FileProvider, KubernetesProvider
from gitops.sip.selection import LabelChange
from gitops.state.records import State


def provider_for(model: RepoModel, config: RepoConfig, state: State) -> BMHProvider:
    source = config.bare_metal
    if source.provider == "kubernetes":
        assert source.kubeconfig is not None  # the schema requires it
        return KubernetesProvider.from_kubeconfig(source.kubeconfig, namespace=source.namespace)
    return FileProvider.from_model(model, state.sip_labels)


def file_hosts(model: RepoModel, state: State) -> list[BareMetalHost]:
    """The repo's hosts with the labels gitops recorded for them (pure)."""
    return FileProvider.from_model(model, state.sip_labels).list_hosts()


def apply_change(provider: BMHProvider, change: LabelChange, state: State) -> None:
    """Label one host; a file provider's labels are recorded in `state`."""
    provider.apply_labels([change])
    if isinstance(provider, FileProvider):
        state.sip_labels = {host: dict(labels) for host, labels in sorted(provider.overlay.items())}
