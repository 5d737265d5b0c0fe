"""CRI client against real containerd, over its unix socket and through the haproxy mTLS front."""
from __future__ import annotations

import dataclasses
import shutil
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gitops import pki
from gitops.cri.client import CRIClient, read_all
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError, Reason
from gitops.cri.types import ContainerSpec, ContainerState, SandboxSpec, SandboxState
from gitops.lab import recipes

pytestmark = pytest.mark.lab("session")


def _hv(lab, transport: str, index: int = 0) -> CRIEndpoint:  # type: ignore[no-untyped-def]
    hv = lab.hypervisors[index]
    return (hv.local() if transport == "unix" else hv.remote()).cri_endpoint()


def _with_endpoint(ep: CRIEndpoint, **changes: str) -> CRIEndpoint:
    return dataclasses.replace(ep, **changes)


def _cleanup(client: CRIClient, labels: dict[str, str]) -> None:
    for sandbox in client.list_sandboxes(labels):
        client.stop_sandbox(sandbox.id)
        client.remove_sandbox(sandbox.id)


@pytest.fixture
def test_labels() -> dict[str, str]:
    return {"gitops.test/run": uuid.uuid4().hex[:12]}


@pytest.mark.parametrize("transport", ["unix", "mtls"])
def test_version_and_status(lab, transport: str) -> None:  # type: ignore[no-untyped-def]
    with CRIClient(_hv(lab, transport)) as client:
        version = client.version()
        assert version.runtime_name == "containerd"
        assert version.runtime_api_version == "v1"
        assert client.status().ready
        tags = {t for img in client.list_images() for t in img.repo_tags}
        # (a public hypervisor has all but the control-plane images: versioned roles, on the private ones)
        private = recipes.controlplane_roles(lab.images)
        assert {ref for role, ref in lab.images.items() if role not in private} <= tags
        assert not {lab.images[role] for role in private} & tags
        assert client.image_status(lab.images["pause"]) is not None
        assert client.image_status("gitops.lab/absent:1") is None
        assert client.pull_image(lab.images["pause"])  # present: no registry needed


