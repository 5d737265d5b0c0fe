"""What every apply handler shares: the run's recorded state and connections, the pods and files it made, and
the helpers the handler families use (a CRI client per hypervisor, a node's pod and files agent, a cluster's
signers, its etcd and its API, the fence every wait asks)."""
from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gitops import agent
from gitops.apply.etcd import EtcdAdmin
from gitops.cri.client import CRIClient
from gitops.errors import GitopsError
from gitops.kubeapi import Credentials, KubeAPI
from gitops.model.config import BackupTarget
from gitops.pki import CertKey
from gitops.plan.actions import Action, Plan
from gitops.plan.payloads import CreateContainer, FileSpec, PodRef
from gitops.sip.hosts import BMHProvider
from gitops.state.records import State
from gitops.state.store import StateStore

#: seconds a container the runtime is still starting (a killed run's StartContainer) may take to be removable
STARTING_GRACE = 60.0

Progress = Callable[[int, int, Action, str], None]
#: asked before every action: why it must not start now (a lost or stale Lease), or None to go on
Fence = Callable[[Action], "str | None"]


class StopRequested(GitopsError):
    """A stop was asked for during a long wait (a wave's soak): the run ends there as stopped, not failed."""


@dataclass(frozen=True)
class Timing:
    """When an action of the plan started (seconds from the run's start) and the seconds it took."""

    started: float
    seconds: float


class ApplyError(GitopsError):
    """An action failed; the run stopped there (the other clusters of a batch applied at once, after the action
    each had in flight). `executed` holds the actions done, `done` and `failed` their plan indices."""

    def __init__(self, message: str, executed: list[Action] | None = None):
        super().__init__(message)
        self.executed = list(executed or [])
        #: the plan that was being executed
        self.plan: Plan | None = None
        #: by plan index: when each action done and each failed one ran
        self.done: dict[int, Timing] = {}
        self.failed: dict[int, Timing] = {}
        #: a rollout wave breached its SLO: (wave, cluster, breach), None for any other failure
        self.halted: tuple[str, str, str] | None = None


def _no_target(name: str) -> BackupTarget:
    raise ApplyError(f"backup target {name} is not known to this apply (pass the repo settings' targets)")


@dataclass
class Connections:
    """How apply reaches what it changes: a CRI client per hypervisor name, the BareMetalHost provider."""

    cri: Callable[[str], CRIClient]
    hosts: Callable[[State], BMHProvider]
    #: a backup target by name (`spec.backup.targets`: its repository and password stay out of plans)
    backup_target: Callable[[str], BackupTarget] = field(default=lambda name: _no_target(name))


@dataclass
class Execution:
    #: the actions done, in the order they ended
    executed: list[Action] = field(default_factory=list)
    #: by plan index: when each action done ran
    done: dict[int, Timing] = field(default_factory=dict)
    #: stopped on request before the end of the plan
    stopped: bool = False
    #: what turned out other than the plan assumed (the follow-up plan shows what it takes)
    surprises: list[str] = field(default_factory=list)
    #: why the fence stopped the run before an action ("" when it did not)
    fenced: str = ""


