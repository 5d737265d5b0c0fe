"""Recorded state against what runs (#26): a state that does not know the live clusters is refused, never planned
over with new CAs. Pure: observed states built as `gitops.observe` reports a converged fleet (test_plan_diff);
the lab test in test_apply_lab.py runs the same against real control planes."""
from __future__ import annotations

import dataclasses

import pytest
from test_plan_diff import NOW, repo, settle  # noqa: F401 - fixture

from gitops.engine import make_plan
from gitops.pki import create_ca
from gitops.plan.recorded import StateMismatch, mismatches
from gitops.state import State


def _with_ca(observed, pem_for):
    """`observed` with each control-plane pod's files agent reporting `pem_for(pod)` as its ca.crt."""
    hvs = {}
    for name, hv in observed.hypervisors.items():
        pods = tuple(dataclasses.replace(p, files=dataclasses.replace(
            p.files, certificates={**p.files.certificates, "ca": pem_for(p)})) if p.files is not None else p
            for p in hv.pods)
        hvs[name] = dataclasses.replace(hv, pods=pods)
    return dataclasses.replace(observed, hypervisors=hvs)


def test_an_empty_state_over_live_clusters_is_refused_naming_them_and_the_way_back(repo):
    state, observed = settle(repo.model)
    with pytest.raises(StateMismatch) as refused:
        make_plan(repo.model, repo.repo.config, State(), observed, now=NOW)
    message = str(refused.value)
    assert "cluster team-a: no certificate authority recorded for it" in message
    assert "cluster team-b: no certificate authority recorded for it" in message
    assert "team-a-cp-1" in message and "gitops state pull" in message
    # the recorded state plans as before
    assert make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan.actions == ()


def test_a_node_whose_placement_is_not_recorded_is_refused(repo):
    state, observed = settle(repo.model)
    lost = state.copy()
    del lost.nodes["team-a-cp-2"]
    [found] = mismatches(lost, observed)
    assert found.cluster == "team-a" and "team-a-cp-2 run but their placement is not recorded" in found.why


def test_a_live_ca_that_is_not_the_recorded_one_is_refused_and_a_rotation_bundle_is_not(repo):
    state, observed = settle(repo.model)
    recorded = {name: c.authorities["cluster"].cert_pem for name, c in state.clusters.items()}
    assert mismatches(state, _with_ca(observed, lambda p: recorded[p.cluster])) == []
    foreign = create_ca("someone else's CA").cert_pem
    found = mismatches(state, _with_ca(observed, lambda p: foreign if p.node == "team-b-cp-1" else recorded[p.cluster]))
    assert [(m.cluster, m.why) for m in found] == [
        ("team-b", "the cluster CA on node(s) team-b-cp-1 (ca.crt) is not the recorded one")]
    # mid-rotation a node trusts the old and the new authority: it shares the recorded one
    assert mismatches(state, _with_ca(observed, lambda p: foreign + recorded[p.cluster])) == []