@pytest.mark.parametrize("transport", ["unix", "mtls"])
def test_sandbox_and_container_lifecycle(lab, transport: str, test_labels: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    hv = _hv(lab, transport)
    with CRIClient(hv) as client:
        try:
            spec = SandboxSpec(f"pod-{transport}", labels=test_labels, annotations={"a": "1"})
            sandbox_id = client.run_sandbox(spec)
            [sandbox] = client.list_sandboxes(test_labels)
            assert (sandbox.id, sandbox.name, sandbox.state) == (sandbox_id, spec.name, SandboxState.READY)
            assert sandbox.labels == test_labels and sandbox.annotations == {"a": "1"}
            assert client.list_sandboxes({"gitops.test/run": "other"}) == []

            labels = {**test_labels, "role": "sleeper"}
            container_id = client.create_container(
                sandbox_id, ContainerSpec("sleeper", lab.images["pause"], labels=labels), spec)
            [created] = client.list_containers(labels)
            assert created.state == ContainerState.CREATED and created.sandbox_id == sandbox_id
            client.start_container(container_id)
            status = client.container_status(container_id)
            assert status.state == ContainerState.RUNNING
            assert (status.name, status.sandbox_id, status.image) == ("sleeper", sandbox_id, lab.images["pause"])
            assert status.labels == labels and status.started_at > 0

            # Without the sandbox spec, the sandbox config is rebuilt from its status.
            second = client.create_container(sandbox_id, ContainerSpec("second", lab.images["pause"],
                                                                       labels=test_labels))
            assert {c.name for c in client.list_containers(test_labels)} == {"sleeper", "second"}
            client.remove_container(second)

            client.stop_container(container_id, timeout=1)
            assert client.container_status(container_id).state == ContainerState.EXITED
            client.remove_container(container_id)
            assert client.list_containers(test_labels) == []
            client.stop_sandbox(sandbox_id)
            assert client.sandbox_status(sandbox_id).state == SandboxState.NOT_READY
            client.remove_sandbox(sandbox_id)
            assert client.list_sandboxes(test_labels) == []
            with pytest.raises(CRIError) as err:
                client.sandbox_status(sandbox_id)
            assert err.value.reason == Reason.NOT_FOUND
        finally:
            _cleanup(client, test_labels)


def test_etcd_container_answers_health(lab, test_labels: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    hv = lab.hypervisors[1]
    port = hv.port_range.low + 79
    url = f"http://{hv.ip}:{port}"
    with CRIClient(hv.remote().cri_endpoint()) as client:
        try:
            spec = SandboxSpec("etcd", labels=test_labels)
            sandbox_id = client.run_sandbox(spec)
            container_id = client.create_container(sandbox_id, ContainerSpec(
                "etcd", lab.etcd_image(), labels=test_labels,
                args=("--name=test", "--data-dir=/var/lib/etcd/test",
                      f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                      f"--listen-peer-urls=http://{hv.ip}:{port + 1}",
                      f"--initial-advertise-peer-urls=http://{hv.ip}:{port + 1}",
                      f"--initial-cluster=test=http://{hv.ip}:{port + 1}")), spec)
            client.start_container(container_id)
            deadline, body = time.monotonic() + 20, b""
            while time.monotonic() < deadline:
                try:
                    body = urllib.request.urlopen(f"{url}/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.2)
            assert b'"health":"true"' in body, client.container_status(container_id)
        finally:
            _cleanup(client, test_labels)


@pytest.fixture(scope="module")
def other_ca() -> pki.CertKey:
    return pki.create_ca("not-the-lab-ca")


@pytest.mark.parametrize("case", ["no client cert", "client cert from another CA", "untrusted server cert"])
def test_mtls_refusals(lab, other_ca: pki.CertKey, case: str, test_labels: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    hv = lab.hypervisors[0].remote().cri_endpoint()
    if case == "no client cert":
        bad = _with_endpoint(hv, cert_pem="", key_pem="")
        hint = "rejected the client certificate"
    elif case == "client cert from another CA":
        rogue = pki.issue_cert(other_ca, "rogue", client=True)
        bad = _with_endpoint(hv, cert_pem=rogue.cert_pem, key_pem=rogue.key_pem)
        hint = "rejected the client certificate"
    else:  # the client trusts another CA than the one that signed the server's certificate
        bad = _with_endpoint(hv, ca_pem=other_ca.cert_pem)
        hint = "server certificate is not signed"
    with CRIClient(bad, timeout=5) as client:
        for call, action in [("ListPodSandbox", lambda: client.list_sandboxes()),
                             ("RunPodSandbox", lambda: client.run_sandbox(SandboxSpec("x", labels=test_labels)))]:
            started = time.monotonic()
            with pytest.raises(CRIError) as err:
                action()
            assert time.monotonic() - started < 5
            assert err.value.reason == Reason.TLS
            assert (err.value.hypervisor, err.value.call) == (hv.name, call)
            message = str(err.value)
            assert message.startswith(f"hypervisor {hv.name}: CRI {call}: TLS refused: ")
            assert hint in message
    with CRIClient(lab.hypervisors[0].local().cri_endpoint()) as client:
        assert client.list_sandboxes(test_labels) == []


def test_bad_certificate_material_is_a_config_error(lab) -> None:  # type: ignore[no-untyped-def]
    hv = lab.hypervisors[0].remote().cri_endpoint()
    with pytest.raises(CRIError) as err:
        CRIClient(_with_endpoint(hv, ca_pem="not a pem"))
    assert err.value.reason == Reason.CONFIG and err.value.call == "connect"
    with pytest.raises(CRIError, match="does not match"):
        CRIClient(_with_endpoint(hv, key_pem=pki.key_to_pem(pki.generate_key())))


@pytest.fixture
def silent_listener() -> Iterator[tuple[str, int]]:
    """A TCP port that accepts connections (kernel backlog) but never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock.getsockname()
    finally:
        sock.close()


def _unreachable_cases(lab, silent: tuple[str, int]) -> dict[str, CRIEndpoint]:  # type: ignore[no-untyped-def]
    hv = lab.hypervisors[0].remote().cri_endpoint()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    return {
        "no such socket": CRIEndpoint.unix(hv.name, "/nonexistent/containerd.sock"),
        "connection refused": _with_endpoint(hv, address=f"127.0.0.1:{port}"),
        "never answers": _with_endpoint(hv, address=f"{silent[0]}:{silent[1]}"),
    }


@pytest.mark.parametrize("case", ["no such socket", "connection refused", "never answers"])
def test_unreachable_fails_within_deadline(lab, silent_listener: tuple[str, int], case: str) -> None:  # type: ignore[no-untyped-def]
    hv = _unreachable_cases(lab, silent_listener)[case]
    with CRIClient(hv, timeout=2) as client:
        started = time.monotonic()
        with pytest.raises(CRIError) as err:
            client.version()
        elapsed = time.monotonic() - started
    assert elapsed < 3, f"took {elapsed:.1f}s"
    assert err.value.reason == Reason.UNREACHABLE, str(err.value)
    assert str(err.value).startswith(f"hypervisor {hv.name}: CRI Version: unreachable: ")


def test_parallel_reads(lab, silent_listener: tuple[str, int]) -> None:  # type: ignore[no-untyped-def]
    down = dataclasses.replace(_unreachable_cases(lab, silent_listener)["never answers"], name="lab-hv-0-down")
    hvs = [hv.remote().cri_endpoint() for hv in reversed(lab.hypervisors)] + [down]
    started = time.monotonic()
    results = read_all(hvs, lambda c: c.version().runtime_name, timeout=2)
    assert time.monotonic() - started < 3.5
    assert list(results) == sorted(hv.name for hv in hvs)
    assert [results[hv.name] for hv in lab.hypervisors] == ["containerd", "containerd"]
    assert isinstance(results["lab-hv-0-down"], CRIError)


def test_cli_reads_hypervisors_file(lab, tmp_path, test_labels: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from gitops.cli import cli
    from gitops.lab import hypervisors_yaml

    hv_file = tmp_path / "hypervisors.yaml"
    hv_file.write_text(hypervisors_yaml(lab))
    with CRIClient(lab.hypervisors[1].local().cri_endpoint()) as client:
        try:
            spec = SandboxSpec("cli-pod", labels=test_labels)
            sandbox_id = client.run_sandbox(spec)
            client.create_container(sandbox_id, ContainerSpec("cli-ctr", lab.images["pause"]), spec)
            runner = CliRunner()
            label = f"--label=gitops.test/run={test_labels['gitops.test/run']}"
            pods = runner.invoke(cli, ["cri", "pods", "-f", str(hv_file), label])
            assert pods.exit_code == 0, pods.output
            assert pods.output.splitlines()[0].split() == ["HYPERVISOR", "POD", "ID", "CREATED", "STATE",
                                                           "NAME", "NAMESPACE", "ATTEMPT"]
            [row] = pods.output.splitlines()[1:]
            assert row.split()[0] == "lab-hv-2" and row.split()[1] == sandbox_id[:13] and "cli-pod" in row
            ps = runner.invoke(cli, ["cri", "ps", "-f", str(hv_file), "-H", "lab-hv-2"])
            assert ps.exit_code == 0 and "cli-ctr" in ps.output and "created" in ps.output
            images = runner.invoke(cli, ["cri", "images", "-f", str(hv_file)])
            # an etcd image per etcd version, on each private hypervisor
            etcds = sum(1 for role in lab.images if role.startswith("etcd/"))
            private = sum(1 for hv in lab.hypervisors if not hv.public)
            assert images.exit_code == 0 and images.output.count("gitops.lab/etcd") == private * etcds
            unknown = runner.invoke(cli, ["cri", "pods", "-f", str(hv_file), "-H", "nope"])
            assert unknown.exit_code == 1 and "unknown hypervisor(s): nope" in unknown.output
            assert "Traceback" not in unknown.output
        finally:
            _cleanup(client, test_labels)


class _Unavailable(grpc.RpcError):
    """What gRPC raises for a call no connection could be picked for."""

    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


def test_a_connection_attempt_grpc_gave_up_is_retried_for_a_write_not_called_tls(tmp_path) -> None:
    """`failed to connect to all addresses ... handshaker shutdown` (gRPC shut a subchannel down while it
    connected; seen on a unix socket during a lab apply) never reached the runtime: a write is retried
    like a read within its window, and it is no TLS refusal; a certificate refused over TLS still is."""
    said = ("failed to connect to all addresses; last error: UNKNOWN: unix:/tmp/x/containerd.sock: "
            "handshaker shutdown")
    calls: list[float] = []

    def stop_container(request, timeout):  # type: ignore[no-untyped-def]
        calls.append(timeout)
        if len(calls) == 1:
            raise _Unavailable(said)
        return "stopped"

    with CRIClient(CRIEndpoint.unix("hv-1", str(tmp_path / "none.sock")), backoff=0.01) as client:
        assert client._call("StopContainer", stop_container, None, read=False) == "stopped"
        assert len(calls) == 2
        assert client._error("StopContainer", _Unavailable(said), 5).reason == Reason.UNREACHABLE
    ca = pki.create_ca("cri-test-ca")
    with CRIClient(CRIEndpoint("hv-2", address="127.0.0.1:1", ca_pem=ca.cert_pem)) as client:
        assert client._error("StopContainer", _Unavailable(said.replace("unix:/tmp/x/containerd.sock",
                                                                          "ipv4:127.0.0.1:1")), 5).reason \
            == Reason.UNREACHABLE
        refused = client._error("Version", _Unavailable("failed to connect to all addresses; last error: "
                                                       "UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake failed: "
                                                       "SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED"), 5)
        assert refused.reason == Reason.TLS


@pytest.mark.parametrize("removed", ["container", "sandbox"])
def test_a_container_still_being_started_is_removed_once_its_start_ends(lab, removed: str,  # type: ignore[no-untyped-def]
                                                                        test_labels: dict[str, str]) -> None:
    """A run killed inside StartContainer leaves the runtime starting the container on its own (issue #26):
    the next run sees it `created`, and containerd refuses to remove it (or its pod) until that start ends.
    Here the start is held open for real: its log path is a FIFO nobody reads yet, which containerd opens
    inside StartContainer. `stop_and_remove` (`stop_and_remove_sandbox`) tries again until the start ends."""
    import os
    import tempfile
    import threading

    logs = Path(tempfile.mkdtemp(prefix="gitops-starting-"))
    fifo = logs / "held.log"
    spec = SandboxSpec(f"starting-{removed}", labels=test_labels, log_directory=str(logs))
    readers: list[int] = []

    def release() -> None:  # a reader holds the FIFO open: containerd's open of the log returns, now or later
        try:
            readers.append(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        except FileNotFoundError:
            pass  # removed with its container

    try:
        starting = None
        with CRIClient(_hv(lab, "unix")) as client:
            try:
                sandbox_id = client.run_sandbox(spec)
                for delay in (0.3, 1.0, 3.0):  # until the removal finds it starting (not yet: it is simply removed)
                    if not fifo.exists():  # a container removed takes its log file with it
                        os.mkfifo(fifo)
                    container_id = client.create_container(
                        sandbox_id, ContainerSpec("held", lab.images["pause"], log_path="held.log"), spec)
                    starting = threading.Thread(target=lambda cid=container_id: _start_quietly(client, cid), daemon=True)
                    starting.start()
                    time.sleep(delay)
                    try:
                        client.remove_container(container_id)
                    except CRIError as err:
                        refused = err
                        break
                    starting.join(30)
                else:
                    raise AssertionError("containerd never held the container in its starting state")
                assert "starting" in str(refused) and client.container_status(container_id).state == ContainerState.CREATED
                released = threading.Timer(2.0, release)
                began = time.monotonic()
                released.start()
                if removed == "container":
                    client.stop_and_remove(container_id, starting_grace=30)
                else:
                    client.stop_and_remove_sandbox(sandbox_id, starting_grace=30)
                assert time.monotonic() - began >= 1.5  # it waited for the start to end, and did not give up
                assert client.list_containers(container_id=container_id) == []
                assert (client.list_sandboxes(test_labels) == []) == (removed == "sandbox")
            finally:
                release()
                if starting is not None:
                    starting.join(30)
                for fd in readers:
                    os.close(fd)
                _cleanup(client, test_labels)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _start_quietly(client: CRIClient, container_id: str) -> None:
    try:
        client.start_container(container_id)
    except CRIError:
        pass  # the log FIFO closes at once: the start may fail; either way it has ended
