"""`gitops lab`: images from host binaries, up/status/down with real containerd and haproxy."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from gitops.cri import ContainerSpec, CRIClient, SandboxSpec
from gitops.cri.documents import hypervisor_from_document
from gitops.lab import LabError, hypervisors_yaml
from gitops.lab import images as labimages
from gitops.lab import procs


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab runs real containerd instances")


def _gitops(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gitops", *args], capture_output=True, text=True, timeout=180)
    if check:
        assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_images_are_deterministic(tmp_path: Path) -> None:
    recipe = labimages.ImageRecipe("tiny", "1", (labimages._which("sleep"),), ("/usr/bin/sleep",))
    first = labimages.build_image(recipe, tmp_path / "a").read_bytes()
    assert labimages.build_image(recipe, tmp_path / "b").read_bytes() == first
    libs = labimages.shared_libraries(labimages._which("haproxy"))
    assert any("libssl" in lib for lib in libs) and any("ld-linux" in lib for lib in libs)


def test_yaml_documents_round_trip(lab) -> None:  # type: ignore[no-untyped-def]
    docs = list(yaml.safe_load_all(hypervisors_yaml(lab)))
    assert [d["metadata"]["name"] for d in docs] == ["lab-hv-1", "lab-hv-2"]
    assert [d["spec"]["public"] for d in docs] == [True, False]
    assert docs[0]["spec"]["portRange"] == {"low": 30000, "high": 30999}
    assert docs[1]["spec"]["ipAddress"] == "127.0.20.2"
    assert docs[0]["spec"]["remoteCRIEndpoint"]["criEndpointURI"] == "tcp://127.0.20.1:10250"
    for doc, hv in zip(docs, lab.hypervisors):
        assert hypervisor_from_document(doc) == hv.remote()


def test_up_refuses_a_running_lab(lab) -> None:  # type: ignore[no-untyped-def]
    from gitops import lab as labmod

    with pytest.raises(LabError, match="already up"):
        labmod.up(lab.dir)


def test_status_and_image_import(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    status = _gitops("lab", "status", "--dir", str(lab.dir)).stdout
    assert status.startswith(f"lab {lab.dir}: up\n")
    assert status.count("containerd  pid=") == 2 and status.count("haproxy  pid=") == 2
    recipe = labimages.ImageRecipe("user-image", "7", (labimages._which("true"),), ("/usr/bin/true",))
    tarball = labimages.build_image(recipe, tmp_path)
    out = _gitops("lab", "images", "import", str(tarball), "--dir", str(lab.dir)).stdout
    assert out.splitlines() == [f"imported {tarball.name} into lab-hv-1", f"imported {tarball.name} into lab-hv-2"]
    for hv in lab.hypervisors:
        with CRIClient(hv.local()) as client:
            assert client.image_status(recipe.ref) is not None


def _leftovers(lab_dir: Path) -> tuple[list[int], list[str]]:
    return procs.pids_referencing(lab_dir), procs.mounts_under(lab_dir)


def test_up_and_down_leave_nothing_behind() -> None:
    require_root()
    lab_dir = Path(tempfile.mkdtemp(prefix="gitops-lab-updown-", dir="/tmp"))
    shim_dir = Path("/run/containerd/s")
    shim_sockets = set(shim_dir.iterdir()) if shim_dir.exists() else set()
    try:
        up = _gitops("lab", "up", "--hypervisors", "3", "--public", "1", "--remote",
                     "--subnet", "127.0.21", "--dir", str(lab_dir))
        docs = list(yaml.safe_load_all(up.stdout))
        assert [d["metadata"]["name"] for d in docs] == ["lab-hv-1", "lab-hv-2", "lab-hv-3"]
        assert [d["spec"]["public"] for d in docs] == [True, False, False]
        assert [d["spec"]["ipAddress"] for d in docs] == ["127.0.21.1", "127.0.21.2", "127.0.21.3"]
        state = json.loads((lab_dir / "lab.json").read_text())
        recorded = [procs.Proc.from_json(p) for p in state["processes"]]
        assert sorted(p.role for p in recorded) == ["containerd"] * 3 + ["haproxy"] * 3
        assert all(p.alive() for p in recorded)

        # A running pod on every hypervisor (shims, mounts); containerd of hv-1 then dies
        # abruptly, so its pod can only be cleaned up through the leftover-process path.
        hvs = [hypervisor_from_document(d) for d in docs]
        for hv in hvs:
            with CRIClient(hv) as client:
                spec = SandboxSpec("busy")
                sandbox_id = client.run_sandbox(spec)
                ctr = client.create_container(sandbox_id, ContainerSpec("sleep", "gitops.lab/pause:3.9"), spec)
                client.start_container(ctr)
        pids, mounts = _leftovers(lab_dir)
        assert len(pids) > 6 and mounts
        hv1 = next(p for p in recorded if p.role == "containerd" and p.hypervisor == "lab-hv-1")
        os.kill(hv1.pid, signal.SIGKILL)

        down = _gitops("lab", "down", "--dir", str(lab_dir)).stdout
        assert "lab directory removed" in down
        assert not lab_dir.exists()
        assert _leftovers(lab_dir) == ([], [])
        assert not any(p.alive() for p in recorded)
        assert set(shim_dir.iterdir()) == shim_sockets  # even the killed shim's socket is gone
        status = _gitops("lab", "status", "--dir", str(lab_dir), check=False)
        assert status.returncode == 1 and "no lab in" in status.stderr
    finally:
        from gitops import lab as labmod

        labmod.down(lab_dir)
