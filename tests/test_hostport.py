"""IPv6 hypervisor addresses in every URL and `host:port` gitops writes: in brackets (RFC 3986)."""
from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from repo_helpers import EXAMPLE_REPO

from gitops.compile import compile_desired
from gitops.hostport import host_port, url_host
from gitops.model.config import IngressConfig
from gitops.model.validate import load_model
from gitops.state import State


def test_an_ipv6_address_is_bracketed_and_any_other_is_not():
    assert (url_host("fd00::1"), url_host("10.0.0.1"), url_host("cp.example.com")) == ("[fd00::1]", "10.0.0.1",
                                                                                       "cp.example.com")
    assert (host_port("fd00::1", 6443), host_port("10.0.0.1", "6443")) == ("[fd00::1]:6443", "10.0.0.1:6443")


def test_a_fleet_on_ipv6_gets_urls_that_parse_to_its_addresses():
    base = load_model(EXAMPLE_REPO)
    hvs = {name: dataclasses.replace(hv, ip_address=f"fd00::{i + 1}")
           for i, (name, hv) in enumerate(sorted(base.hypervisors.items()))}
    model = dataclasses.replace(base, hypervisors=hvs, sip_clusters={}, ingress=IngressConfig(("fd00::200-fd00::219",)))
    compiled = compile_desired(model, State())
    addresses = {hv.ip_address for hv in hvs.values()} | {"fd00::200", "fd00::201"}  # and the clusters' virtual IPs
    urls = []
    for cluster in compiled.desired.clusters.values():
        urls.append(cluster.api_endpoint)
        urls += [u for m in cluster.etcd_members for u in (m.peer_url, m.client_url)]
    assert len(urls) > 6
    for url in urls:
        parts = urlsplit(url)
        assert parts.scheme == "https" and parts.hostname in addresses and parts.port, url
    haproxy = next(f.content for f in compiled.desired.pods["team-a-ingress"].files if f.name == "haproxy.cfg")
    ingress_hv = hvs[compiled.state.nodes["team-a-ingress"].hypervisor].ip_address
    assert f"  bind [{ingress_hv}]:" in haproxy
    assert all(f" [{a}]:" in haproxy or a not in haproxy for a in addresses)
