"""A host's IPv4 address from its Metal3 networkData secret."""
from __future__ import annotations

import base64
import json

import pytest

from gitops.model.resources import BareMetalHost
from gitops.model.networkdata import NetworkDataError, first_ipv4, host_addresses, host_ipv4, network_data_from_secret

NETWORK_DATA_YAML = """\
links:
  - {id: enp1s0, type: phy, ethernet_mac_address: "52:54:00:00:01:31"}
networks:
  - {id: pxe, type: ipv4_dhcp, link: enp1s0}
  - {id: v6, type: ipv6, link: enp1s0, ip_address: "fd00::5"}
  - {id: oam, type: ipv4, link: enp1s0, ip_address: 10.23.25.101, netmask: 255.255.255.0}
  - {id: storage, type: ipv4, link: enp1s0, ip_address: 10.23.26.101, netmask: 255.255.255.0}
services:
  - {type: dns, address: 8.8.8.8}
"""


def secret(name: str, *, string: str | None = None, data: str | None = None, namespace: str = "metal3") -> dict:
    out: dict = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}}
    if string is not None:
        out["stringData"] = {"networkData": string}
    if data is not None:
        out["data"] = {"networkData": data}
    return out


def host(name: str, network_data: str | None) -> BareMetalHost:
    return BareMetalHost(name=name, namespace="metal3", labels={}, network_data=network_data)


def test_first_static_ipv4_skips_dhcp_and_ipv6():
    parsed = network_data_from_secret(secret("n", string=NETWORK_DATA_YAML))
    assert first_ipv4(parsed) == "10.23.25.101"


def test_base64_json_data_and_prefix_notation():
    text = json.dumps({"networks": [{"id": "oam", "type": "ipv4", "ip_address": "192.0.2.7/24"}]})
    encoded = base64.b64encode(text.encode()).decode()
    h = host("r01-node-01", "r01-node-01-network-data")
    assert host_ipv4(h, [secret("r01-node-01-network-data", data=encoded)]) == "192.0.2.7"


def test_string_data_wins_over_data():
    encoded = base64.b64encode(b'{"networks": [{"type": "ipv4", "ip_address": "192.0.2.1"}]}').decode()
    both = secret("n", string=NETWORK_DATA_YAML, data=encoded)
    assert first_ipv4(network_data_from_secret(both)) == "10.23.25.101"


def test_addresses_of_several_hosts_sorted():
    secrets = [secret("b-nd", string="networks: [{type: ipv4, ip_address: 10.0.0.2}]"),
               secret("a-nd", string="networks: [{type: ipv4, ip_address: 10.0.0.1}]")]
    assert host_addresses([host("b", "b-nd"), host("a", "a-nd")], secrets) == {"metal3/a": "10.0.0.1",
                                                                             "metal3/b": "10.0.0.2"}


@pytest.mark.parametrize(("secrets", "network_data", "message"), [
    ([], "x-nd", "host metal3/x: network data secret metal3/x-nd not found"),
    ([secret("x-nd", namespace="other", string="networks: []")], "x-nd", "secret metal3/x-nd not found"),
    ([], None, "host metal3/x: spec.networkData names no secret"),
    ([secret("x-nd")], "x-nd", "host metal3/x, secret metal3/x-nd: has neither stringData.networkData nor data"),
    ([secret("x-nd", data="%%%")], "x-nd", "data.networkData is not base64 of UTF-8 text"),
    ([secret("x-nd", string="networks: [")], "x-nd", "networkData is neither JSON nor YAML"),
    ([secret("x-nd", string="- a list")], "x-nd", "must be a mapping"),
    ([secret("x-nd", string="links: []")], "x-nd", "network data has no 'networks' list"),
    ([secret("x-nd", string="networks: [{type: ipv4_dhcp}]")], "x-nd",
     "host metal3/x, secret metal3/x-nd: no networks[] entry of type ipv4 with a static ip_address"),
    ([secret("x-nd", string="networks: [{id: oam, type: ipv4, ip_address: fd00::1}]")], "x-nd",
     "networks[0] (oam) has type ipv4 but ip_address 'fd00::1' is not an IPv4 address"),
])
def test_clear_errors_name_the_host_and_secret(secrets, network_data, message):
    with pytest.raises(NetworkDataError) as err:
        host_ipv4(host("x", network_data), secrets)
    assert message in str(err.value)
