"""A host's IPv4 address from its Metal3 networkData.

Metal3 hands the host an OpenStack-style ``network_data.json``, kept in a Secret
the BareMetalHost names in ``spec.networkData.name``, looked up in the host's
namespace (the model does not keep ``spec.networkData.namespace``)::

    apiVersion: v1
    kind: Secret
    metadata: {name: r01-node-01-network-data, namespace: metal3}
    stringData:          # or data.networkData: <base64 of the same text>
      networkData: |
        links:    [{id: enp1s0, type: phy, ethernet_mac_address: "52:54:00:00:01:31"}]
        networks: [{id: oam, type: ipv4, link: enp1s0, ip_address: 10.23.25.101,
                    netmask: 255.255.255.0, routes: [...]}]
        services: [{type: dns, address: 8.8.8.8}]

The text may be JSON or YAML. ``stringData`` wins over ``data`` (as the API
server merges them). The host's address is the ``ip_address`` of the first
``networks[]`` entry whose ``type`` is ``ipv4`` (a static address); ``ipv4_dhcp``
and IPv6 entries are skipped. ``ip_address`` may carry a ``/prefix``, which is dropped.
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from gitops.model.resources import BareMetalHost
from gitops.errors import GitopsError

NETWORK_DATA_KEY = "networkData"


class NetworkDataError(GitopsError):
    """Missing or unusable network data for a host."""


def _where(host: str, secret: str) -> str:
    parts = ([f"host {host}"] if host else []) + ([f"secret {secret}"] if secret else [])
    return ", ".join(parts) or "network data"


def first_ipv4(network_data: Mapping[str, Any], *, host: str = "", secret: str = "") -> str:
    """The first static IPv4 address of an OpenStack-style network_data dict."""
    where = _where(host, secret)
    networks = network_data.get("networks") if isinstance(network_data, Mapping) else None
    if not isinstance(networks, list):
        raise NetworkDataError(f"{where}: network data has no 'networks' list")
    for index, net in enumerate(networks):
        if not isinstance(net, Mapping) or net.get("type") != "ipv4":
            continue
        raw = net.get("ip_address")
        try:
            return str(ipaddress.IPv4Interface(str(raw)).ip)
        except ValueError:
            raise NetworkDataError(f"{where}: networks[{index}] ({net.get('id', '?')}) has type ipv4 "
                                   f"but ip_address {raw!r} is not an IPv4 address") from None
    raise NetworkDataError(f"{where}: no networks[] entry of type ipv4 with a static ip_address "
                           "(ipv4_dhcp and ipv6 entries have none to use)")


def network_data_from_secret(secret: Mapping[str, Any], *, host: str = "") -> dict[str, Any]:
    """The parsed networkData of a v1 Secret (``stringData`` text, else base64 ``data``)."""
    name = _secret_name(secret)
    where = _where(host, name)
    if secret.get("kind") != "Secret":
        raise NetworkDataError(f"{where}: expected kind Secret, got {secret.get('kind')!r}")
    text = (secret.get("stringData") or {}).get(NETWORK_DATA_KEY)
    if text is None:
        encoded = (secret.get("data") or {}).get(NETWORK_DATA_KEY)
        if encoded is None:
            raise NetworkDataError(f"{where}: has neither stringData.{NETWORK_DATA_KEY} nor data.{NETWORK_DATA_KEY}")
        try:
            text = base64.b64decode(str(encoded), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise NetworkDataError(f"{where}: data.{NETWORK_DATA_KEY} is not base64 of UTF-8 text") from None
    try:
        parsed = yaml.safe_load(str(text))  # JSON is YAML
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise NetworkDataError(f"{where}: {NETWORK_DATA_KEY} is neither JSON nor YAML{at}") from None
    if not isinstance(parsed, dict):
        raise NetworkDataError(f"{where}: {NETWORK_DATA_KEY} must be a mapping (network_data.json)")
    return parsed


def _secret_name(secret: Mapping[str, Any]) -> str:
    meta = secret.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def host_ipv4(host: BareMetalHost, secrets: Iterable[Mapping[str, Any]]) -> str:
    """The IPv4 address of `host` from the Secret its ``spec.networkData`` names."""
    label = f"{host.namespace}/{host.name}"
    if not host.network_data:
        raise NetworkDataError(f"host {label}: spec.networkData names no secret")
    wanted = f"{host.namespace}/{host.network_data}"
    for secret in secrets:
        if secret.get("kind") == "Secret" and _secret_name(secret) == wanted:
            return first_ipv4(network_data_from_secret(secret, host=label), host=label, secret=wanted)
    raise NetworkDataError(f"host {label}: network data secret {wanted} not found")


def host_addresses(hosts: Iterable[BareMetalHost], secrets: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``namespace/name`` -> IPv4 address for each host (sorted); the first failure raises."""
    secrets = list(secrets)
    return {f"{h.namespace}/{h.name}": host_ipv4(h, secrets)
            for h in sorted(hosts, key=lambda h: (h.namespace, h.name))}
