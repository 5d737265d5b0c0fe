"""Live state: the managed pods, containers and node files on every hypervisor
(and, in `gitops.observe.clusters`, what gitops keeps inside each cluster's API).

Reads only. Hypervisors are read in parallel; one that cannot be reached is
reported as such (`reachable=False`), and later stages never plan anything on
it, deletions least of all.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from gitops.cri.client import CRIClient, read_all
from gitops.cri.errors import CRIError
from gitops.cri.types import ContainerState, SandboxState
from gitops.memo import ContentDigested
from gitops.model.resources import BareMetalHost, Hypervisor
from gitops.observe.clusters import ObservedCluster
from gitops.node import (
    AGENT,
    CERTIFICATES_ANNOTATION,
    CLUSTER,
    COMPONENT,
    MANAGED,
    MANAGER,
    NODE,
    ROLE,
    SPEC_ANNOTATION,
    SPEC_HASH,
    NodeFiles,
    read_node_files,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ObservedContainer:
    id: str
    component: str
    state: str  # created | running | exited | unknown
    spec_hash: str
    created_at: int
    #: the inputs the container was created from: its spec annotation as compact JSON text (a dict given
    #: is stored so), decoded by `inputs` only when a diff shows what changed
    spec: str | None = None
    #: the digests of the certificates it read when it started (its certificates annotation, JSON text);
    #: None for a container started without one
    certificates: str | None = None

    def __post_init__(self) -> None:
        if self.spec is not None and not isinstance(self.spec, str):
            object.__setattr__(self, "spec", json.dumps(self.spec, sort_keys=True, separators=(",", ":")))
        if self.spec is not None:
            object.__setattr__(self, "spec", sys.intern(self.spec))  # shared with the compiled annotation

    @property
    def inputs(self) -> dict[str, Any] | None:
        """The spec annotation, decoded (None when absent or unreadable)."""
        try:
            return json.loads(self.spec) if self.spec is not None else None
        except ValueError:
            return None

    @property
    def read_certificates(self) -> dict[str, str] | None:
        """Certificate name -> digest of its file when the container started (None: not recorded)."""
        try:
            value = json.loads(self.certificates) if self.certificates is not None else None
        except ValueError:
            return None
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return None
        return value


class _PodSlots(ContentDigested):
    """`_once`: the pod's content digest; `_by_component`: its newest running container of each component."""

    __slots__ = ("_by_component",)


@dataclass(frozen=True, slots=True)
class ObservedPod(_PodSlots):
    sandbox_id: str
    node: str
    cluster: str
    role: str
    hypervisor: str
    ready: bool
    spec_hash: str
    created_at: int
    containers: tuple[ObservedContainer, ...] = ()
    #: None when the files agent is not running (nothing could be read)
    files: NodeFiles | None = None

    def running(self, component: str) -> ObservedContainer | None:
        """The newest running container of `component`."""
        return self._kept("_by_component", self._running_by_component).get(component)

    def _running_by_component(self) -> dict[str, ObservedContainer]:
        out: dict[str, ObservedContainer] = {}
        for c in sorted(self.containers, key=lambda c: -c.created_at):
            if c.state == ContainerState.RUNNING.value:
                out.setdefault(c.component, c)
        return out


@dataclass(frozen=True, slots=True)
class ObservedHypervisor:
    name: str
    reachable: bool
    error: str = ""
    pods: tuple[ObservedPod, ...] = ()


