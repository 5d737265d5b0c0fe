"""Scheduling and port allocation: stable, spread, pinned, exhaustion as a clear error."""
from __future__ import annotations

import dataclasses

import pytest
from repo_helpers import EXAMPLE_REPO

from gitops.compile.placement import PlacementError, place
from gitops.model.resources import Hypervisor, Node, PortRange
from gitops.model.validate import load_model
from gitops.state import State


@pytest.fixture(scope="module")
def model():
    return load_model(EXAMPLE_REPO)


def with_nodes(model, *nodes: Node, drop: tuple[str, ...] = ()):
    merged = {k: v for k, v in model.nodes.items() if k not in drop}
    merged.update({n.name: n for n in nodes})
    return dataclasses.replace(model, nodes=merged)


def test_roles_go_to_the_right_hypervisors_and_spread(model):
    state = place(model, State())
    for name, record in state.nodes.items():
        hv = model.hypervisors[record.hypervisor]
        assert hv.public == (model.nodes[name].role == "controlplane-ingress"), name
    for cluster in model.clusters:
        hvs = [r.hypervisor for n, r in state.nodes.items()
               if r.cluster == cluster and model.nodes[n].role != "controlplane-ingress"]
        assert sorted(set(hvs)) == ["hv-private-1", "hv-private-2"], hvs  # 3 nodes over both private ones


def test_ports_are_in_range_and_never_shared(model):
    state = place(model, State())
    seen: dict[tuple[str, int], str] = {}
    for name, record in state.nodes.items():
        hv = model.hypervisors[record.hypervisor]
        for purpose, port in record.ports.items():
            assert port in hv.port_range
            key = (hv.ip_address, port)
            assert key not in seen, f"{name}/{purpose} reuses {key} of {seen.get(key)}"
            seen[key] = f"{name}/{purpose}"
    assert set(state.nodes["team-a-cp-1"].ports) == {"etcd-client", "etcd-peer", "apiserver",
                                                       "controller-manager", "scheduler"}


def test_placement_is_stable_when_nodes_and_hypervisors_are_added(model):
    first = place(model, State())
    extra_hv = Hypervisor("hv-private-3", False, "127.0.10.4", PortRange(33000, 33999),
                          model.hypervisors["hv-private-1"].endpoint)
    grown = dataclasses.replace(model, hypervisors={**model.hypervisors, extra_hv.name: extra_hv})
    grown = with_nodes(grown, Node("team-a-cp-4", "team-a", "controlplane"))
    second = place(grown, first)
    for name, record in first.nodes.items():
        assert second.nodes[name] == record, name
    # the new node goes where team-a has the fewest nodes: the new, empty hypervisor
    assert second.nodes["team-a-cp-4"].hypervisor == "hv-private-3"


def test_removed_nodes_keep_their_ports_until_apply_drops_the_record(model):
    first = place(model, State())
    gone = first.nodes["team-a-cp-1"]
    shrunk = with_nodes(model, Node("team-c-cp-1", "team-a", "controlplane", hypervisor=gone.hypervisor),
                        drop=("team-a-cp-1",))
    second = place(shrunk, first)
    assert second.nodes["team-a-cp-1"] == gone
    assert not set(second.nodes["team-c-cp-1"].ports.values()) & set(gone.ports.values())


def test_pinning_moves_a_node_and_unreachable_hypervisors_get_no_new_nodes(model):
    first = place(model, State())
    current = first.nodes["team-b-cp-1"].hypervisor
    other = "hv-private-1" if current == "hv-private-2" else "hv-private-2"
    moved = place(with_nodes(model, Node("team-b-cp-1", "team-b", "controlplane", hypervisor=other)), first)
    assert moved.nodes["team-b-cp-1"].hypervisor == other
    fresh = place(with_nodes(model, Node("team-b-cp-9", "team-b", "controlplane")), first,
                  unavailable=["hv-private-1"])
    assert fresh.nodes["team-b-cp-9"].hypervisor == "hv-private-2"
    assert fresh.nodes["team-a-cp-1"] == first.nodes["team-a-cp-1"]  # kept where it is


def test_port_exhaustion_is_a_clear_plan_error(model):
    tiny = {name: dataclasses.replace(hv, port_range=PortRange(hv.port_range.low, hv.port_range.low + 6))
            for name, hv in model.hypervisors.items()}
    with pytest.raises(PlacementError) as err:
        place(dataclasses.replace(model, hypervisors=tiny), State())
    text = str(err.value)
    assert "has no free port left in 31000-31006" in text
    assert "widen spec.portRange or add a hypervisor" in text


def test_no_public_hypervisor_is_a_clear_plan_error(model):
    private_only = {n: hv for n, hv in model.hypervisors.items() if not hv.public}
    nodes = {n: dataclasses.replace(node, hypervisor=None) for n, node in model.nodes.items()}
    with pytest.raises(PlacementError, match="Node team-a-ingress .*no public hypervisor in the repo"):
        place(dataclasses.replace(model, hypervisors=private_only, nodes=nodes), State())


