"""The local-directory state store: round trip, permissions, atomic replace, corrupt file."""
from __future__ import annotations

import json
import stat
import subprocess
from dataclasses import MISSING, fields

import pytest

from gitops.errors import GitopsError
from gitops.state import CertRecord, ClusterRecord, LocalDirStore, NodeRecord, State
from gitops.state.records import CARotation, RolloutRecord, WaveRecord


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


def test_copy_is_deep_and_misses_no_field():
    """Every field set to something other than its default: a field copy() forgets shows up as a difference."""
    state = State(
        clusters={"c1": ClusterRecord(authorities={"etcd": CertRecord("CERT", "KEY")}, admin=CertRecord("A", "AK"),
                                      service_account_keys={"n1": "PUB"}, etcd_members=["n1"], etcd_learners=["n1"],
                                      retired_service_account_keys=["OLD"], ca_generation=2,
                                      rotation=CARotation(3, "drop-old", {"etcd": CertRecord("NEW", "NK")},
                                                          {"etcd": "CROSS"}), restored="latest", recovered="n1", forcing="n1",
                                     virtual_ip="10.0.5.200", vrrp_id=7, commit="c0ffee")},
        nodes={"n1": NodeRecord("c1", "hv-1", {"etcd-client": 31000}, "n1=https://x:1", "new", "hv-0", "hv-0",
                                   "https://x:0", {"etcd-client": 30000})},
        sip_labels={"metal3/host-1": {"role": "lb", "gone": None}},
        hypervisor_ca=CertRecord("HVCA", "HVKEY"),
        rollout=RolloutRecord("c0ffee", [WaveRecord("canary", "Halted", "t0", "t1", {"c1": {"failed": 3}},
                                                    "success ratio 0.5 < 0.999", "c1")]),
    )
    for record in (state, *state.clusters.values(), *state.nodes.values(), state.clusters["c1"].admin,
                   state.clusters["c1"].rotation, state.rollout, *state.rollout.waves):
        for f in fields(record):
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            assert getattr(record, f.name) != default, (type(record).__name__, f.name)
    copied = state.copy()
    assert copied == state and copied.to_dict() == state.to_dict()
    copied.clusters["c1"].authorities["etcd"].key_pem = "OTHER"
    copied.clusters["c1"].admin.cert_pem = "B"
    copied.hypervisor_ca.key_pem = "OTHER"
    copied.clusters["c1"].service_account_keys["n2"] = "PUB2"
    copied.clusters["c1"].etcd_members.append("n2")
    copied.clusters["c1"].etcd_learners.clear()
    copied.clusters["c1"].retired_service_account_keys.append("OLDER")
    copied.clusters["c1"].rotation.other["etcd"].key_pem = "NK2"
    copied.clusters["c1"].rotation.cross["front-proxy"] = "X"
    copied.nodes["n1"].ports["etcd-peer"] = 31001
    copied.nodes["n1"].leaving_ports["etcd-peer"] = 30001
    copied.sip_labels["metal3/host-1"]["role"] = "jump"
    copied.rollout.waves[0].figures["c1"]["failed"] = 4
    assert state.to_dict() == State.from_dict(state.to_dict()).to_dict() and copied != state
    assert state.clusters["c1"] == ClusterRecord(authorities={"etcd": CertRecord("CERT", "KEY")},
                                                 admin=CertRecord("A", "AK"), service_account_keys={"n1": "PUB"},
                                                 etcd_members=["n1"], etcd_learners=["n1"], retired_service_account_keys=["OLD"],
                                                 ca_generation=2, rotation=CARotation(
                                                     3, "drop-old", {"etcd": CertRecord("NEW", "NK")},
                                                     {"etcd": "CROSS"}), restored="latest", recovered="n1", forcing="n1",
                                     virtual_ip="10.0.5.200", vrrp_id=7, commit="c0ffee")
    assert state.nodes["n1"].ports == {"etcd-client": 31000} and state.nodes["n1"].leaving_ports == {"etcd-client": 30000}
    assert state.sip_labels == {"metal3/host-1": {"role": "lb", "gone": None}}
    assert state.hypervisor_ca == CertRecord("HVCA", "HVKEY")


def test_every_file_gitops_keeps_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    """`write_atomic` (state.json, saved plans, the notification spool, the sealed-state cache, edited repo
    files): a write that fails at any step leaves the old content and no temporary file behind."""
    import os

    from gitops import safeio
    target = tmp_path / "kept.json"
    safeio.write_atomic(target, "old\n", mode=0o640)
    assert target.read_text() == "old\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    for step in ("fsync", "replace"):
        def broken(*args, _step=step, **kwargs):
            raise OSError(28, f"No space left on device ({_step})")
        with monkeypatch.context() as patched:
            patched.setattr(os, step, broken)
            with pytest.raises(OSError, match=step):
                safeio.write_atomic(target, "new\n")
        assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"], step
    safeio.write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    # a writer killed mid-write left its temporary file: the next write removes it, not a live writer's
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = tmp_path / f".kept.json.{gone.pid}.x1y2.tmp"
    live = tmp_path / f".kept.json.{os.getpid()}.z3.tmp"
    other = tmp_path / f".other.json.{gone.pid}.q.tmp"
    longer = tmp_path / f".kept.json.{gone.pid}.{gone.pid}.q.tmp"  # of `kept.json.PID`, not of `kept.json`
    for leftover in (left, live, other, longer):
        leftover.write_text("secret")
    safeio.write_atomic(target, "newer\n")
    assert target.read_text() == "newer\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["kept.json", live.name, other.name, longer.name])


def test_the_fleets_hypervisor_ca_key_is_sealed_like_the_clusters_ca_keys():
    """Issue #43.1: the hypervisor CA `gitops hypervisor` keeps in the recorded state goes to the status branch
    with its certificate in the clear and its key only in the sealed part; merged back, it is whole."""
    from gitops.pki import create_ca
    from gitops.state.sealing import merge, split

    ca = create_ca("gitops-hypervisor-ca")
    state = State(hypervisor_ca=CertRecord(ca.cert_pem, ca.key_pem))
    public, secrets = split(state)
    assert public["hypervisor_ca"] == {"cert_pem": ca.cert_pem, "key_pem": ""}
    assert "PRIVATE KEY" not in json.dumps(public) and secrets["hypervisor_ca"] == ca.key_pem
    assert merge(public, secrets).hypervisor_ca == CertRecord(ca.cert_pem, ca.key_pem)
    assert merge(public, None).hypervisor_ca == CertRecord(ca.cert_pem, "")
    assert "hypervisor_ca" not in State().to_dict()  # a state without one is written as before it existed
    assert State.parse(state.to_dict()) == state
