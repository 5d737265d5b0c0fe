"""An unreachable hypervisor on the status branch (issue #13): what could not be observed is `Unknown`,
never `Ready` or `Failed`, on the Nodes placed there, their Clusters and the Hypervisor itself.

Pure: the documents the controller commits (`resource_documents`), made from a settled example repo
(tests/test_plan_diff.py) with one hypervisor's observation replaced by an unreachable one.
"""
from __future__ import annotations

import yaml
from test_plan_diff import NOW, private_2_down, repo, settle  # noqa: F401 - fixture

from gitops.engine import make_plan
from gitops.status.report import Outcome, Result, resource_documents


def _condition(doc: dict) -> dict:
    return next(c for c in doc["status"]["conditions"] if c["type"] == "Ready")


def test_nodes_clusters_and_the_hypervisor_are_unknown_when_it_does_not_answer(repo):
    state, observed = settle(repo.model)
    down = private_2_down(observed)
    planned = make_plan(repo.model, repo.repo.config, state, down, now=NOW)
    outcome = Outcome(sha="1" * 40, result=Result.APPLIED, applied_sha="1" * 40)
    placements = {n: (r.hypervisor, dict(r.ports)) for n, r in planned.state.nodes.items()}
    docs = {rel: yaml.safe_load(raw) for rel, raw in resource_documents(
        repo.model, planned.compiled.desired, down, outcome, lambda rel: None, NOW, placements).items()}

    there = sorted(n for n, r in planned.state.nodes.items() if r.hypervisor == "hv-private-2")
    assert there
    for node in there:
        doc = docs[f"status/Node/{node}.yaml"]["status"]
        assert doc["phase"] == "Unknown", (node, doc)
        assert _condition(docs[f"status/Node/{node}.yaml"])["status"] == "Unknown"
        assert _condition(docs[f"status/Node/{node}.yaml"])["reason"] == "HypervisorUnreachable"
    elsewhere = sorted(n for n, r in planned.state.nodes.items() if r.hypervisor != "hv-private-2")
    assert all(docs[f"status/Node/{n}.yaml"]["status"]["phase"] != "Unknown" for n in elsewhere)
    for cluster in sorted({repo.model.nodes[n].cluster for n in there}):
        doc = docs[f"status/Cluster/{cluster}.yaml"]
        assert doc["status"]["phase"] == "Unknown" and _condition(doc)["reason"] == "NodesUnknown", doc
    assert docs["status/Hypervisor/hv-private-2.yaml"]["status"]["phase"] == "Unknown"
    assert docs["status/Hypervisor/hv-private-1.yaml"]["status"]["phase"] == "Ready"
