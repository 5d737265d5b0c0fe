"""Shared fixtures. The lab fixtures start real containerd (and haproxy) and need root."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import imagebuild

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


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist: the image tests and the modules with a lab (or real servers) are one group,
    `lab` (marked as each test is collected: xdist reads the marks in its own collection hook)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    if (item.get_closest_marker("image") or imagebuild.LAB_FIXTURES & set(getattr(item, "fixturenames", ()))
            or _runs_a_lab(Path(str(item.fspath)))):
        item.add_marker(pytest.mark.xdist_group("lab"))


_LAB_MODULES: dict[Path, bool] = {}


def _runs_a_lab(path: Path) -> bool:
    if path not in _LAB_MODULES:
        _LAB_MODULES[path] = imagebuild.runs_a_lab(path)
    return _LAB_MODULES[path]


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected what they deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that run only Python first, then the image tests, then the modules with labs.

    Under pytest-xdist (`scripts/test.sh` runs two workers, `--dist loadgroup`): the image tests and every
    module with a lab (or real servers) are one group, run by one worker in that order, one at a time as
    without xdist (their subnets, the session's `lab` and the image build are never shared); the
    Python-only tests go to whichever worker is free, so they run beside that group. Without xdist and
    with an image test selected, the images start building now, beside the first group (`imagebuild`);
    under xdist the image test starts the build itself, first in its group."""
    lab = {Path(str(item.fspath)) for item in items
           if imagebuild.LAB_FIXTURES & set(getattr(item, "fixturenames", ()))}
    lab |= {path for path in {Path(str(item.fspath)) for item in items} if imagebuild.runs_a_lab(path)}

    def group(item: pytest.Item) -> int:  # (by module: a module's fixtures are set up once)
        if item.get_closest_marker("image"):
            return 1
        return 2 if Path(str(item.fspath)) in lab else 0

    items.sort(key=group)  # (stable: each group keeps the collected order)
    if (os.environ.get("PYTEST_XDIST_WORKER") is None and any(item.get_closest_marker("image") for item in items) and not config.option.collectonly
            and imagebuild.can_build()):
        imagebuild.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    imagebuild.stop()
