"""What a plan against a status ref starts from (`gitops plan CLONE --against-status REF`, the UI's branch
plans): the public recorded state and the observed snapshot on that ref."""
from __future__ import annotations

from pathlib import Path

from gitops.observe.types import ObservedState
from gitops.state.records import State
from gitops.status.reader import SOURCE, SourceStatus, StatusReader
from gitops.state.sealing import merge


def snapshot_from_status(repo: Path, ref: str) -> tuple[State, ObservedState, str]:
    """(public state, observed snapshot, label) from a status-branch ref of `repo`'s git."""
    reader = StatusReader.at_ref(repo, ref)
    observed, public = reader.observed(), reader.public_state()
    applied = SourceStatus.parse(reader.require(SOURCE)).applied_sha
    return merge(public, None), observed, f"snapshot {ref} (applied {applied[:12]})"
