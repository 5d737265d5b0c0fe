"""Shared fixtures. The lab fixtures start real containerd (and haproxy) and need root."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import imagebuild

# as the `gitops` command does: gRPC's C core would print TLS handshake failures the tests provoke
os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def require_root() -> None:
    """Skip (with the reason) when not root: containerd needs it. Missing binaries fail instead."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab runs real containerd instances")
    require_lab_group()


def lab_tempdir(prefix: str) -> Path:
    """A short temp directory (unix socket paths must stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@contextmanager
def running_lab(prefix: str, **up: Any) -> Iterator[tuple[Path, Any]]:
    """`require_root`, a `lab_tempdir(prefix)` `base` and, given `labmod.up`'s keywords `up`, a lab up in
    `base / "lab"`; yields (base, its LabInfo), or (base, None) without `up`: the caller brings the lab up there.
    Afterwards, whatever happens: the lab down, then `base` removed."""
    require_root()
    from gitops import lab as labmod

    base = lab_tempdir(prefix)
    try:
        yield base, (labmod.up(base / "lab", **up) if up else None)
    finally:
        try:
            labmod.down(base / "lab")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def wait_exit(client: "gitops.cri.client.CRIClient", ctr: str, timeout: float = 10) -> int:  # noqa: F821
    """The exit code of container `ctr` once it has exited (an AssertionError after `timeout` seconds)."""
    from gitops.cri.types import ContainerState

    end = time.monotonic() + timeout
    while True:
        status = client.container_status(ctr)
        if status.state == ContainerState.EXITED:
            return status.exit_code
        if time.monotonic() > end:
            raise AssertionError(f"container {ctr} still {status.state} after {timeout}s")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def lab() -> Iterator["gitops.lab.LabInfo"]:  # type: ignore[name-defined]  # noqa: F821
    """A 2-hypervisor lab (first one public) with mTLS fronts, shared by the whole session."""
    with running_lab("gitops-lab-", hypervisors=2, public=1, remote=True, subnet="127.0.20") as (_, lab):
        yield lab


@pytest.fixture
def pod(lab, request):  # type: ignore[no-untyped-def]
    """A fresh sandbox on the first (public) lab hypervisor, over its unix socket.

    Yields (client, sandbox id, spec, dir): `dir` is a not-yet-existing directory under the
    hypervisor's data dir for the test's host files. The sandbox is removed afterwards.
    """
    yield from _sandbox(lab.hypervisors[0], request)


@pytest.fixture
def private_pod(lab, request):  # type: ignore[no-untyped-def]
    """`pod` on the private lab hypervisor: the one with the control-plane images."""
    yield from _sandbox(next(hv for hv in lab.hypervisors if not hv.public), request)


def _sandbox(lab_hv, request):  # type: ignore[no-untyped-def]
    from gitops.cri.client import CRIClient
    from gitops.cri.types import SandboxSpec

    hv = lab_hv.local()
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


#: The lab groups (`pytest.mark.lab(NAME)` on a module), in the order they run, and what each owns: the `127.0.T`
#: labs and addresses its modules use (`tests/test_lab_groups.py` checks that no two groups share one, so two
#: groups can run at once). Under pytest-xdist they run in two lanes, one per worker (`SECOND_LANE`). (Any two
#: groups at once, each group to whichever worker was free, `LAB_WORKERS` 2, took 38:34 and 44:09 for the suite
#: and failed timing-sensitive tests: an mTLS front's TLS handshake past its 10 s deadline, a joining
#: kubelet's request past 60 s.)
LAB_GROUPS = {
    "image": "127.0.26: the controller image, built (beside the Python-only tests) and run",
    "apply": "127.0.22: the example clusters, applied and changed (test_apply_lab)",
    "workers": "127.0.24: the controller's lab and the workers' lab",
    "recovery": "127.0.34",
    "faults": "127.0.30, 127.0.36: the coordination API server, the fault commands, sharding",
    "session": "127.0.20, 127.0.21: the session's `lab` fixture (and `pod`), lab up and down",
    "failover": "127.0.46",
    "ingress": "127.0.48: a live cluster's ingress changed under load",
    "kubeapi": "127.0.31, 127.0.32, 127.0.33: real API servers (SIP providers, cluster reader, etcd leadership, waves)",
    "etcd": "127.0.38, 127.0.39: real etcd, restic's servers (backups, etcd upkeep, write answers)",
    "onboarding": "127.0.44",
}
#: how many xdist workers the heavy lab groups share: 1, every one of them on one worker (2: one group per free
#: worker)
LAB_WORKERS = 1
#: the lab groups of the second lane: under xdist, the worker that ran the Python-only tests (about 7 minutes)
#: runs these next, each whole (xdist group `lab-NAME`), while the first worker runs every other lab group as one
#: xdist group `lab`. Measured alone on 2 cores (2026-11-29): the first lane's groups take 1,845 s (apply 1,198,
#: faults 294, ingress 249, failover 86, onboarding 18), the Python-only tests 437 s and these 1,525 s (workers
#: 705, image 341, recovery 263, session 86, etcd 73, kubeapi 57). A heavy lab uses about one core on average
#: (half the machine, sampled), so the two lanes share the 2 cores instead of one lane leaving a core idle for
#: 45 minutes. The session group runs in the first lane since the rollout tests (about 4 minutes) joined workers;
#: failover moved to the second when the image build began to reuse its cached layers (about 2 minutes less).
SECOND_LANE = ("image", "workers", "recovery", "kubeapi", "etcd", "failover")
#: tests using these fixtures use the session's lab: group `session`
LAB_FIXTURES = {"lab", "pod", "private_pod"}


def lab_group(item: pytest.Item) -> str | None:
    """The item's lab group, or None for a Python-only test (a UsageError for an unknown or missing group)."""
    mark = item.get_closest_marker("lab")
    uses_lab = LAB_FIXTURES & set(getattr(item, "fixturenames", ()))
    if mark is None:
        if uses_lab:
            raise pytest.UsageError(f"{item.nodeid} uses the session lab: mark its module pytest.mark.lab('session')")
        return None
    name = mark.args[0] if mark.args else ""
    if name not in LAB_GROUPS or (uses_lab and name != "session"):
        raise pytest.UsageError(f"{item.nodeid}: lab group {name!r} is not one of {sorted(LAB_GROUPS)}"
                                + (" (it uses the session lab: 'session')" if uses_lab else ""))
    return name


