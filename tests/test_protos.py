"""The committed CRI bindings are exactly what the pinned grpcio-tools generates."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ["runtime_pb2.py", "runtime_pb2.pyi", "runtime_pb2_grpc.py"]


def _pinned_grpcio_tools() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [re.fullmatch(r"grpcio-tools==(\S+)", d) for d in extras["test"]]
    versions = [m.group(1) for m in pins if m]
    assert versions, "pyproject.toml must pin grpcio-tools exactly (==) in the test extra"
    return versions[0]


def test_grpcio_tools_is_the_pinned_version() -> None:
    assert metadata.version("grpcio-tools") == _pinned_grpcio_tools(), (
        "installed grpcio-tools differs from the pin; run scripts/install-deps.sh")


def test_generated_code_is_current(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-protos.sh"), str(tmp_path)],
                   check=True, env=env, capture_output=True, timeout=120)
    for name in GENERATED:
        fresh = (tmp_path / "gitops" / "cri" / "pb" / name).read_bytes()
        committed = (ROOT / "gitops" / "cri" / "pb" / name).read_bytes()
        assert fresh == committed, f"gitops/cri/pb/{name} is stale: run scripts/gen-protos.sh"


def test_wire_names_are_cri_runtime_v1() -> None:
    from gitops.cri.pb import runtime_pb2 as pb

    assert pb.DESCRIPTOR.package == "runtime.v1"
    runtime = pb.DESCRIPTOR.services_by_name["RuntimeService"]
    images = pb.DESCRIPTOR.services_by_name["ImageService"]
    assert {"Version", "Status", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "ListPodSandbox",
            "PodSandboxStatus", "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer",
            "ListContainers", "ContainerStatus"} <= set(runtime.methods_by_name)
    assert {"ListImages", "ImageStatus", "PullImage", "RemoveImage"} <= set(images.methods_by_name)
    assert runtime.full_name == "runtime.v1.RuntimeService"


def test_field_numbers_on_the_wire() -> None:
    from gitops.cri.pb import runtime_pb2 as pb

    msg = pb.ContainerFilter(pod_sandbox_id="p", label_selector={"k": "v"})
    # field 3 (string) "p"; field 4 (map entry: key=1, value=2)
    assert msg.SerializeToString() == b"\x1a\x01p\x22\x06\x0a\x01k\x12\x01v"
    cfg = pb.PodSandboxConfig(linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
        namespace_options=pb.NamespaceOption(network=pb.NODE))))
    assert cfg.SerializeToString() == b"\x42\x06\x12\x04\x0a\x02\x08\x02"
