"""The `file` BareMetalHost provider (pure): hosts from the repo (or a ``kubectl get bmh -o yaml``
export). The labels gitops sets are kept in an overlay that is recorded in the state (on the
status branch) and passed back next time; the repo is never written.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

from gitops.model.config import BareMetalSource
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip import SIPError
from gitops.sip.hosts import Overlay
from gitops.sip.selection import LabelChange, host_key
from gitops.state.records import State


class FileProvider:
    """Hosts from files; the labels gitops sets live in `overlay`, for the caller to record."""

    #: the hosts are the repo's: planning lists them itself
    observed: ClassVar[bool] = False

    def __init__(self, hosts: Iterable[BareMetalHost], overlay: Mapping[str, Mapping[str, str | None]] | None = None):
        self._hosts = {host_key(h): h for h in sorted(hosts, key=host_key)}
        self._overlay: Overlay = {}
        for key, labels in (overlay or {}).items():
            if key in self._hosts:  # entries of hosts gone from the repo are dropped
                for label, value in labels.items():
                    self._record(key, label, value)

    @classmethod
    def configured(cls, model: RepoModel, source: BareMetalSource, state: State) -> FileProvider:
        """The repo's hosts with the labels recorded in `state`."""
        return cls(model.baremetal_hosts.values(), state.sip_labels)

    @property
    def overlay(self) -> Overlay:
        """Label differences from the files, sorted: value set, or None where removed."""
        return {k: dict(sorted(v.items())) for k, v in sorted(self._overlay.items()) if v}

    def _labels(self, key: str) -> dict[str, str]:
        labels = dict(self._hosts[key].labels)
        for label, value in self._overlay.get(key, {}).items():
            if value is None:
                labels.pop(label, None)
            else:
                labels[label] = value
        return dict(sorted(labels.items()))

    def _record(self, key: str, label: str, value: str | None) -> None:
        entry = self._overlay.setdefault(key, {})
        if self._hosts[key].labels.get(label) == value:
            entry.pop(label, None)  # back to what the file says
        else:
            entry[label] = value

    def list_hosts(self) -> list[BareMetalHost]:
        return [replace(h, labels=self._labels(k)) for k, h in self._hosts.items()]

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        unknown = sorted({c.host for c in changes} - set(self._hosts))
        if unknown:
            raise SIPError(f"cannot label unknown BareMetalHost(s): {', '.join(unknown)}")
        for change in changes:
            for label in change.remove:
                self._record(change.host, label, None)
            for label, value in change.set:
                self._record(change.host, label, value)

    def record(self, state: State) -> None:
        """The overlay is recorded in `state` (the repo is never written)."""
        state.sip_labels = {host: dict(labels) for host, labels in sorted(self.overlay.items())}
