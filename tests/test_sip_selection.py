"""Host selection for SIPClusters over the example inventory (pure, no I/O beyond loading the repo).

The shipped tenant-1 fits the example's two racks (see the first test). The other scenarios
ask for more (ControlPlane 2 active + 1 standby PerRack, Worker 3 + 1 PerHost), which two racks
cannot give, and add hosts with `dataclasses.replace` where they need them.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gitops.model.resources import BareMetalHost, LabelRequirement, LabelSelector, SIPCluster, SIPRole
from gitops.model.validate import load_model
from gitops.sip.selection import (
    CLUSTER_LABEL,
    INSUFFICIENT_HOSTS,
    MANAGED_LABELS,
    NODE_TYPE_LABEL,
    RACK_LABEL,
    SCHEDULED_LABEL,
    SERVER_LABEL,
    STANDBY_LABEL,
    HostSelection,
    host_key,
    select_hosts,
)

EXAMPLE_REPO = Path(__file__).resolve().parents[1] / "example-repo"
CP, W = "ControlPlane", "Worker"


def demanding(shipped):
    """tenant-1 wanting ControlPlane 2+1 and Worker 3+1."""
    tenant = shipped.sip_clusters["tenant-1"]
    roles = {CP: replace(tenant.roles[CP], active=2, standby=1), W: replace(tenant.roles[W], active=3, standby=1)}
    return replace(shipped, sip_clusters={"tenant-1": replace(tenant, roles=roles)})


@pytest.fixture(scope="module")
def model():
    return demanding(load_model(EXAMPLE_REPO))


def test_shipped_example_is_satisfied():
    shipped = load_model(EXAMPLE_REPO)
    result = select_hosts(shipped.sip_clusters, shipped.baremetal_hosts.values())
    selection = result.selection("tenant-1")
    assert selection.ready
    assert selection.role(CP).active == ("metal3/r01-node-01",) and selection.role(CP).standby == ("metal3/r02-node-01",)
    assert selection.role(W).active == ("metal3/r01-node-02", "metal3/r02-node-02")
    assert selection.role(W).standby == ("metal3/r02-node-03",)
    assert len(result.changes) == 5


def hosts_of(model) -> dict[str, BareMetalHost]:
    return dict(model.baremetal_hosts)


def add(hosts: dict[str, BareMetalHost], name: str, rack: str | None, flavor: str, **changes) -> None:
    """A new healthy, available host cloned from r01-node-01."""
    labels = {SERVER_LABEL: name, "vino.airshipit.org/flavor": flavor} | ({RACK_LABEL: rack} if rack else {})
    base = hosts["metal3/r01-node-01"]
    host = replace(base, name=name, labels=labels, network_data=f"{name}-network-data", **changes)
    hosts[host_key(host)] = host


def satisfiable(model) -> dict[str, BareMetalHost]:
    """The example plus a third rack: one control-plane and one worker host in r03."""
    hosts = hosts_of(model)
    add(hosts, "r03-node-01", "r03", "control-plane")
    add(hosts, "r03-node-02", "r03", "worker")
    return hosts


def applied(hosts: dict[str, BareMetalHost], result: HostSelection) -> dict[str, BareMetalHost]:
    """`hosts` with the plan's label changes applied (what a provider would do)."""
    out = dict(hosts)
    for change in result.changes:
        out[change.host] = replace(out[change.host], labels=change.apply(out[change.host].labels))
    return out


def converged(model, hosts, clusters=None):
    clusters = model.sip_clusters if clusters is None else clusters
    hosts = applied(hosts, select_hosts(clusters, hosts.values()))
    assert select_hosts(clusters, hosts.values()).empty
    return hosts


def change_of(result: HostSelection, host: str):
    found = [c for c in result.changes if c.host == f"metal3/{host}"]
    assert found, f"no change for {host}: {result.changes}"
    return found[0]


