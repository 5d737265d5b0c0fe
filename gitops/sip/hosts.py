"""A BareMetalHost provider's interface and the host documents it reads (pure data, no I/O).

A provider lists hosts and applies label changes. Its class says where its hosts come from:
the repo (`observed = False`: planning lists them itself, purely) or a live inventory
(`observed = True`: listed while observing, planning reads what observation found). The
providers by name are `gitops.sip.providers.PROVIDERS`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import yaml

from gitops.model.build import baremetal_host
from gitops.model.config import BareMetalSource
from gitops.model.documents import Document
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip import SIPError
from gitops.sip.selection import LabelChange, host_key
from gitops.state.records import State

#: an overlay: host key -> label -> value set by gitops, or None for a label it removed
Overlay = dict[str, dict[str, str | None]]


class BMHProvider(Protocol):
    #: True: hosts are listed while observing (a live inventory); False: from the repo, at planning
    observed: ClassVar[bool]

    @classmethod
    def configured(cls, model: RepoModel, source: BareMetalSource, state: State) -> BMHProvider:
        """The provider `gitops.yaml`'s `spec.bareMetal` (`source`) configures, with `state`'s records."""
        ...

    def list_hosts(self) -> list[BareMetalHost]:
        """Every host, sorted by ``namespace/name``, labels as they are now."""
        ...

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        """Apply `changes` in order; raise `SIPError` on the first that fails."""
        ...

    def record(self, state: State) -> None:
        """Record in `state` what only this provider holds (the labels a file provider keeps in memory)."""
        ...


def host_from_object(obj: Any, source: str) -> BareMetalHost:
    """A `BareMetalHost` from a metal3.io/v1alpha1 object (API item or export document)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise SIPError(f"{source}: a BareMetalHost without metadata.name")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise SIPError(f"{source}: BareMetalHost {name}: metadata.labels must map strings to strings")
    if not isinstance(obj.get("spec", {}), dict) or not isinstance(obj.get("status", {}), dict):
        raise SIPError(f"{source}: BareMetalHost {name}: spec and status must be mappings")
    return baremetal_host(Document(file=source, line=0, data=obj))


def hosts_from_yaml(text: str, source: str) -> list[BareMetalHost]:
    """BareMetalHosts of a YAML stream: documents and ``kind: List`` items; other kinds are skipped."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise SIPError(f"{source}: not valid YAML: {err}") from None
    objects: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List":
            objects.extend(doc.get("items") or [])
        else:
            objects.append(doc)
    hosts = [host_from_object(o, source) for o in objects if isinstance(o, dict) and o.get("kind") == "BareMetalHost"]
    return sorted(hosts, key=host_key)
