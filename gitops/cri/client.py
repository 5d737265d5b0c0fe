"""A CRI runtime.v1 client for one endpoint, and a parallel read helper.

Endpoints (CRIEndpoint) are unix sockets (no authentication) or TCP with mutual
TLS (the server is verified against the endpoint's CA, the client presents its
certificate). Every call has a deadline; only idempotent reads are retried, with
exponential backoff, within that deadline. Failures raise CRIError naming the
endpoint, the call and the reason.
"""
from __future__ import annotations

import logging
import queue
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gitops.cri import convert
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError, Reason
from gitops.cri.pb import runtime_pb2 as pb
from gitops.cri.pb import runtime_pb2_grpc as pb_grpc
from gitops.cri.types import (
    Container,
    ContainerSpec,
    ContainerState,
    Image,
    RuntimeStatus,
    RuntimeVersion,
    Sandbox,
    SandboxSpec,
    SandboxState,
)
from gitops.logs import event
from gitops.keypair import key_matches_cert

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0   # seconds, for quick calls (reads, start, remove)
SLOW_TIMEOUT = 60.0      # seconds, for calls that do real work (run sandbox, create, stop)
PULL_TIMEOUT = 300.0
_PROBE_TIMEOUT = 1.0     # seconds to wait for grpc to report the channel's state
#: grpc's connectivity polling thread outlives a subscription by one 0.2s poll; closing
#: the channel under it makes that thread print a traceback (grpc/grpc#18995)
_POLL_LINGER = 0.5
_MAX_MESSAGE = 64 * 1024 * 1024
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),  # retries are ours: reads, and writes that never reached the runtime
    # a channel of its own: one closed by an observation does not hand a shutting-down connection to
    # the next client of the same endpoint (gRPC shares subchannels between channels by default)
    ("grpc.use_local_subchannel_pool", 1),
]
#: gRPC's words for a call that failed before it was sent (no connection could be picked): a write
#: that failed so never reached the runtime, and is retried like a read
_NEVER_SENT = "failed to connect to all addresses"
#: how long such a write is retried (a connection blip), not the call's whole deadline: a runtime that
#: is down fails the write soon, as it does a read's plan
_UNSENT_WINDOW = 5.0
_TLS_HINTS = re.compile(r"ssl|tls|handshake|certificate|alpn|tsi_", re.IGNORECASE)
#: gRPC's words for a connection attempt it gave up itself (the subchannel shut down while connecting):
#: no certificate was refused, so it is a connection blip (a unix socket has no TLS at all)
_CANCELLED = "handshaker shutdown"
_RETRYABLE = (Reason.UNREACHABLE,)
_TLS_EXPLAINED = [  # (substring of gRPC's message, what it means)
    ("CERTIFICATE_VERIFY_FAILED", "the server certificate is not signed by the endpoint's caCertificate"),
    ("Hostname", "the server certificate does not name the endpoint's address"),
    ("TSI_DATA_CORRUPTED", "the server rejected the client certificate (missing, or not from a CA it trusts)"),
    ("ALPN", "the server does not offer ALPN h2 (haproxy: `alpn h2` on the bind line)"),
]


def _explain_tls(details: str) -> str:
    for needle, meaning in _TLS_EXPLAINED:
        if needle.lower() in details.lower():
            return f"{meaning} ({details})"
    return details


def _check_tls_material(ep: CRIEndpoint) -> None:
    """Raise ValueError unless the CA parses and the client key belongs to the client certificate."""
    try:
        if not x509.load_pem_x509_certificates(ep.ca_pem.encode()):
            raise ValueError("no certificate found")
    except ValueError as err:
        raise ValueError(f"CA certificate: not a PEM certificate: {err}") from None
    if not (ep.cert_pem or ep.key_pem):
        return
    if not (ep.cert_pem and ep.key_pem):
        raise ValueError("a client certificate needs its private key, and the other way round")
    try:
        cert = x509.load_pem_x509_certificate(ep.cert_pem.encode())
    except ValueError as err:
        raise ValueError(f"client certificate: not a PEM certificate: {err}") from None
    try:
        key = serialization.load_pem_private_key(ep.key_pem.encode(), password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"client private key: not an unencrypted PEM private key: {err}") from None
    if not key_matches_cert(key, cert):
        raise ValueError("the client private key does not match the client certificate")


