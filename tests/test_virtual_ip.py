"""A cluster with two or more ingress nodes gets a virtual IP (issue #44.1): allocated from gitops.yaml's pool
or pinned, recorded and kept like ports, unique in the fleet with its VRRP router id; its endpoint, its API
serving certificate and its ingress pods (haproxy on the address, keepalived beside it) use it. Pure: the
repo's model and the compiler."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from repo_helpers import EXAMPLE_REPO

from gitops.compile import compile_desired
from gitops.compile.placement import PlacementError
from gitops.model.config import IngressConfig
from gitops.model.resources import Node
from gitops.model.validate import load_model, validate_repo
from gitops.state import State


@pytest.fixture(scope="module")
def model():
    """The example repo with a second public hypervisor, and two ingress nodes for team-a and team-b."""
    base = load_model(EXAMPLE_REPO)
    public_2 = dataclasses.replace(base.hypervisors["hv-public-1"], name="hv-public-2", ip_address="127.0.10.9")
    nodes = {**base.nodes, "team-a-ingress-2": Node("team-a-ingress-2", "team-a", "controlplane-ingress"),
             "team-b-ingress-2": Node("team-b-ingress-2", "team-b", "controlplane-ingress")}
    return dataclasses.replace(base, hypervisors={**base.hypervisors, "hv-public-2": public_2}, nodes=nodes,
                               ingress=IngressConfig(("127.0.10.200-127.0.10.201", "127.0.11.0/30")))


def _with(model, **changes):
    return dataclasses.replace(model, **changes)


def test_clusters_with_two_ingress_nodes_take_the_lowest_free_addresses_and_keep_them(model):
    state = compile_desired(model, State()).state
    assert [(state.clusters[c].virtual_ip, state.clusters[c].vrrp_id) for c in ("team-a", "team-b")] == \
        [("127.0.10.200", 1), ("127.0.10.201", 2)]
    # kept from one plan to the next, whatever the pool's order becomes
    reordered = _with(model, ingress=IngressConfig(("127.0.11.0/30", "127.0.10.200-127.0.10.201")))
    again = compile_desired(reordered, state).state
    assert again.clusters == state.clusters
    # team-a back to one ingress node: its address and router id are given back, its endpoint is its node's
    single = _with(model, nodes={k: v for k, v in model.nodes.items() if k != "team-a-ingress-2"})
    compiled = compile_desired(single, state)
    assert (compiled.state.clusters["team-a"].virtual_ip, compiled.state.clusters["team-a"].vrrp_id) == ("", 0)
    ingress = compiled.state.nodes["team-a-ingress"]
    hv = model.hypervisors[ingress.hypervisor]
    assert compiled.desired.clusters["team-a"].api_endpoint == f"https://{hv.ip_address}:{ingress.ports['apiserver']}"
    assert set(ingress.ports) == {"apiserver"}  # the health check's port is given back too
    # a third cluster then takes the lowest free address, in the second entry once the first is full
    assert compiled.state.clusters["team-b"].virtual_ip == "127.0.10.201"


def test_a_pin_wins_and_a_recorded_address_outside_the_pool_is_replaced(model):
    pinned = _with(model, clusters={**model.clusters,
                                    "team-b": dataclasses.replace(model.clusters["team-b"], virtual_ip="127.0.10.200")})
    state = compile_desired(pinned, State()).state
    assert state.clusters["team-b"].virtual_ip == "127.0.10.200"
    assert state.clusters["team-a"].virtual_ip == "127.0.10.201"  # the pin is not handed out from the pool
    # a status branch is someone else's input: a recorded address that is not the pool's is not trusted
    forged = state.copy()
    forged.clusters["team-a"].virtual_ip = "10.1.2.3"
    forged.clusters["team-a"].vrrp_id = forged.clusters["team-b"].vrrp_id
    fixed = compile_desired(pinned, forged).state
    assert fixed.clusters["team-a"].virtual_ip == "127.0.10.201"
    assert fixed.clusters["team-a"].vrrp_id != fixed.clusters["team-b"].vrrp_id


def test_an_exhausted_pool_is_a_plan_error_naming_the_cluster(model):
    small = _with(model, ingress=IngressConfig(("127.0.10.200",)))
    with pytest.raises(PlacementError, match="Cluster team-b has two or more ingress nodes and needs a virtual IP"):
        compile_desired(small, State())


def test_the_endpoint_certificate_and_ingress_pods_use_the_virtual_ip(model):
    compiled = compile_desired(model, State())
    desired = compiled.desired
    assert desired.clusters["team-a"].api_endpoint == "https://127.0.10.200:6443"
    cluster_info = next(o for o in desired.clusters["team-a"].objects if o.name == "cluster-info")
    assert "https://127.0.10.200:6443" in cluster_info.body
    apiserver = next(c for c in desired.pods["team-a-cp-1"].certificates if c.name == "apiserver")
    assert "127.0.10.200" in apiserver.ip_addresses
    hvs = {n: compiled.state.nodes[n].hypervisor for n in ("team-a-ingress", "team-a-ingress-2")}
    assert sorted(hvs.values()) == ["hv-public-1", "hv-public-2"]
    for name, hv_name in hvs.items():
        pod = desired.pods[name]
        hv, ports = model.hypervisors[hv_name], compiled.state.nodes[name].ports
        files = {f.name: f.content for f in pod.files}
        haproxy, keepalived = files["haproxy.cfg"], files["keepalived.conf"]
        assert f"bind {hv.ip_address}:{ports['apiserver']}\n" in haproxy
        assert "bind 127.0.10.200:6443 transparent\n" in haproxy
        assert f"bind {hv.ip_address}:{ports['ingress-check']}\n" in haproxy and "monitor-uri /healthz" in haproxy
        other = next(model.hypervisors[h].ip_address for n, h in hvs.items() if n != name)
        assert f"unicast_src_ip {hv.ip_address}\n" in keepalived
        assert f"unicast_peer {{\n    {other}\n  }}" in keepalived
        assert "virtual_router_id 1\n" in keepalived and "127.0.10.200/32 dev eth0" in keepalived
        assert f"http://{hv.ip_address}:{ports['ingress-check']}/healthz" in keepalived
        containers = {c.spec.name: c.spec for c in pod.containers}
        assert containers["keepalived"].capabilities == ("NET_ADMIN", "NET_RAW", "NET_BROADCAST")
        assert containers["haproxy"].capabilities == ("NET_ADMIN",)
    single = desired.pods["team-a-cp-1"]
    assert "keepalived" not in {c.spec.name for c in single.containers}


def test_validation_refuses_a_pool_that_overlaps_a_hypervisor_or_another_entry(tmp_path: Path):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPO, repo)
    config = repo / "gitops.yaml"
    example_pool = "    virtualIPs: [127.0.10.200-127.0.10.219]\n"
    config.write_text(config.read_text().replace(example_pool, "    virtualIPs:\n      - 127.0.10.0/29\n"
                                                               "      - 127.0.10.5-127.0.10.20\n      - nonsense\n"))
    errors = [str(d) for d in validate_repo(repo).diagnostics]
    assert any("spec.ingress.virtualIPs[0]: '127.0.10.0/29' holds 127.0.10.1, Hypervisor hv-public-1's address" in e
               for e in errors), errors
    assert any("spec.ingress.virtualIPs[1]: '127.0.10.5-127.0.10.20' overlaps virtualIPs[0]" in e for e in errors)
    assert any("spec.ingress.virtualIPs[2]: 'nonsense' is not an address, a CIDR or a FIRST-LAST range" in e
               for e in errors), errors
    # a pinned address that is a hypervisor's, and one pinned twice
    config.write_text(config.read_text().replace("      - 127.0.10.0/29\n      - 127.0.10.5-127.0.10.20\n"
                                                 "      - nonsense\n", "      - 127.0.12.0/29\n"))

    def pin(team: str, address: str) -> None:
        cluster = repo / "clusters" / team / "cluster.yaml"
        cluster.write_text(cluster.read_text().replace("  apiServer:\n", f"  apiServer:\n    virtualIP: {address}\n", 1))

    pin("team-a", "127.0.10.1")
    errors = [str(d) for d in validate_repo(repo).diagnostics]
    assert [e for e in errors if "virtualIP" in e] == [
        "clusters/team-a/cluster.yaml:11: Cluster/team-a: spec.apiServer.virtualIP: 127.0.10.1 is Hypervisor "
        "hv-public-1's address"], errors
    shutil.copy(EXAMPLE_REPO / "clusters/team-a/cluster.yaml", repo / "clusters/team-a/cluster.yaml")
    pin("team-a", "127.0.13.5")
    pin("team-b", "127.0.13.5")
    errors = [str(d) for d in validate_repo(repo).diagnostics]
    assert [e for e in errors if "virtualIP" in e] == [
        "clusters/team-b/cluster.yaml:11: Cluster/team-b: spec.apiServer.virtualIP: 127.0.13.5 is Cluster team-a's "
        "virtual IP already"], errors


def test_the_plan_says_when_an_endpoint_moves_and_which_clients_to_move(model):
    """issue #44.3: a live single-ingress cluster given a second ingress node moves to the virtual IP; the
    note names the old and new endpoints and the clients gitops does not write; back to one ingress node, the
    note says the virtual IP stops answering; a cluster's first endpoint is no move."""
    from gitops.plan.endpoints import endpoint_notes

    single = _with(model, nodes={k: v for k, v in model.nodes.items() if k not in ("team-a-ingress-2",
                                                                                    "team-b-ingress-2")})
    first = compile_desired(single, State()).state
    assert endpoint_notes(single, State(), first) == []
    record = first.nodes["team-a-ingress"]
    old = f"https://{model.hypervisors[record.hypervisor].ip_address}:{record.ports['apiserver']}"
    grown = compile_desired(model, first).state
    notes = endpoint_notes(model, first, grown)
    assert len(notes) == 2 and notes[0].startswith(
        f"Cluster team-a's API endpoint moves from {old} to https://127.0.10.200:6443: ")
    assert "workers joined before" in notes[0] and notes[0].endswith("keeps answering while the ingress node "
                                                                     "behind it stays.")
    back = compile_desired(single, grown).state
    notes = endpoint_notes(single, grown, back)
    assert notes[0].startswith(f"Cluster team-a's API endpoint moves from https://127.0.10.200:6443 to {old}")
    assert notes[0].endswith("The old virtual IP stops answering once keepalived leaves the ingress pods.")