class Run:
    """One execution of a plan: its state (saved as it changes), its clients, what it made so far.

    The clusters of a batch apply at once (`gitops.plan.waves.steps`), each in a thread: a handler changes the
    recorded state only inside `recording()`, which one thread holds at a time and which saves it."""

    def __init__(self, state: State, connections: Connections, store: StateStore):
        self.state = state
        self.connections = connections
        self.store = store
        self.clients: dict[str, CRIClient] = {}
        self.provider: BMHProvider | None = None
        #: pods created by this run: node -> (sandbox id, agent id)
        self.pods: dict[str, PodRef] = {}
        #: digests of the files this run wrote: node -> file name -> digest
        self.written: dict[str, dict[str, str]] = {}
        self.outcome = Execution()
        self.now = dt.datetime.now(dt.timezone.utc)
        self.fence: Fence | None = None
        #: asked during long waits (a soak): True ends the run as stopped
        self.should_stop: Callable[[], bool] = lambda: False
        #: the state changed since the last save in a way no handler saves (a cluster's running commit)
        self.unsaved = False
        #: rollout waves being watched, by name (`gitops.apply.waves`: each has a stop())
        self.watches: dict[str, Any] = {}
        self._lock = threading.RLock()

    def close(self) -> None:
        for watch in self.watches.values():
            watch.stop()
        self.watches.clear()
        for client in self.clients.values():
            client.close()

    def client(self, hypervisor: str) -> CRIClient:
        with self._lock:
            if hypervisor not in self.clients:
                self.clients[hypervisor] = self.connections.cri(hypervisor)
            return self.clients[hypervisor]

    def save(self) -> None:
        with self._lock:
            self.store.save(self.state)
            self.unsaved = False

    def save_progress(self) -> None:
        """Save what only counts (a rolling wave's probe figures): a store that publishes each save may publish
        these less often (`save_progress`, as `gitops.status.replica.WriteAhead` does)."""
        with self._lock:
            getattr(self.store, "save_progress", self.store.save)(self.state)
            self.unsaved = False

    @contextmanager
    def recording(self, save: bool = True) -> Iterator[State]:
        """The recorded state to change, held by this thread alone, then saved (or, `save` False, left for the
        next save: `unsaved`)."""
        with self._lock:
            yield self.state
            if save:
                self.save()
            else:
                self.unsaved = True

    def pod(self, action: Action, ref: PodRef) -> PodRef:
        """The pod's ids: from the plan, or from the `create-pod` action that ran earlier in this plan."""
        created = self.pods.get(action.node)
        sandbox_id = ref.sandbox_id or (created.sandbox_id if created else "")
        agent_id = (created.agent_id if created and created.sandbox_id == sandbox_id else "") or ref.agent_id
        if not sandbox_id:
            raise ApplyError(f"the pod of Node {action.node} was to be created earlier in this plan, but was not")
        return PodRef(sandbox_id, agent_id)

    def agent_id(self, action: Action, ref: PodRef) -> str:
        found = self.pod(action, ref).agent_id
        if not found:
            raise ApplyError(f"the files agent of Node {action.node} is not running on {action.hypervisor}")
        return found

    def content(self, spec: FileSpec) -> str:
        """A file's content; a service-account bundle is read from the keys recorded by now."""
        if spec.bundle is None:
            return spec.content
        record = self.state.clusters[spec.bundle.cluster]
        missing = [n for n in spec.bundle.generated if n not in record.service_account_keys]
        if missing:
            raise ApplyError(f"{spec.name}: no service-account key recorded for {', '.join(missing)}")
        return "".join(record.trusted_service_account_keys())

    def certificate_digests(self, action: Action, p: CreateContainer) -> dict[str, str]:
        """The digests of the certificates a container starting now reads that the plan could not know:
        from what this run wrote, else as the files agent reads them now."""
        unknown = p.certificates_after_apply
        digests: dict[str, str] = {}
        if unknown:
            written = self.written.get(action.node, {})
            listed = None
            if any(f"{n}.crt" not in written for n in unknown):
                listed = agent.read_node_files(self.client(action.hypervisor), self.agent_id(action, p.pod))
            for name in unknown:
                found = written.get(f"{name}.crt") or (listed.digests.get(f"{name}.crt") if listed else None)
                if found is None:
                    raise ApplyError(f"certificate {name} of Node {action.node} is not on its hypervisor")
                digests[name] = found
        return digests

    def refused(self, action: Action) -> str | None:
        """Why this controller may no longer act on `action`'s cluster (asked by every wait), or None."""
        return self.fence(action) if self.fence is not None else None

    def signer(self, cluster: str, role: str) -> CertKey:
        """The recorded authority of `role` ("cluster", "etcd", "front-proxy") that signs for `cluster`."""
        record = self.state.clusters[cluster].authorities[role]
        return CertKey.from_pem(record.cert_pem, record.key_pem)

    def etcd(self, action: Action, client_urls: tuple[str, ...], cluster: str = "") -> EtcdAdmin:
        """An etcd admin for `action`'s cluster (or `cluster`: a rollout wave's action has none) whose waits end
        with this controller's right to act."""
        cluster = cluster or action.cluster
        record = self.state.clusters[cluster]
        return EtcdAdmin(self.signer(cluster, "etcd"), list(client_urls), record.trust_bundle("etcd"),
                         fenced=lambda: self.refused(action))

    def api(self, cluster: str, server: str, timeout: float = 10.0, *, fresh_connections: bool = False) -> KubeAPI:
        """The cluster's API as its admin (credentials from the recorded state, in memory only); see KubeAPI for
        `fresh_connections`."""
        record = self.state.clusters[cluster]
        if record.admin is None:
            raise ApplyError(f"cluster {cluster} has no admin credential recorded")
        return KubeAPI(server, record.trust_bundle("cluster"),
                       Credentials(record.admin.cert_pem, record.admin.key_pem), timeout=timeout,
                       fresh_connections=fresh_connections)

    def until_ready(self, action: Action, api: KubeAPI, path: str, deadline: float, what: str,
                     timed_out: Callable[[str], str]) -> None:
        """Until `api` answers `path` with `ok`, every 0.5 s: ApplyError(`timed_out(why not)`) past `deadline`
        (time.monotonic()), or as soon as this controller is fenced (a wait is no CRI call: it ends with the Lease)."""
        while last := api.not_ready(path):
            if time.monotonic() > deadline:
                raise ApplyError(timed_out(last))
            refused = self.refused(action)
            if refused:
                raise ApplyError(f"fenced while waiting for {what}: {refused}")
            time.sleep(0.5)

    def remove_container(self, hypervisor: str, container_id: str, action: Action) -> None:
        """Stop and remove it (waiting while the runtime may still be starting it; fenced like any wait)."""
        self.client(hypervisor).stop_and_remove(container_id, STARTING_GRACE, lambda: self.refused(action))

    def forget(self, node: str, cluster: str) -> None:
        """The node left the repo and its pod is gone: free its ports and records."""
        with self.recording() as state:
            state.nodes.pop(node, None)
            record = state.clusters.get(cluster)
            if record is not None:
                record.retire_service_account_key(node)
                record.etcd_members = [m for m in record.etcd_members if m != node]
                record.etcd_learners = [m for m in record.etcd_learners if m != node]