def _tls_credentials(ep: CRIEndpoint) -> grpc.ChannelCredentials:
    try:
        _check_tls_material(ep)
    except ValueError as err:
        raise CRIError(ep.name, "connect", Reason.CONFIG, str(err)) from None
    return grpc.ssl_channel_credentials(root_certificates=ep.ca_pem.encode(),
                                        private_key=ep.key_pem.encode() or None,
                                        certificate_chain=ep.cert_pem.encode() or None)


def open_channel(endpoint: CRIEndpoint) -> grpc.Channel:
    """A gRPC channel to the endpoint (nothing is dialled yet)."""
    if endpoint.socket:
        return grpc.insecure_channel(endpoint.target, options=_CHANNEL_OPTIONS)
    return grpc.secure_channel(endpoint.target, _tls_credentials(endpoint), options=_CHANNEL_OPTIONS)


class CRIClient:
    """CRI calls against one endpoint. Use as a context manager, or call close()."""

    def __init__(self, endpoint: CRIEndpoint, *, timeout: float = DEFAULT_TIMEOUT,
                 slow_timeout: float = SLOW_TIMEOUT, backoff: float = 0.2) -> None:
        if not isinstance(endpoint, CRIEndpoint):
            raise TypeError(f"CRIClient wants a CRIEndpoint, not {type(endpoint).__name__} "
                            "(a repo Hypervisor converts with .cri_endpoint())")
        self.endpoint = endpoint
        self.name = endpoint.name
        self.timeout = timeout
        self.slow_timeout = slow_timeout
        self.backoff = backoff
        self._poller_gone = 0.0  # monotonic time by which a connectivity probe's poller has exited
        self._channel = open_channel(endpoint)
        self._runtime = pb_grpc.RuntimeServiceStub(self._channel)
        self._images = pb_grpc.ImageServiceStub(self._channel)

    # ------------------------------------------------------------------ plumbing

    def __enter__(self) -> CRIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        linger = self._poller_gone - time.monotonic()
        if linger > 0:  # let the poller of a _connected() probe see it is unsubscribed
            time.sleep(linger)
        self._channel.close()

    def _connected(self) -> bool:
        """Whether the channel is connected right now (asked only after a deadline passed).

        A short subscription reads the state grpc's polling thread reports. That thread
        quits at its next poll after the unsubscribe; close() waits for that, since the
        thread would otherwise find the channel closed and print a traceback.
        """
        states: queue.SimpleQueue[grpc.ChannelConnectivity] = queue.SimpleQueue()
        report = states.put
        self._channel.subscribe(report, try_to_connect=False)
        try:
            state = states.get(timeout=_PROBE_TIMEOUT)
        except queue.Empty:
            return False
        finally:
            self._channel.unsubscribe(report)
            self._poller_gone = time.monotonic() + _POLL_LINGER
        return state is grpc.ChannelConnectivity.READY

    def _error(self, call: str, err: grpc.RpcError, timeout: float) -> CRIError:
        code: grpc.StatusCode = err.code()  # type: ignore[attr-defined]
        details: str = err.details() or code.name  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNAVAILABLE:
            if "Handshake read failed" in details or "Handshake write failed" in details:
                # TCP connected, then closed with no TLS answer: nothing (or a front with its backend
                # down, such as an haproxy before a stopped containerd) serves there
                reason = Reason.UNREACHABLE
                details = f"the endpoint never completed a TLS handshake ({details})"
            elif _TLS_HINTS.search(details) and not self.endpoint.socket and _CANCELLED not in details:
                reason, details = Reason.TLS, _explain_tls(details)
            else:
                reason = Reason.UNREACHABLE
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            connected = self._connected()
            reason = Reason.DEADLINE if connected else Reason.UNREACHABLE
            details = f"no answer within {timeout:g}s" + ("" if connected else " (not connected)")
        elif code == grpc.StatusCode.NOT_FOUND:
            reason = Reason.NOT_FOUND
        else:
            reason = Reason.RUNTIME
            details = f"{code.name}: {details}"
        return CRIError(self.name, call, reason, details)

    def _call(self, call: str, method: Callable[..., Any], request: Any, *,
              read: bool, timeout: float | None = None) -> Any:
        """Invoke one RPC with a deadline; reads are retried while the deadline allows, and writes that never
        left (no connection) for `_UNSENT_WINDOW` seconds."""
        budget = timeout or self.timeout
        begun = time.monotonic()
        deadline = begun + budget
        attempt = 0
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            started = time.monotonic()
            try:
                response = method(request, timeout=remaining)
                event(log, logging.DEBUG, "cri call", hypervisor=self.name, call=call,
                      seconds=round(time.monotonic() - started, 3))
                return response
            except grpc.RpcError as err:
                error = self._error(call, err, budget)
                unsent = _NEVER_SENT in (err.details() or "")  # type: ignore[attr-defined]
            attempt += 1
            pause = self.backoff * 2 ** (attempt - 1)
            retry = read or (unsent and time.monotonic() + pause < begun + _UNSENT_WINDOW)
            if not retry or error.reason not in _RETRYABLE or time.monotonic() + pause >= deadline:
                event(log, logging.INFO, "cri call failed", hypervisor=self.name, call=call,
                      reason=error.reason.value, attempts=attempt)
                raise error
            event(log, logging.DEBUG, "cri call retry", hypervisor=self.name, call=call,
                  attempt=attempt, error=str(error))
            time.sleep(pause)

    # ------------------------------------------------------------------ runtime

    def version(self) -> RuntimeVersion:
        r = self._call("Version", self._runtime.Version, pb.VersionRequest(version="v1"), read=True)
        return RuntimeVersion(r.runtime_name, r.runtime_version, r.runtime_api_version)

    def status(self) -> RuntimeStatus:
        r = self._call("Status", self._runtime.Status, pb.StatusRequest(), read=True)
        return convert.runtime_status(r.status)

    # ------------------------------------------------------------------ sandboxes

    def list_sandboxes(self, labels: Mapping[str, str] | None = None, *,
                       state: SandboxState | None = None) -> list[Sandbox]:
        """Pod sandboxes whose labels include `labels`, sorted by (name, created_at, id)."""
        flt = pb.PodSandboxFilter(label_selector=dict(labels or {}))
        if state is not None:
            flt.state.state = convert.SANDBOX_STATE_TO_PB[state]
        r = self._call("ListPodSandbox", self._runtime.ListPodSandbox,
                       pb.ListPodSandboxRequest(filter=flt), read=True)
        return sorted((convert.sandbox(s) for s in r.items), key=lambda s: (s.name, s.created_at, s.id))

    def sandbox_status(self, sandbox_id: str) -> Sandbox:
        r = self._call("PodSandboxStatus", self._runtime.PodSandboxStatus,
                       pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), read=True)
        return convert.sandbox_status(r.status)

    def run_sandbox(self, spec: SandboxSpec) -> str:
        """Create and start a pod sandbox; returns its id."""
        r = self._call("RunPodSandbox", self._runtime.RunPodSandbox,
                       pb.RunPodSandboxRequest(config=convert.sandbox_config(spec)),
                       read=False, timeout=self.slow_timeout)
        event(log, logging.INFO, "sandbox started", hypervisor=self.name, sandbox=spec.name,
              id=r.pod_sandbox_id)
        return str(r.pod_sandbox_id)

    def stop_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", self._runtime.StopPodSandbox,
                   pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), read=False,
                   timeout=self.slow_timeout)

    def remove_sandbox(self, sandbox_id: str) -> None:
        """Remove a (stopped) sandbox and all its containers."""
        self._call("RemovePodSandbox", self._runtime.RemovePodSandbox,
                   pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), read=False,
                   timeout=self.slow_timeout)

    # ------------------------------------------------------------------ containers

    def list_containers(self, labels: Mapping[str, str] | None = None, *,
                        sandbox_id: str = "", state: ContainerState | None = None,
                        container_id: str = "") -> list[Container]:
        """Containers whose labels include `labels`, sorted by (name, created_at, id)."""
        flt = pb.ContainerFilter(id=container_id, pod_sandbox_id=sandbox_id,
                                 label_selector=dict(labels or {}))
        if state is not None:
            flt.state.state = convert.CONTAINER_STATE_TO_PB[state]
        r = self._call("ListContainers", self._runtime.ListContainers,
                       pb.ListContainersRequest(filter=flt), read=True)
        return sorted((convert.container(c) for c in r.containers),
                      key=lambda c: (c.name, c.created_at, c.id))

    def container_status(self, container_id: str) -> Container:
        """Full status of one container (exit code, times, reason...)."""
        r = self._call("ContainerStatus", self._runtime.ContainerStatus,
                       pb.ContainerStatusRequest(container_id=container_id), read=True)
        listed = self.list_containers(container_id=r.status.id or container_id)
        sandbox_id = listed[0].sandbox_id if listed else ""
        return convert.container_status(r.status, sandbox_id)

    def create_container(self, sandbox_id: str, spec: ContainerSpec,
                         sandbox: SandboxSpec | None = None) -> str:
        """Create (not start) a container in a sandbox; returns its id.

        CRI wants the sandbox's config again; without `sandbox`, it is rebuilt from the
        sandbox's status.
        """
        if sandbox is None:
            sandbox_config = convert.sandbox_config_from_status(self._raw_sandbox_status(sandbox_id))
        else:
            sandbox_config = convert.sandbox_config(sandbox)
        host_network = (sandbox_config.linux.security_context.namespace_options.network
                        == pb.NODE)
        request = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id,
            config=convert.container_config(spec, host_network=host_network),
            sandbox_config=sandbox_config)
        r = self._call("CreateContainer", self._runtime.CreateContainer, request, read=False,
                       timeout=self.slow_timeout)
        event(log, logging.INFO, "container created", hypervisor=self.name,
              container=spec.name, id=r.container_id)
        return str(r.container_id)

    def _raw_sandbox_status(self, sandbox_id: str) -> pb.PodSandboxStatus:
        r = self._call("PodSandboxStatus", self._runtime.PodSandboxStatus,
                       pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), read=True)
        return r.status

    def start_container(self, container_id: str) -> None:
        self._call("StartContainer", self._runtime.StartContainer,
                   pb.StartContainerRequest(container_id=container_id), read=False,
                   timeout=self.slow_timeout)

    def stop_container(self, container_id: str, timeout: int = 10) -> None:
        """Stop with SIGTERM, then SIGKILL after `timeout` seconds."""
        self._call("StopContainer", self._runtime.StopContainer,
                   pb.StopContainerRequest(container_id=container_id, timeout=timeout),
                   read=False, timeout=timeout + self.slow_timeout)

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", self._runtime.RemoveContainer,
                   pb.RemoveContainerRequest(container_id=container_id), read=False,
                   timeout=self.slow_timeout)

    def stop_and_remove(self, container_id: str, starting_grace: float = 60.0,
                        fenced: Callable[[], str | None] = lambda: None) -> None:
        """Stop and remove a container; one already gone is success. One the runtime reports `created`
        may be starting right now (a StartContainer whose caller was killed: the runtime finishes it on
        its own) and cannot be removed until that ends: removal is tried again for up to
        `starting_grace` seconds, unless `fenced` says why this process may no longer act."""
        def remove() -> None:
            self.stop_container(container_id)
            self.remove_container(container_id)

        def starting() -> bool | None:
            state = self._state(container_id)
            return None if state is None else state == ContainerState.CREATED
        self._remove_unless_starting(f"container {container_id[:12]}", remove, starting, starting_grace, fenced)

    def stop_and_remove_sandbox(self, sandbox_id: str, starting_grace: float = 60.0,
                                fenced: Callable[[], str | None] = lambda: None) -> None:
        """Stop and remove a pod sandbox with its containers; one already gone is success. Removal is
        tried again while one of its containers is `created` (maybe starting: see `stop_and_remove`)."""
        def remove() -> None:
            self.stop_sandbox(sandbox_id)
            self.remove_sandbox(sandbox_id)

        def starting() -> bool:
            return any(c.state == ContainerState.CREATED for c in self.list_containers(sandbox_id=sandbox_id))
        self._remove_unless_starting(f"pod sandbox {sandbox_id[:12]}", remove, starting, starting_grace, fenced)

    def _remove_unless_starting(self, what: str, remove: Callable[[], None], starting: Callable[[], bool | None],
                                grace: float, fenced: Callable[[], str | None]) -> None:
        """`remove()` until it succeeds or finds nothing; after a refusal, again every 0.5 s for up to
        `grace` seconds while `starting()` (None: gone meanwhile, success), unless `fenced()` says why not."""
        deadline = time.monotonic() + grace
        while True:
            try:
                remove()
                return
            except CRIError as err:
                if err.reason == Reason.NOT_FOUND:
                    return
                now = starting()
                if now is None:
                    return
                if not now or time.monotonic() > deadline:
                    raise
                why = fenced()
                if why:
                    raise CRIError(self.endpoint.name, err.call, err.reason,
                                   f"{err.detail}; not removed again while fenced: {why}") from err
                log.info("%s on %s may be starting (%s): removing it again", what, self.endpoint.name, err)
                time.sleep(0.5)

    def _state(self, container_id: str) -> ContainerState | None:
        """The container's state as the runtime reports it; None when it is gone."""
        try:
            return self.container_status(container_id).state
        except CRIError as err:
            if err.reason == Reason.NOT_FOUND:
                return None
            return ContainerState.UNKNOWN

    def exec_sync(self, container_id: str, cmd: Iterable[str], timeout: int = 10) -> tuple[int, bytes, bytes]:
        """Run a command in a container; returns (exit code, stdout, stderr)."""
        r = self._call("ExecSync", self._runtime.ExecSync,
                       pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout),
                       read=False, timeout=timeout + self.timeout)
        return int(r.exit_code), bytes(r.stdout), bytes(r.stderr)

    # ------------------------------------------------------------------ images

    def list_images(self) -> list[Image]:
        """All images, sorted by (first tag, id)."""
        r = self._call("ListImages", self._images.ListImages, pb.ListImagesRequest(), read=True)
        return sorted((convert.image(i) for i in r.images),
                      key=lambda i: (i.repo_tags[:1] or ("",), i.id))

    def image_status(self, ref: str) -> Image | None:
        """The image `ref` names, or None if the hypervisor does not have it."""
        r = self._call("ImageStatus", self._images.ImageStatus,
                       pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)), read=True)
        return convert.image(r.image) if r.image.id else None

    def pull_image(self, ref: str, *, always: bool = False, timeout: float = PULL_TIMEOUT) -> str:
        """Make sure the hypervisor has `ref`; returns the image id.

        Like kubelet's IfNotPresent: an image already present is not pulled again (the
        runtime would otherwise ask the registry), unless `always`.
        """
        if not always:
            present = self.image_status(ref)
            if present is not None:
                return present.id
        r = self._call("PullImage", self._images.PullImage,
                       pb.PullImageRequest(image=pb.ImageSpec(image=ref)), read=False, timeout=timeout)
        return str(r.image_ref)


def connect(endpoint: CRIEndpoint, **kwargs: Any) -> CRIClient:
    """A client for `endpoint` (see CRIClient for keyword arguments)."""
    return CRIClient(endpoint, **kwargs)


def read_all(endpoints: Iterable[CRIEndpoint], read: Callable[[CRIClient], T], *,
             timeout: float = DEFAULT_TIMEOUT, max_workers: int = 8) -> dict[str, T | CRIError]:
    """Run the read-only `read(client)` on every endpoint in parallel threads.

    Returns name -> result, or name -> CRIError for endpoints that failed, ordered by
    name. Only use this for reads: writes must go to one endpoint at a time.
    """
    eps = sorted(endpoints, key=lambda e: e.name)

    def one(ep: CRIEndpoint) -> T | CRIError:
        try:
            with CRIClient(ep, timeout=timeout) as client:
                return read(client)
        except CRIError as err:
            return err

    if not eps:
        return {}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(eps)),
                            thread_name_prefix="cri-read") as pool:
        results = list(pool.map(one, eps))
    return {ep.name: result for ep, result in zip(eps, results)}
