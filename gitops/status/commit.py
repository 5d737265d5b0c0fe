"""The files of one status commit, from what a reconcile did (pure but for sealing).

`commit_documents` gives what people read (source, the executed plan, every
resource's status, the live snapshot); `kubeconfig_files` the admin kubeconfigs,
sealed to the controller and the repo's kubeconfig recipients. The state files
are `state.py`'s; one of several replicas keeps only its share (`replica.py`).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from gitops.compile.desired import DesiredState
from gitops.engine import Planned
from gitops.kubeconfig import admin_kubeconfig
from gitops.model.config import RepoConfig
from gitops.model.resources import RepoModel
from gitops.observe.types import ObservedState
from gitops.plan import converged
from gitops.plan.converged import Converged, blob_id
from gitops.sip.selection import HostSelection
from gitops.state.records import State
from gitops.status.reader import APPLY, ROLLOUT, SOURCE, converged_path, kubeconfig_path
from gitops.status.report import Outcome, resource_documents, rollout_document, sip_documents, source_document
from gitops.status.sealed_state import Sealer
from gitops.status.snapshot import cluster_path, snapshot_files

#: node name -> (hypervisor, ports), as recorded
Placements = dict[str, tuple[str, dict[str, int]]]


def placements_of(state: State) -> Placements:
    """Where each recorded node is placed, and on which ports."""
    return {n: (r.hypervisor, dict(r.ports)) for n, r in state.nodes.items()}


def commit_documents(outcome: Outcome, record: bytes | None, model: RepoModel, desired: DesiredState,
                     observed: ObservedState, sip: HostSelection, placements: Placements,
                     previous: Callable[[str], bytes | None], now: dt.datetime,
                     state: State | None = None) -> dict[str, bytes]:
    """Source status, the live snapshot, the apply record (`record`, else the branch's previous one, kept),
    the last rollout through waves and the commit each cluster runs (from the recorded `state`), and the status
    of every resource; `previous` reads the branch's files as they are."""
    files = {SOURCE: source_document(outcome, previous, now), **snapshot_files(observed)}
    kept = previous(APPLY)
    if record is not None or kept is not None:
        files[APPLY] = record if record is not None else kept
    waves = rollout_document(state.rollout if state is not None else None)
    if waves is not None:
        files[ROLLOUT] = waves
    running = {name: r.commit for name, r in state.clusters.items() if r.commit} if state is not None else {}
    files.update(resource_documents(model, desired, observed, outcome, previous, now, placements, running))
    files.update(sip_documents(model, sip, outcome, previous, now, desired, placements))
    return files


def converged_records(after: Planned, model: RepoModel, config: RepoConfig, state: State,
                      fingerprints: dict[str, str]) -> dict[str, Converged]:
    """What the plan made after an apply (`after`) says of each cluster it left with nothing to do
    (`gitops.plan.converged.records`), beside the recorded `state` as written and each cluster's
    observation `fingerprints`."""
    return converged.records(after.plan, after.settled, model, config, state, after.state,
                             converged.reachability(after.observed), fingerprints, after.renew_at)


def converged_files(after: Planned | None, model: RepoModel, config: RepoConfig, state: State,
                    files: dict[str, bytes]) -> dict[str, bytes]:
    """`observed/converged/<cluster>.json` of each cluster `converged_records` gives, beside the snapshot
    `files` and the recorded `state` of the same commit (their fingerprint: the git blob id of their
    snapshot file)."""
    if after is None:
        return {}
    blobs = {c: blob_id(files[cluster_path(c)]) for c in model.clusters if cluster_path(c) in files}
    return {converged_path(cluster): record.to_bytes()
            for cluster, record in converged_records(after, model, config, state, blobs).items()}


def kubeconfig_files(desired: DesiredState, state: State, sealer: Sealer, recipients: tuple[str, ...],
                     previous: Callable[[str], bytes | None]) -> dict[str, bytes]:
    """kubeconfig/<cluster>.yaml of every cluster with an endpoint and an admin credential, sealed (the
    branch's ciphertext kept while the plaintext is the same)."""
    out = {}
    for name, cluster in sorted(desired.clusters.items()):
        record = state.clusters.get(name)
        if cluster.api_endpoint is None or record is None or record.admin is None:
            continue
        rel = kubeconfig_path(name)
        text = admin_kubeconfig(name, record, cluster.api_endpoint).encode()
        out[rel] = sealer.seal(text, previous(rel), tuple(recipients))
    return out
