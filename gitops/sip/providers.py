"""The BareMetalHost providers by name (`spec.bareMetal.provider`), and the calls that use
whichever one a repo configures. A new provider is one module (a `BMHProvider` class) and one
entry here; `gitops.yaml`'s schema lists the same names (a test keeps the two in step).
"""
from __future__ import annotations

from gitops.model.config import BareMetalSource, RepoConfig
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip.fileprovider import FileProvider
from gitops.sip.hosts import BMHProvider
from gitops.sip.kubeprovider import KubernetesProvider
from gitops.sip.selection import LabelChange
from gitops.state.records import State

PROVIDERS: dict[str, type[BMHProvider]] = {
    "file": FileProvider,
    "kubernetes": KubernetesProvider,
}


def provider_kind(source: BareMetalSource) -> type[BMHProvider]:
    """The provider class `source` names."""
    return PROVIDERS[source.provider]


def provider_for(model: RepoModel, config: RepoConfig, state: State) -> BMHProvider:
    """The provider the repo configures, with the labels `state` records."""
    return provider_kind(config.bare_metal).configured(model, config.bare_metal, state)


def planned_hosts(model: RepoModel, config: RepoConfig, state: State,
                  observed: tuple[BareMetalHost, ...] | None) -> list[BareMetalHost] | None:
    """The hosts a plan selects from (pure): the repo's with the labels `state` records, or what
    observation listed (`observed`; None: not listed)."""
    if provider_kind(config.bare_metal).observed:
        return list(observed) if observed is not None else None
    return provider_for(model, config, state).list_hosts()


def apply_change(provider: BMHProvider, change: LabelChange, state: State) -> None:
    """Label one host; what only the provider holds is recorded in `state`."""
    provider.apply_labels([change])
    provider.record(state)