def test_example_as_shipped_is_short_and_nothing_is_labeled(model):
    result = select_hosts(model.sip_clusters, model.baremetal_hosts.values())
    sel = result.selection("tenant-1")
    assert not sel.ready and sel.condition.reason == INSUFFICIENT_HOSTS
    message = sel.condition.message
    assert "ControlPlane needs 3 hosts (2 active + 1 standby, PerRack) but only 2 are usable, 1 missing" in message
    assert "metal3/r01-node-05 (operationalStatus is 'error')" in message
    assert "metal3/r02-node-04 (rack r02 already has a ControlPlane host)" in message
    assert "Worker needs 4 hosts" in message and "metal3/r01-node-03 (provisioning state is 'provisioned')" in message
    assert "metal3/r02-node-05 (offline)" in message
    assert result.changes == ()


def test_one_short_role_means_nothing_for_the_whole_cluster(model):
    hosts = hosts_of(model)
    add(hosts, "r03-node-02", "r03", "worker")  # Worker now fits, ControlPlane still does not
    result = select_hosts(model.sip_clusters, hosts.values())
    message = result.selection("tenant-1").condition.message
    assert "ControlPlane needs 3" in message and "Worker" not in message
    assert result.empty


def test_per_rack_and_per_host_spread_with_standby(model):
    hosts = satisfiable(model)
    result = select_hosts(model.sip_clusters, hosts.values())
    sel = result.selection("tenant-1")
    assert sel.ready, sel.condition.message
    cp, w = sel.role(CP), sel.role(W)
    assert cp.active == ("metal3/r01-node-01", "metal3/r02-node-01") and cp.standby == ("metal3/r03-node-01",)
    assert len({hosts[k].labels[RACK_LABEL] for k in cp.hosts}) == 3  # PerRack
    # PerHost: distinct hosts, filled in (rack, server, name) order; the GPU host is excluded
    assert w.active == ("metal3/r01-node-02", "metal3/r02-node-02", "metal3/r02-node-03")
    assert w.standby == ("metal3/r03-node-02",)
    assert sel.condition.message == "ControlPlane 2 active + 1 standby, Worker 3 active + 1 standby"

    assert [c.host for c in result.changes] == sorted(c.host for c in result.changes)
    active = change_of(result, "r01-node-01")
    assert dict(active.set) == {CLUSTER_LABEL: "tenant-1", NODE_TYPE_LABEL: CP, SCHEDULED_LABEL: "true"}
    assert active.remove == () and active.reason == "tenant-1/ControlPlane: selected as active"
    standby = change_of(result, "r03-node-02")
    assert dict(standby.set)[STANDBY_LABEL] == "true" and standby.reason == "tenant-1/Worker: selected as standby"


def test_planning_is_deterministic_and_applying_twice_changes_nothing(model):
    hosts = satisfiable(model)
    first = select_hosts(model.sip_clusters, hosts.values())
    assert select_hosts(model.sip_clusters, reversed(list(hosts.values()))) == first
    after = applied(hosts, first)
    again = select_hosts(model.sip_clusters, after.values())
    assert again.empty and again.selections == first.selections
    assert json.loads(json.dumps(first.to_dict())) == first.to_dict()
    assert first.to_dict()["selections"][0]["roles"]["Worker"]["standby"] == ["metal3/r03-node-02"]


def test_per_host_never_puts_two_hosts_of_a_role_on_one_server(model):
    hosts = satisfiable(model)
    twin = hosts["metal3/r02-node-02"]
    hosts["metal3/r02-node-02"] = replace(twin, labels=twin.labels | {SERVER_LABEL: "r01-node-02"})
    result = select_hosts(model.sip_clusters, hosts.values())
    message = result.selection("tenant-1").condition.message
    assert "metal3/r02-node-02 (server r01-node-02 already has a Worker host)" in message
    assert result.empty


def test_per_rack_needs_a_rack_label(model):
    hosts = satisfiable(model)
    add(hosts, "loose-01", None, "control-plane")
    hosts["metal3/r03-node-01"] = replace(hosts["metal3/r03-node-01"], operational_status="discovered")
    result = select_hosts(model.sip_clusters, hosts.values())
    assert f"metal3/loose-01 (no {RACK_LABEL} label (PerRack))" in result.selection("tenant-1").condition.message


def test_control_plane_and_workers_of_one_cluster_may_share_a_rack(model):
    sel = select_hosts(model.sip_clusters, satisfiable(model).values()).selection("tenant-1")
    cp_racks = {k.split("/")[1][:3] for k in sel.role(CP).hosts}
    w_racks = {k.split("/")[1][:3] for k in sel.role(W).hosts}
    assert cp_racks & w_racks == {"r01", "r02", "r03"}


