"""Minimal reading of Hypervisor YAML documents (as `gitops lab up` prints them).

Stop-gap for `gitops cri --hypervisors-file` until the repo loader provides validated
Hypervisor objects; it checks only what it needs to build them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gitops.errors import GitopsError
from gitops.model.resources import Hypervisor, LocalCRIEndpoint, PortRange, RemoteCRIEndpoint


class HypervisorFileError(GitopsError):
    """A hypervisors file that cannot be used."""


def hypervisor_from_document(doc: dict[str, Any]) -> Hypervisor:
    """A Hypervisor from one `kind: Hypervisor` document."""
    try:
        name = doc["metadata"]["name"]
        spec = doc["spec"]
        ports = spec["portRange"]
        local, remote = spec.get("localCRIEndpoint"), spec.get("remoteCRIEndpoint")
        if (local is None) == (remote is None):
            raise HypervisorFileError(
                f"Hypervisor {name}: exactly one of localCRIEndpoint and remoteCRIEndpoint is required")
        endpoint: LocalCRIEndpoint | RemoteCRIEndpoint
        if local is not None:
            endpoint = LocalCRIEndpoint(local["criEndpointPath"])
        else:
            client = remote.get("clientCertificate") or {}
            endpoint = RemoteCRIEndpoint(remote["criEndpointURI"], remote["caCertificate"],
                                         client.get("certificate", ""), client.get("privateKey", ""))
        return Hypervisor(name=name, public=bool(spec.get("public", False)), ip_address=spec["ipAddress"],
                          port_range=PortRange(int(ports["low"]), int(ports["high"])), endpoint=endpoint,
                          labels=dict(doc["metadata"].get("labels") or {}))
    except (KeyError, TypeError, ValueError) as err:
        raise HypervisorFileError(f"malformed Hypervisor document: missing or bad {err}") from None


def load_hypervisors_file(path: Path) -> dict[str, Hypervisor]:
    """name -> Hypervisor for every `kind: Hypervisor` document in a YAML file."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as err:
        raise HypervisorFileError(f"cannot read {path}: {err}") from None
    found: dict[str, Hypervisor] = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Hypervisor":
            hv = hypervisor_from_document(doc)
            if hv.name in found:
                raise HypervisorFileError(f"{path}: Hypervisor {hv.name} defined twice")
            found[hv.name] = hv
    return dict(sorted(found.items()))


__all__ = ["HypervisorFileError", "hypervisor_from_document", "load_hypervisors_file"]
