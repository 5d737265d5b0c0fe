"""Shared fixtures. The lab fixtures start real containerd (and haproxy) and need root."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# as the `gitops` command does: gRPC's C core would print TLS handshake failures the tests provoke
os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def require_root() -> None:
    """Skip (with the reason) when not root: containerd needs it. Missing binaries fail instead."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab runs real containerd instances")


def lab_tempdir(prefix: str) -> Path:
    """A short temp directory (unix socket paths must stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="session")
def lab() -> Iterator["gitops.lab.LabInfo"]:  # type: ignore[name-defined]  # noqa: F821
    """A 2-hypervisor lab (first one public) with mTLS fronts, shared by the whole session."""
    require_root()
    from gitops import lab as labmod

    lab_dir = lab_tempdir("gitops-lab-")
    try:
        yield labmod.up(lab_dir, hypervisors=2, public=1, remote=True, subnet="127.0.20")
    finally:
        try:
            labmod.down(lab_dir)
        finally:
            shutil.rmtree(lab_dir, ignore_errors=True)


@pytest.fixture
def pod(lab, request):  # type: ignore[no-untyped-def]
    """A fresh sandbox on the first (public) lab hypervisor, over its unix socket.

    Yields (client, sandbox id, spec, dir): `dir` is a not-yet-existing directory under the
    hypervisor's data dir for the test's host files. The sandbox is removed afterwards.
    """
    from gitops.cri.client import CRIClient
    from gitops.cri.types import SandboxSpec

    hv = lab.hypervisors[0].local()
    name = request.node.name.replace("_", "-")[:50]
    base = Path(hv.data_dir) / "tests" / name
    namespace = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    spec = SandboxSpec(name, namespace=namespace, log_directory=str(base / "logs"))
    with CRIClient(hv.cri_endpoint(), slow_timeout=60) as client:
        sandbox_id = client.run_sandbox(spec)
        try:
            yield client, sandbox_id, spec, base
        finally:
            client.stop_sandbox(sandbox_id)
            client.remove_sandbox(sandbox_id)