@dataclass(frozen=True)
class ObservedState:
    hypervisors: dict[str, ObservedHypervisor]
    #: BareMetalHosts listed from a kubernetes provider (None when not observed)
    hosts: tuple[BareMetalHost, ...] | None = None
    #: each cluster's own API, for clusters with a running API server (see gitops.observe.clusters)
    clusters: dict[str, ObservedCluster] = field(default_factory=dict)

    def pods(self) -> list[ObservedPod]:
        return [p for hv in self.hypervisors.values() for p in hv.pods]

    @property
    def unreachable(self) -> list[str]:
        return sorted(n for n, hv in self.hypervisors.items() if not hv.reachable)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"hypervisors": {n: asdict(hv) for n, hv in sorted(self.hypervisors.items())}}
        if self.hosts is not None:
            data["bareMetalHosts"] = [asdict(h) for h in self.hosts]
        if self.clusters:
            data["clusters"] = {n: c.to_dict() for n, c in sorted(self.clusters.items())}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ObservedState":
        hvs = {}
        for name, raw in data.get("hypervisors", {}).items():
            pods = []
            for p in raw.get("pods", []):
                files = p.get("files")
                pods.append(ObservedPod(
                    **{k: v for k, v in p.items() if k not in ("containers", "files")},
                    containers=tuple(ObservedContainer(**c) for c in p.get("containers", [])),
                    files=NodeFiles(files["digests"], files["certificates"], tuple(files["keys"]),
                                    files["public_keys"]) if files is not None else None,
                ))
            hvs[name] = ObservedHypervisor(raw["name"], raw["reachable"], raw.get("error", ""), tuple(pods))
        hosts = data.get("bareMetalHosts")
        clusters = {n: ObservedCluster.from_dict(c) for n, c in data.get("clusters", {}).items()}
        return cls(hvs, tuple(BareMetalHost(**h) for h in hosts) if hosts is not None else None, clusters)


#: node files read earlier that still hold for a pod as listed now (None: read them now)
FilesReuse = Callable[[ObservedPod], "NodeFiles | None"]


def observe_hypervisor(client: CRIClient, reuse: FilesReuse | None = None) -> ObservedHypervisor:
    name = client.name
    selector = {MANAGED: MANAGER}
    sandboxes = client.list_sandboxes(selector)
    containers = client.list_containers(selector)
    by_sandbox: dict[str, list[ObservedContainer]] = {}
    for c in containers:
        spec = c.annotations.get(SPEC_ANNOTATION) or None
        by_sandbox.setdefault(c.sandbox_id, []).append(ObservedContainer(
            id=c.id, component=c.labels.get(COMPONENT, c.name), state=c.state.value,
            spec_hash=c.labels.get(SPEC_HASH, ""), created_at=c.created_at, spec=spec,
            certificates=c.annotations.get(CERTIFICATES_ANNOTATION)))
    pods = []
    for s in sandboxes:
        owned = tuple(sorted(by_sandbox.get(s.id, []), key=lambda c: (c.component, c.created_at, c.id)))
        pod = ObservedPod(
            sandbox_id=s.id, node=s.labels.get(NODE, s.name), cluster=s.labels.get(CLUSTER, s.namespace),
            role=s.labels.get(ROLE, ""), hypervisor=name, ready=s.state == SandboxState.READY,
            spec_hash=s.labels.get(SPEC_HASH, ""), created_at=s.created_at, containers=owned)
        agent = pod.running(AGENT) if pod.ready else None
        files = None
        if agent is not None:
            files = reuse(pod) if reuse is not None else None
            files = files if files is not None else read_node_files(client, agent.id)
        pods.append(ObservedPod(**{**_fields(pod), "files": files}))
    pods.sort(key=lambda p: (p.node, p.created_at, p.sandbox_id))
    return ObservedHypervisor(name=name, reachable=True, pods=tuple(pods))


def _fields(pod: ObservedPod) -> dict[str, Any]:
    return {f: getattr(pod, f) for f in pod.__dataclass_fields__}


def observe(hypervisors: Iterable[Hypervisor], *, timeout: float = 10.0,
            reuse: FilesReuse | None = None) -> ObservedState:
    """Observe every hypervisor in parallel; unreachable ones are marked, not raised. `reuse`: node
    files known from an earlier observation, not read again (see `gitops.status.poll`)."""
    results = read_all([hv.cri_endpoint() for hv in hypervisors], partial(observe_hypervisor, reuse=reuse),
                       timeout=timeout)
    out = {}
    for name, result in results.items():
        if isinstance(result, CRIError):
            log.info("hypervisor unreachable: %s", result)
            out[name] = ObservedHypervisor(name=name, reachable=False,
                                           error=f"CRI {result.call}: {result.reason.value}: {result.detail}")
        else:
            out[name] = result
    return ObservedState(dict(sorted(out.items())))
