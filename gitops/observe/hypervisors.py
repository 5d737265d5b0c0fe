"""Reads the managed pods, containers and node files on every hypervisor, in parallel (read-only).

One that cannot be reached is reported as such (`reachable=False`), and later stages never
plan anything on it, deletions least of all. What it reports: `gitops.observe.types`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

from gitops.agent import read_node_files
from gitops.cri.client import CRIClient, read_all
from gitops.cri.errors import CRIError
from gitops.cri.types import SandboxState
from gitops.model.resources import Hypervisor
from gitops.observe.types import FilesReuse, ObservedContainer, ObservedHypervisor, ObservedPod, ObservedState
from gitops.pods import (
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
)

log = logging.getLogger(__name__)


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
    """Observe every hypervisor in parallel (but those marked lost: they are reported lost, never asked);
    unreachable ones are marked, not raised. `reuse`: node files known from an earlier observation, not
    read again (see `gitops.status.poll`)."""
    hypervisors = list(hypervisors)
    results = read_all([hv.cri_endpoint() for hv in hypervisors if not hv.lost],
                       partial(observe_hypervisor, reuse=reuse), timeout=timeout)
    out = {hv.name: ObservedHypervisor(hv.name, reachable=False, error="marked lost (spec.lost)", lost=True)
           for hv in hypervisors if hv.lost}
    for name, result in results.items():
        if isinstance(result, CRIError):
            log.info("hypervisor unreachable: %s", result)
            out[name] = ObservedHypervisor(name=name, reachable=False,
                                           error=f"CRI {result.call}: {result.reason.value}: {result.detail}")
        else:
            out[name] = result
    return ObservedState(dict(sorted(out.items())))