def test_a_cordoned_hypervisor_keeps_its_nodes_and_takes_no_new_one(model):
    """Issue #29.4: spec.cordoned keeps new nodes off a hypervisor; the nodes it holds stay."""
    first = place(model, State())
    on_one = sorted(n for n, r in first.nodes.items() if r.hypervisor == "hv-private-1")
    cordoned = dataclasses.replace(model.hypervisors["hv-private-1"], cordoned=True)
    fenced = dataclasses.replace(model, hypervisors={**model.hypervisors, cordoned.name: cordoned})
    grown = with_nodes(fenced, Node("team-a-cp-4", "team-a", "controlplane"), Node("team-a-cp-5", "team-a", "controlplane"))
    second = place(grown, first)
    assert sorted(n for n, r in second.nodes.items() if r.hypervisor == "hv-private-1") == on_one
    assert second.nodes["team-a-cp-4"].hypervisor == second.nodes["team-a-cp-5"].hypervisor == "hv-private-2"
    with pytest.raises(PlacementError, match="Node team-a-cp-4 is pinned to Hypervisor hv-private-1, which is "
                                             r"cordoned \(spec.cordoned\): no new node is placed there"):
        place(with_nodes(fenced, Node("team-a-cp-4", "team-a", "controlplane", "hv-private-1")), first)
    both = dataclasses.replace(model.hypervisors["hv-private-2"], cordoned=True)
    all_fenced = dataclasses.replace(fenced, hypervisors={**fenced.hypervisors, both.name: both})
    with pytest.raises(PlacementError, match=r"Node team-a-cp-4 \(role controplane|no private hypervisor in the "
                                             "repo that is not cordoned"):
        place(with_nodes(all_fenced, Node("team-a-cp-4", "team-a", "controlplane")), first)


def test_a_node_recorded_on_a_hypervisor_that_left_the_repo_is_an_error_never_a_silent_move(model):
    """Its pod and etcd data are on that machine: placed anew, it would start empty under the same name."""
    first = place(model, State())
    moved = sorted(n for n, r in first.nodes.items() if r.hypervisor == "hv-private-2")
    gone = dataclasses.replace(model, hypervisors={k: v for k, v in model.hypervisors.items() if k != "hv-private-2"})
    with pytest.raises(PlacementError) as err:
        place(gone, first)
    for name in moved:
        assert (f"Node {name} is recorded on Hypervisor hv-private-2, which left the repo: its pod and data are "
                "there, and placing it anew would start it empty under the same name. Put Hypervisor hv-private-2 "
                "back in the repo: with spec.drain: true its nodes move off it (then it can leave), or, if the "
                "machine is gone for good, with spec.lost: true") in str(err.value)


def test_a_clusters_ingress_nodes_sit_on_distinct_public_hypervisors(model):
    """issue #44.1: a second ingress node goes to another public hypervisor even where the first one holds
    fewer nodes overall, and with no other public hypervisor open it is a plan error naming the cluster."""
    public_2 = dataclasses.replace(model.hypervisors["hv-public-1"], name="hv-public-2", ip_address="127.0.10.9",
                                   port_range=PortRange(39000, 39999))
    grown = dataclasses.replace(model, hypervisors={**model.hypervisors, public_2.name: public_2})
    # team-b's ingress on hv-public-2 first: hv-public-1 then holds fewer nodes overall than hv-public-2
    grown = with_nodes(grown, Node("team-b-ingress", "team-b", "controlplane-ingress", "hv-public-2"),
                       Node("team-b-ingress-2", "team-b", "controlplane-ingress"))
    state = place(grown, State())
    ingress = {n: r.hypervisor for n, r in state.nodes.items() if r.cluster == "team-b" and "ingress" in n}
    assert ingress == {"team-b-ingress": "hv-public-2", "team-b-ingress-2": "hv-public-1"}, ingress
    # a third has nowhere to go apart from the other two
    third = with_nodes(grown, Node("team-b-ingress-3", "team-b", "controlplane-ingress"))
    with pytest.raises(PlacementError, match="team-b-ingress-3 .*already holds an ingress node of cluster team-b"):
        place(third, state)
    # a cordoned public hypervisor is no way out either; the recorded ones stay where they are
    cordoned = dataclasses.replace(grown, hypervisors={**grown.hypervisors,
                                                       "hv-public-1": dataclasses.replace(
                                                           grown.hypervisors["hv-public-1"], cordoned=True)})
    assert place(cordoned, state).nodes == state.nodes


def test_a_node_with_a_pinned_port_goes_where_the_hypervisors_range_holds_it(model):
    """The SIP load balancer's pinned port 30443 is only in hv-public-1's range: an emptier public hypervisor
    whose range does not hold it is passed over (the demo's lab met this once ingress nodes spread)."""
    public_2 = dataclasses.replace(model.hypervisors["hv-public-1"], name="hv-public-2", ip_address="127.0.10.9",
                                   port_range=PortRange(39000, 39999))
    grown = dataclasses.replace(model, hypervisors={**model.hypervisors, public_2.name: public_2})
    # hv-public-2 holds one node (team-a-ingress-2), hv-public-1 two: the emptier one does not hold 30443
    grown = with_nodes(grown, Node("team-a-ingress-2", "team-a", "controlplane-ingress"))
    state = place(grown, State(), fixed={"tenant-1-lb": ("loadbalancer", 30443)})
    assert "tenant-1-lb" not in state.nodes  # (not a Node of this model: the pin alone must not break anything)
    lb = Node("tenant-1-lb", "tenant-1", "sip-loadbalancer")
    with_lb = with_nodes(grown, lb)
    state = place(with_lb, State(), fixed={"tenant-1-lb": ("loadbalancer", 30443)})
    assert state.nodes["tenant-1-lb"].hypervisor == "hv-public-1"
    assert state.nodes["tenant-1-lb"].ports == {"loadbalancer": 30443}
    narrow = dataclasses.replace(with_lb, hypervisors={k: v for k, v in with_lb.hypervisors.items()
                                                       if k != "hv-public-1"})
    with pytest.raises(PlacementError, match="must have port 30443, and no open public hypervisor's"):
        place(with_nodes(narrow, drop=("team-a-ingress", "team-b-ingress", "team-a-ingress-2")), State(),
              fixed={"tenant-1-lb": ("loadbalancer", 30443)})
