"""What a plan against a status ref starts from (`gitops plan CLONE --against-status REF`, the UI's branch
plans): the public recorded state and the observed snapshot on that ref, less the clusters whose last
converged plan was made from the same inputs (`gitops.plan.converged`)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from gitops.engine import Planned, make_plan
from gitops.model.config import RepoConfig
from gitops.model.resources import RepoModel
from gitops.observe.types import ObservedState
from gitops.plan import converged
from gitops.state.records import State
from gitops.state.sealing import merge
from gitops.status.reader import PUBLIC, SOURCE, SourceStatus, StatusReader
from gitops.status.snapshot import HYPERVISORS
from gitops.status.trust import Verifier


@dataclass(frozen=True)
class Against:
    """The inputs of a plan against a status ref. `unchanged`: clusters left out (their files not loaded)."""

    state: State
    observed: ObservedState
    source: str
    unchanged: frozenset[str] = frozenset()


def against_status(repo: Path, ref: str, model: RepoModel, config: RepoConfig,
                   now: dt.datetime | None = None, verifier: Verifier | None = None) -> Against:
    """The state and snapshot at `ref` of `repo`'s git, without the clusters whose converged record matches
    `model` and `config` (only the others' observed files are read)."""
    reader = StatusReader.at_ref(repo, ref, verifier)
    reader.prefetch([PUBLIC, SOURCE, HYPERVISORS])
    state = merge(reader.public_state(), None)
    applied = SourceStatus.parse(reader.require(SOURCE)).applied_sha
    source = f"snapshot {ref} (applied {applied[:12]})"
    if reader.read(HYPERVISORS) is None:  # the older one-file layout: no records, a full plan
        return Against(state, reader.observed(), source)
    blobs = reader.observed_blobs()
    skipped = converged.unchanged(model, config, state, reader.converged(), reader.reachability(), blobs,
                                  now or dt.datetime.now(dt.timezone.utc))
    while True:
        observed = reader.observed_of(None if not skipped else [c for c in blobs if c not in skipped])
        owners = converged.clusters_of_pods(model, observed.pods(), skipped)
        if not owners:
            return Against(state, observed, source, skipped)
        skipped -= owners  # a pod of one of their nodes is filed with another cluster: plan them too


def plan_against_status(model: RepoModel, config: RepoConfig, repo: Path, ref: str,
                        now: dt.datetime | None = None, verifier: Verifier | None = None) -> Planned:
    """The plan of `model` against `ref`, leaving out the clusters that plan nothing again."""
    now = now or dt.datetime.now(dt.timezone.utc)
    found = against_status(repo, ref, model, config, now, verifier)
    return make_plan(model, config, found.state, found.observed, now=now, source=found.source,
                     unchanged=found.unchanged)
