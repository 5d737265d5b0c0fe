"""The local-directory state store: round trip, permissions, atomic replace, corrupt file."""
from __future__ import annotations

import stat

import pytest

from gitops.errors import GitopsError
from gitops.state import CertRecord, ClusterRecord, LocalDirStore, NodeRecord, State


def test_round_trip_is_exact_and_private(tmp_path):
    store = LocalDirStore(tmp_path / "state")
    assert store.load() == State()
    state = State(
        clusters={"c1": ClusterRecord(authorities={"etcd": CertRecord("CERT", "KEY")}, etcd_members=["n2", "n1"])},
        nodes={"n1": NodeRecord("c1", "hv-1", {"etcd-client": 31000})},
    )
    store.save(state)
    assert store.load() == state
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    text = store.path.read_text()
    store.save(store.load())
    assert store.path.read_text() == text  # deterministic
    assert [p.name for p in store.directory.iterdir()] == ["state.json"]  # no temp files left


def test_corrupt_state_is_a_clear_error(tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(GitopsError, match="corrupt state file"):
        LocalDirStore(tmp_path).load()
