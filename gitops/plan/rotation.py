"""A CA rotation in the plan: the phase that runs, and the action that records the next one.

Compile makes the current phase's desired state from the recorded one (`gitops.compile.authorities`);
this module adds, after every action of that phase, an `advance-ca-rotation` action that moves the
recorded state on (`ClusterRecord.next_phase`). So each plan runs one phase and says so, and the next
plan starts from the phase it recorded: planning never loops back into compile.
"""
from __future__ import annotations

from collections.abc import Iterable

from gitops.model.resources import RepoModel
from gitops.plan.actions import Action, Kind, Unknown, UnknownKind
from gitops.plan.payloads import RotationStep
from gitops.state.records import DROP_OLD, RE_ISSUE, ROTATION_PHASES, TRUST_BOTH, ClusterRecord, State

PHASE_TEXT = {
    TRUST_BOTH: "trust both: new CAs generated; every CA bundle (API server, etcd, front-proxy, kubeconfigs, "
                "cluster-info) holds old + new; components restart, rolling",
    RE_ISSUE: "re-issue: every leaf certificate and the admin kubeconfig re-issued by the new CAs (server "
              "certificates carry the new CA cross-signed by the old); readers restart, rolling",
    DROP_OLD: "drop old: every CA bundle holds only the new CAs; components restart, rolling; then the old CAs "
              "are forgotten",
}


def rotation_steps(model: RepoModel, state: State, actions: Iterable[Action],
                   unknowns: Iterable[Unknown]) -> list[Action]:
    """For each cluster in a CA rotation whose phase this plan can finish, the action recording the next
    phase (ordered after all of the cluster's actions). None for a cluster with a node not placed yet or
    something of it not observed (a hypervisor of its nodes, its API): the phase may not be done there."""
    actions, unknowns = list(actions), list(unknowns)
    out = []
    for name, record in sorted(state.clusters.items()):
        rotation = record.rotation
        if rotation is None or name not in model.clusters:
            continue
        nodes = {n.name for n in model.nodes_of(name)}
        if not nodes <= state.nodes.keys():
            continue
        if any(set(u.nodes) & nodes or (u.kind == UnknownKind.CLUSTER_API and u.name == name) for u in unknowns):
            continue
        out.append(Action(Kind.ADVANCE_CA_ROTATION, "", name, "", reason=_step_reason(record),
                          details=(f"actions of this phase in the plan: {sum(a.cluster == name for a in actions)}",),
                          payload=RotationStep(name, rotation.generation, rotation.phase)))
    return out


def _step_reason(record: ClusterRecord) -> str:
    rotation = record.rotation
    assert rotation is not None
    number = ROTATION_PHASES.index(rotation.phase) + 1
    if rotation.phase == DROP_OLD:
        return (f"phase 3 of 3 (drop old) has run: the rotation ends at generation {rotation.generation} and the "
                "old CAs are forgotten")
    after = ROTATION_PHASES[number]
    return f"phase {number} of 3 ({rotation.phase}) has run: the next plan runs phase {number + 1} ({after})"


def rotation_notes(state: State) -> list[str]:
    """What the plan says about each CA rotation under way: the phase that runs now and those that follow."""
    notes = []
    for name, record in sorted(state.clusters.items()):
        rotation = record.rotation
        if rotation is None:
            continue
        now = ROTATION_PHASES.index(rotation.phase)
        text = (f"Cluster {name}: CA rotation {record.ca_generation} -> {rotation.generation}, "
                f"phase {now + 1} of 3 runs now: {PHASE_TEXT[rotation.phase]}.")
        later = [f"phase {i + 1} ({p})" for i, p in enumerate(ROTATION_PHASES) if i > now]
        if later:
            text += f" Then, one per apply, each once the one before has run: {', '.join(later)}."
        else:
            text += " The rotation ends with this plan."
        notes.append(text)
    return notes