#: whether this process is a pytest-xdist worker scheduling by group (`--dist loadgroup`: `scripts/test.sh`)
_BY_GROUP: list[bool] = [False]


def pytest_configure(config: pytest.Config) -> None:
    _BY_GROUP[0] = os.environ.get("PYTEST_XDIST_WORKER") is not None and bool(config.getvalue("loadgroup"))


def require_lab_group() -> None:
    """Under pytest-xdist's `--dist loadgroup`, fail a test that starts a lab or real servers outside a lab group:
    it could run beside another on the same addresses. (xdist's group is in the running test's id, after an
    `@`.)"""
    if not _BY_GROUP[0]:
        return
    running = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    if "@lab" not in running:
        pytest.fail(f"{running} starts a lab or real servers: mark its module pytest.mark.lab(GROUP), "
                    "a group of tests/conftest.py LAB_GROUPS")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist: an item of a lab group gets xdist's group `lab` (`lab-NAME` with `LAB_WORKERS` 2;
    marked as each test is collected: xdist reads the marks in its own collection hook)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    group = lab_group(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(f"lab-{group}" if LAB_WORKERS > 1 or group in SECOND_LANE else "lab"))


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected what they deselect
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order tests run in.

    Under pytest-xdist (`scripts/test.sh`: two workers, `--dist loadgroup --no-loadscope-reorder`): the heavy lab
    groups in `LAB_GROUPS` order, as one xdist group on one worker (each group whole on one worker with
    `LAB_WORKERS` 2); then the Python-only tests, shared out one by one to whichever worker is free (the other
    one: xdist gives a worker more only when it has 2 tests left); then the `SECOND_LANE` groups, each whole,
    which that other worker takes next (and the first one too, once its lane is done). Without xdist: the Python-only tests first, then the image tests, then the
    other lab groups; with an image test selected the images start building now, beside the Python-only tests
    (`imagebuild`). Under xdist the image test starts the build itself."""
    order = list(LAB_GROUPS)
    xdist = os.environ.get("PYTEST_XDIST_WORKER") is not None

    def rank(item: pytest.Item) -> tuple[int, int]:  # (stable: each group keeps the collected order)
        group = lab_group(item)
        if xdist:
            if group is None:
                return (1, 0)
            return (2 if group in SECOND_LANE else 0, order.index(group))
        if group is None:
            return (0, 0)
        return (1, 0) if item.get_closest_marker("image") else (2, order.index(group))

    items.sort(key=rank)
    if (not xdist and any(item.get_closest_marker("image") for item in items) and not config.option.collectonly
            and imagebuild.can_build()):
        imagebuild.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    imagebuild.stop()