@pytest.mark.parametrize(("requirement", "expected"), [
    (LabelRequirement("hardware.example.com/gpu", "In", ("a100", "h100")), ("metal3/r01-node-04",)),
    (LabelRequirement("hardware.example.com/gpu", "Exists"), ("metal3/r01-node-04",)),
    (LabelRequirement(SERVER_LABEL, "NotIn", ("r01-node-02", "r02-node-02")), ("metal3/r01-node-04",)),
])
def test_selectors_with_match_expressions(model, requirement, expected):
    selector = LabelSelector(match_labels=(("vino.airshipit.org/flavor", "worker"),),
                             match_expressions=(requirement,))
    gpu = SIPCluster("gpu", {W: SIPRole(active=1, standby=0, selector=selector, spread="PerHost")})
    result = select_hosts({"gpu": gpu}, model.baremetal_hosts.values())
    assert result.selection("gpu").role(W).active == expected


def test_selectors_do_not_see_the_managed_labels(model):
    hosts = converged(model, satisfiable(model))
    # tenant-1's own labels must not make its hosts stop matching a DoesNotExist on them
    cluster = model.sip_clusters["tenant-1"]
    cp = cluster.roles[CP]
    guarded = replace(cp, selector=replace(cp.selector, match_expressions=(
        LabelRequirement(CLUSTER_LABEL, "DoesNotExist"),)))
    clusters = {"tenant-1": replace(cluster, roles=cluster.roles | {CP: guarded})}
    assert select_hosts(clusters, hosts.values()).empty


def test_stable_when_a_new_host_appears(model):
    hosts = converged(model, satisfiable(model))
    before = select_hosts(model.sip_clusters, hosts.values()).selections
    # sorts before every existing host and rack, fits both roles' selectors
    add(hosts, "r00-node-01", "r00", "control-plane")
    add(hosts, "r00-node-02", "r00", "worker")
    result = select_hosts(model.sip_clusters, hosts.values())
    assert result.empty and result.selections == before


def test_a_provisioned_host_of_ours_is_kept(model):
    hosts = converged(model, satisfiable(model))
    hosts["metal3/r01-node-01"] = replace(hosts["metal3/r01-node-01"], provisioning_state="provisioned")
    assert select_hosts(model.sip_clusters, hosts.values()).empty


def test_an_unhealthy_active_host_is_replaced_by_its_standby(model):
    hosts = satisfiable(model)
    add(hosts, "r04-node-01", "r04", "control-plane")
    hosts = converged(model, hosts)
    assert STANDBY_LABEL in hosts["metal3/r03-node-01"].labels
    assert CLUSTER_LABEL not in hosts["metal3/r04-node-01"].labels  # not needed yet

    hosts["metal3/r01-node-01"] = replace(hosts["metal3/r01-node-01"], operational_status="error")
    result = select_hosts(model.sip_clusters, hosts.values())
    cp = result.selection("tenant-1").role(CP)
    assert cp.active == ("metal3/r02-node-01", "metal3/r03-node-01") and cp.standby == ("metal3/r04-node-01",)
    assert [c.host for c in result.changes] == ["metal3/r01-node-01", "metal3/r03-node-01", "metal3/r04-node-01"]
    dropped = change_of(result, "r01-node-01")
    assert dropped.remove == tuple(sorted((CLUSTER_LABEL, NODE_TYPE_LABEL, SCHEDULED_LABEL)))
    assert dropped.reason == "tenant-1/ControlPlane: released: operationalStatus is 'error'"
    promoted = change_of(result, "r03-node-01")
    assert promoted.remove == (STANDBY_LABEL,) and promoted.set == ()
    assert promoted.reason == "tenant-1/ControlPlane: standby promoted to active"
    assert change_of(result, "r04-node-01").reason == "tenant-1/ControlPlane: selected as standby"
    assert select_hosts(model.sip_clusters, applied(hosts, result).values()).empty


