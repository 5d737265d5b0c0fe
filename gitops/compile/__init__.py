"""Desired-state compilation: repo model + recorded state in, desired state out.

`compile_desired` is deterministic for a given recorded state: everything
random (CA keys, port choices) is generated once, returned in the new state,
and reused from then on. It performs no I/O. Its stages, one after another:
the SIP services' pseudo-nodes (`sip_services`), placement and etcd flags
(`placement`), authorities (`authorities`), virtual IPs (`vip`), each
cluster's pods (`clusters`), the SIP services' pods.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from gitops.compile import vip
from gitops.compile.authorities import ensure_authorities, ensure_service_authority
from gitops.compile.clusters import compile_clusters
from gitops.compile.desired import DesiredState
from gitops.compile.placement import PlacementError, freeze_etcd_flags, place
from gitops.compile.sip_services import (
    pinned_ports,
    resolve_issuers,
    runs_provider,
    service_cluster,
    service_nodes,
    service_pods,
)
from gitops.model.resources import ApiServerOIDC, BareMetalHost, RepoModel
from gitops.state.records import State

__all__ = ["Compiled", "PlacementError", "compile_desired"]


@dataclass(frozen=True)
class Compiled:
    desired: DesiredState
    #: the recorded state with new placements, authorities and etcd bootstrap flags
    state: State
    #: nodes left out for now (only unreachable hypervisors could take them)
    deferred: tuple[str, ...] = ()
    #: the OIDC issuer each cluster that trusts one trusts, with a SIPCluster's provider resolved
    oidc: dict[str, ApiServerOIDC] = dataclasses.field(default_factory=dict)


def compile_desired(model: RepoModel, state: State, *, now: dt.datetime | None = None,
                    unavailable: Iterable[str] = (), hosts: Iterable[BareMetalHost] = ()) -> Compiled:
    """`hosts`: the BareMetalHosts with the labels they have once the plan's label changes are made
    (SIP load balancers point at the hosts labeled for them)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    deferred: list[str] = []
    services, fixed = service_nodes(model), pinned_ports(model)
    placement_model = dataclasses.replace(model, nodes={**model.nodes, **services}) if services else model
    new = place(placement_model, state, unavailable, deferred, fixed=fixed)
    freeze_etcd_flags(model, new)
    for name, cluster in model.clusters.items():
        new.clusters[name] = ensure_authorities(cluster, new.clusters.get(name), now)
    for served in (service_cluster(name) for name, sip in model.sip_clusters.items() if runs_provider(sip)):
        new.clusters[served] = ensure_service_authority(served, new.clusters.get(served), now)
    if any(c.oidc is not None and c.oidc.sip_cluster for c in model.clusters.values()):
        model = resolve_issuers(model, new, deferred)
    placed_in = {r.cluster for r in new.nodes.values()}
    for name in [n for n in new.clusters if n not in model.clusters and n not in placed_in]:
        del new.clusters[name]  # left the repo and its last pod is gone
    vip.allocate(model, new)
    pods, clusters = compile_clusters(model, new)
    if services:
        placed = {n: (model.hypervisors[new.nodes[n].hypervisor], new.nodes[n]) for n in services if n in new.nodes}
        pods.update(service_pods(model, placed, hosts, deferred))
    return Compiled(desired=DesiredState(pods=dict(sorted(pods.items())), clusters=clusters), state=new,
                    deferred=tuple(deferred),
                    oidc={n: c.oidc for n, c in sorted(model.clusters.items()) if c.oidc is not None})