def test_an_unhealthy_host_without_a_replacement_changes_nothing(model):
    hosts = converged(model, satisfiable(model))
    hosts["metal3/r01-node-01"] = replace(hosts["metal3/r01-node-01"], online=False)
    result = select_hosts(model.sip_clusters, hosts.values())
    sel = result.selection("tenant-1")
    assert not sel.ready and "metal3/r01-node-01 (offline)" in sel.condition.message
    assert result.empty  # the running cluster keeps its labels, the condition says what is missing
    assert sel.role(CP).active == ("metal3/r01-node-01", "metal3/r02-node-01")  # as labeled now


def test_fewer_wanted_demotes_then_releases(model):
    hosts = converged(model, satisfiable(model))
    cluster = model.sip_clusters["tenant-1"]
    smaller = replace(cluster, roles=cluster.roles | {W: replace(cluster.roles[W], active=2)})
    result = select_hosts({"tenant-1": smaller}, hosts.values())
    assert change_of(result, "r02-node-03").reason == "tenant-1/Worker: active moved to standby"
    assert change_of(result, "r03-node-02").reason == "tenant-1/Worker: released: Worker wants only 3"


def test_removing_the_sip_cluster_unlabels_all_its_hosts(model):
    hosts = converged(model, satisfiable(model))
    ours = sorted(k for k, h in hosts.items() if h.labels.get(CLUSTER_LABEL) == "tenant-1")
    assert len(ours) == 7
    result = select_hosts({}, hosts.values())
    assert [c.host for c in result.changes] == ours
    for change in result.changes:
        assert change.set == () and set(change.remove) <= set(MANAGED_LABELS)
        assert change.reason == "SIPCluster tenant-1 is no longer in the repo" and change.cluster == "tenant-1"
    after = applied(hosts, result)
    assert after == satisfiable(model)  # back to the files' labels
    assert select_hosts({}, after.values()).empty


def test_clusters_are_served_in_name_order(model):
    hosts = satisfiable(model)
    clusters = {"tenant-1": model.sip_clusters["tenant-1"],
                "tenant-0": replace(model.sip_clusters["tenant-1"], name="tenant-0")}
    result = select_hosts(clusters, hosts.values())
    assert result.selection("tenant-0").ready
    late = result.selection("tenant-1")
    assert not late.ready and "assigned to SIPCluster tenant-0" in late.condition.message
    assert {c.cluster for c in result.changes} == {"tenant-0"}


def test_a_host_released_by_a_later_cluster_serves_an_earlier_one_in_the_same_plan(model):
    one_worker = {"vino.airshipit.org/flavor": "worker"}

    def role(**match: str) -> SIPRole:
        return SIPRole(1, 0, LabelSelector(match_labels=tuple(sorted(match.items()))), "PerHost")

    hosts = hosts_of(model)
    # "b" holds r01-node-02, then its selector moves to the GPU host; "a" wants exactly r01-node-02
    b_before = {"b": SIPCluster("b", {W: role(**one_worker)})}
    hosts = converged(model, hosts, b_before)
    assert hosts["metal3/r01-node-02"].labels[CLUSTER_LABEL] == "b"
    clusters = {
        "a": SIPCluster("a", {W: role(**{SERVER_LABEL: "r01-node-02"})}),
        "b": SIPCluster("b", {W: role(**{"hardware.example.com/gpu": "a100"})}),
    }
    result = select_hosts(clusters, hosts.values())
    assert result.selection("a").role(W).active == ("metal3/r01-node-02",)
    assert result.selection("b").role(W).active == ("metal3/r01-node-04",)
    moved = change_of(result, "r01-node-02")
    assert moved.cluster == "a" and dict(moved.set) == {CLUSTER_LABEL: "a"}
    assert select_hosts(clusters, applied(hosts, result).values()).empty


def test_hosts_scheduled_by_someone_else_are_left_alone(model):
    hosts = satisfiable(model)
    foreign = hosts["metal3/r03-node-01"]
    hosts["metal3/r03-node-01"] = replace(foreign, labels=foreign.labels | {SCHEDULED_LABEL: "true"})
    result = select_hosts(model.sip_clusters, hosts.values())
    assert f"metal3/r03-node-01 ({SCHEDULED_LABEL} is set without a cluster name)" in \
        result.selection("tenant-1").condition.message
    assert result.empty
