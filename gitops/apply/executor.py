"""Serial execution of a plan: exactly its actions, in its order, and nothing else.

Apply decides nothing. Each action carries its payload (`gitops.plan.payloads`):
the sandbox and container specs, the certificates to issue, the etcd URLs, the
labels, the approval condition. The only values apply produces are the ones a
plan shows as `(known after apply)`: ids of the pods it creates, public keys
generated on a node (and the service-account bundle made of them), certificates
signed from a node's request, and those files' digests in the spec hash and
annotations of the containers reading them (`CreateContainer.resolved`). The
first failure stops the run with a message naming the action; every action is
safe to repeat, so a re-run after a crash (even SIGKILL) observes what exists
and plans only what is missing.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gitops import agent
from gitops.apply.etcd import EtcdAdmin
from gitops.backup.restic import Restic
from gitops.backup.take import back_up
from gitops.cri.client import CRIClient
from gitops.cri.errors import CRIError, Reason
from gitops.cri.types import ContainerState
from gitops.errors import GitopsError
from gitops.etcdclient import client_context
from gitops.kubeapi import Credentials, KubeAPI
from gitops.model.config import BackupTarget
from gitops.pki import CertKey, load_csr_pem, sign_public_key
from gitops.pki.x509 import cert_to_pem
from gitops.plan.actions import Action, Plan
from gitops.plan.payloads import (
    ApiReady,
    BackupEtcd,
    FileSpec,
    CreateContainer,
    CreatePod,
    EtcdAlarm,
    EtcdHealth,
    EtcdMemberChange,
    GenerateKeys,
    LabelHost,
    PodRef,
    PutObject,
    RecoverEtcd,
    Reload,
    Remove,
    RestoreEtcd,
    RestoreMember,
    RotationStep,
    SignRequest,
    WriteFiles,
)
from gitops.pods import AGENT, RESTORE_LABEL, SPEC_HASH, file_digest
from gitops.sip.hosts import BMHProvider
from gitops.sip.providers import apply_change
from gitops.sip.selection import LabelChange
from gitops.state.records import State
from gitops.state.store import StateStore

log = logging.getLogger(__name__)
#: seconds `etcdctl snapshot restore` may take on one member (a full 8 GiB database: minutes)
RESTORE_TIMEOUT = 1800
#: seconds a container the runtime is still starting (a killed run's StartContainer) may take to be removable
STARTING_GRACE = 60.0

Progress = Callable[[int, int, Action, str], None]
#: asked before every action: why it must not start now (a lost or stale Lease), or None to go on
Fence = Callable[[Action], "str | None"]


class ApplyError(GitopsError):
    """An action failed; the run stopped there. `executed` holds the actions done before it."""

    def __init__(self, message: str, executed: list[Action] | None = None):
        super().__init__(message)
        self.executed = list(executed or [])
        #: the plan that was being executed
        self.plan: Plan | None = None
        #: seconds each action took, the failed one last
        self.seconds: list[float] = []


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
    executed: list[Action] = field(default_factory=list)
    #: stopped on request before the end of the plan
    stopped: bool = False
    #: what turned out other than the plan assumed (the follow-up plan shows what it takes)
    surprises: list[str] = field(default_factory=list)
    #: why the fence stopped the run before an action ("" when it did not)
    fenced: str = ""
    #: seconds each executed action took
    seconds: list[float] = field(default_factory=list)


def execute(plan: Plan, state: State, connections: Connections, store: StateStore, *,
            progress: Progress | None = None, should_stop: Callable[[], bool] = lambda: False,
            fence: Fence | None = None) -> Execution:
    """Run `plan`'s actions in order against `state` (the plan's recorded state, saved as it changes).
    `fence`: checked before each action; a refusal stops the run there (the call in flight finished)."""
    runner = _Runner(state.copy(), connections, store, progress)
    try:
        return runner.run(plan.actions, should_stop, fence)
    finally:
        runner.close()


class _Runner:
    def __init__(self, state: State, connections: Connections, store: StateStore, progress: Progress | None):
        self.state = state
        self.connections = connections
        self.store = store
        self.progress = progress
        self.clients: dict[str, CRIClient] = {}
        self.provider: BMHProvider | None = None
        #: pods created by this run: node -> (sandbox id, agent id)
        self.pods: dict[str, PodRef] = {}
        #: digests of the files this run wrote: node -> file name -> digest
        self.written: dict[str, dict[str, str]] = {}
        self.outcome = Execution()
        self.now = dt.datetime.now(dt.timezone.utc)
        self.fence: Fence | None = None

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def client(self, hypervisor: str) -> CRIClient:
        if hypervisor not in self.clients:
            self.clients[hypervisor] = self.connections.cri(hypervisor)
        return self.clients[hypervisor]

    def save(self) -> None:
        self.store.save(self.state)

    def run(self, actions: tuple[Action, ...], should_stop: Callable[[], bool],
            fence: Fence | None = None) -> Execution:
        self.fence = fence
        for index, action in enumerate(actions):
            if should_stop():
                log.info("stop requested; %d of %d actions done", index, len(actions))
                self.outcome.stopped = True
                return self.outcome
            refused = self.refused(action)
            if refused:
                log.warning("fenced: %s; %d of %d actions done", refused, index, len(actions))
                self.outcome.stopped, self.outcome.fenced = True, refused
                return self.outcome
            self._report(index, len(actions), action, "start")
            began = time.monotonic()
            try:
                if action.payload is None:
                    raise ApplyError("the action carries no payload (a plan from an older gitops?)")
                getattr(self, action.kind.value.replace("-", "_"))(action, action.payload)
            except (GitopsError, OSError) as err:
                self._report(index, len(actions), action, "failed")
                failed = ApplyError(f"action {index + 1}/{len(actions)} failed: {action.symbol} {action.subject} "
                                    f"{action.kind.value}: {err}", self.outcome.executed)
                failed.seconds = [*self.outcome.seconds, round(time.monotonic() - began, 3)]
                raise failed from None
            self.outcome.seconds.append(round(time.monotonic() - began, 3))
            self.outcome.executed.append(action)
            self._report(index, len(actions), action, "done")
        return self.outcome

    def _report(self, index: int, total: int, action: Action, status: str) -> None:
        log.info("action %s", status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                            "subject": action.subject})
        if self.progress is not None:
            self.progress(index, total, action, status)

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

    # ------------------------------------------------------------ one method per Kind (its value, dashes as _)

    def create_pod(self, action: Action, p: CreatePod) -> None:
        client = self.client(action.hypervisor)
        for image in p.images:
            client.pull_image(image)
        record = self.state.clusters.get(action.cluster)
        if p.bootstrap_members and record is not None and not record.etcd_members:
            record.etcd_members = list(p.bootstrap_members)  # the initial members start together
            self.save()
        sandbox_id = client.run_sandbox(p.sandbox)
        agent_id = client.create_container(sandbox_id, p.agent, p.sandbox)
        client.start_container(agent_id)
        self.pods[action.node] = PodRef(sandbox_id, agent_id)

    def generate_keys(self, action: Action, p: GenerateKeys) -> None:
        client = self.client(action.hypervisor)
        agent_id = self.agent_id(action, p.pod)
        for key in p.keys:
            public = agent.public_key(client, agent_id, key.name)
            if key.purpose != "service-account":
                continue
            record = self.state.clusters[action.cluster]
            before = record.service_account_keys.get(action.node)
            if before is not None and before != public:
                self.outcome.surprises.append(f"Node {action.node}: its service-account key was regenerated "
                                              "(the old one was gone); every API server must trust the new one")
            record.set_service_account_key(action.node, public)
        self.save()

    def content(self, spec: FileSpec) -> str:
        """A file's content; a service-account bundle is read from the keys recorded by now."""
        if spec.bundle is None:
            return spec.content
        record = self.state.clusters[spec.bundle.cluster]
        missing = [n for n in spec.bundle.generated if n not in record.service_account_keys]
        if missing:
            raise ApplyError(f"{spec.name}: no service-account key recorded for {', '.join(missing)}")
        return "".join(record.trusted_service_account_keys())

    def write_files(self, action: Action, p: WriteFiles) -> None:
        client = self.client(action.hypervisor)
        agent_id = self.agent_id(action, p.pod)
        # everything is computed (contents, requests, signatures) before the first write, then written as
        # one batch: a failure anywhere leaves the node's old files whole
        batch = {spec.name: self.content(spec) for spec in p.files}
        for issue in p.certificates:
            spec = issue.spec
            csr = load_csr_pem(agent.certificate_request(client, agent_id, spec.name))
            cert = sign_public_key(
                self.signer(p.cluster, spec.signer), csr.public_key(), spec.common_name,
                organizations=spec.organizations, dns_names=spec.dns_names, ip_addresses=spec.ip_addresses,
                server=spec.server, client=spec.client, days=issue.days, now=self.now)
            batch[f"{spec.name}.crt"] = cert_to_pem(cert) + issue.chain
        agent.write_files(client, agent_id, batch)
        self.written.setdefault(action.node, {}).update({n: file_digest(c) for n, c in batch.items()})

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

    def etcd(self, action: Action, client_urls: tuple[str, ...]) -> EtcdAdmin:
        """An etcd admin for `action`'s cluster whose waits end with this controller's right to act."""
        record = self.state.clusters[action.cluster]
        return EtcdAdmin(self.signer(action.cluster, "etcd"), list(client_urls), record.trust_bundle("etcd"),
                         fenced=lambda: self.refused(action))

    def etcd_member_add(self, action: Action, p: EtcdMemberChange) -> None:
        record = self.state.clusters[action.cluster]
        with self.etcd(action, p.client_urls) as etcd:
            etcd.wait_healthy(list(p.client_urls), p.timeout, f"before adding {p.member}")
            etcd.add(p.peer_url, learner=True)
        node = self.state.nodes.get(p.member)
        beside = node is not None and bool(node.leaving_peer)  # a learner-first move: the old member stays
        if p.member not in record.etcd_members or (beside and p.member not in record.etcd_learners):
            if p.member not in record.etcd_members:
                record.etcd_members.append(p.member)
            record.etcd_learners.append(p.member)  # until promoted: a run stopped before that promotes next
        if node is not None and not beside:
            node.moved_from = ""  # a member moved off a lost hypervisor: joined again from its new place
        self.save()

    def etcd_member_promote(self, action: Action, p: EtcdMemberChange) -> None:
        with self.etcd(action, p.client_urls) as etcd:
            etcd.promote(p.peer_url, p.timeout)
            record = self.state.clusters[action.cluster]
            node = self.state.nodes.get(p.member)
            if p.member in record.etcd_learners or (node is not None and node.moved_from):
                if p.member in record.etcd_learners:
                    record.etcd_learners.remove(p.member)
                if node is not None:
                    node.moved_from = ""  # votes from its new place (a learner-first move: the old one leaves next)
                self.save()
            etcd.wait_healthy([p.client_url, *p.client_urls], p.timeout, f"after promoting {p.member}")

    def etcd_member_remove(self, action: Action, p: EtcdMemberChange) -> None:
        record = self.state.clusters[action.cluster]
        with self.etcd(action, p.client_urls) as etcd:
            etcd.wait_healthy(list(p.client_urls), p.timeout, f"before removing {p.member}")
            # a removed leader leaves no leader behind; an old member of a learner-first move (`peer_url`)
            # shares its name with the new one, so it is known by its peer URL
            etcd.hand_off_from(p.member, p.timeout, p.client_urls, peer_url=p.peer_url)
            etcd.remove(p.member, p.peer_url)
        node = self.state.nodes.get(p.member)
        if p.peer_url:
            if node is not None:
                node.leaving_from = node.leaving_peer = ""
                node.leaving_ports = {}
        else:
            record.etcd_members = [m for m in record.etcd_members if m != p.member]
            record.etcd_learners = [m for m in record.etcd_learners if m != p.member]
        self.save()

    def create_container(self, action: Action, p: CreateContainer) -> None:
        if p.etcd is not None:
            self._etcd_gate(action, p, before=True)
        self._create_container(action, p)
        if p.etcd is not None:
            self._etcd_gate(action, p, before=False)
        if p.ready is not None:
            self._wait_ready(action, p.ready)

    def _create_container(self, action: Action, p: CreateContainer, attempt: int = 0) -> str:
        client = self.client(action.hypervisor)
        spec = p.resolved({f.name: self.content(f) for f in p.files}, self.certificate_digests(action, p))
        client.pull_image(spec.image)
        ref = self.pod(action, p.pod)
        if attempt:  # beside a container of the same name: the runtime's name of it must differ
            spec = dataclasses.replace(spec, attempt=attempt)
        container_id = client.create_container(ref.sandbox_id, spec, p.sandbox)
        client.start_container(container_id)
        if action.component == AGENT:
            self.pods[action.node] = PodRef(ref.sandbox_id, container_id)
        return container_id

    def recreate_container(self, action: Action, p: CreateContainer) -> None:
        if p.etcd is not None:
            self._etcd_gate(action, p, before=True)
        if p.overlap:
            self._replace_beside(action, p)
        else:
            self._remove_container(action.hypervisor, action.target_id, action)
            self._create_container(action, p)
        if p.etcd is not None:
            self._etcd_gate(action, p, before=False)
        if p.ready is not None:
            self._wait_ready(action, p.ready)

    def reload_container(self, action: Action, p: Reload) -> None:
        client = self.client(action.hypervisor)
        code, out, err = client.exec_sync(p.target_id, p.command, timeout=30)
        if code != 0:
            said = (err or out).decode(errors="replace").strip()
            raise ApplyError(f"{action.component} of Node {action.node}: {' '.join(p.command)} exited {code}: {said}")
        agent.write_files(client, self.agent_id(action, p.pod), {p.record_file: p.record})

    def _replace_beside(self, action: Action, p: CreateContainer) -> None:
        """The new container first, `p.overlap` seconds beside the old one, then the old one stopped."""
        client = self.client(action.hypervisor)
        try:
            old = client.container_status(action.target_id)
        except CRIError as err:
            if err.reason != Reason.NOT_FOUND:
                raise
            self._create_container(action, p)  # gone meanwhile: nothing to overlap with
            return
        new = self._create_container(action, p, attempt=old.attempt + 1)
        time.sleep(p.overlap)
        if client.container_status(new).state != ContainerState.RUNNING:
            raise ApplyError(f"the new {action.component} on {action.node} is not running {p.overlap}s after it "
                             "started; the old one is left in place")
        self._remove_container(action.hypervisor, action.target_id, action)

    def _wait_ready(self, action: Action, ready: ApiReady) -> None:
        """Until the API server's own /readyz answers ok (anonymous; TLS verified against the cluster's CAs)."""
        url = urlsplit(ready.url)
        ca_pem = self.state.clusters[action.cluster].trust_bundle("cluster")
        deadline = time.monotonic() + ready.timeout
        with KubeAPI(f"{url.scheme}://{url.netloc}", ca_pem, timeout=5) as api:
            self._until_ready(action, api, url.path, deadline, f"kube-apiserver on {action.node}",
                              lambda last: f"kube-apiserver on {action.node} not ready after {ready.timeout}s "
                                           f"({ready.url}: {last}); stopping before any other API server is touched")
        counted_in = time.monotonic() + ready.ingress  # the ingress's health check takes it back meanwhile
        while (left := counted_in - time.monotonic()) > 0:
            refused = self.refused(action)
            if refused:
                raise ApplyError(f"fenced while the ingress counts kube-apiserver on {action.node} in: {refused}")
            time.sleep(min(left, 0.5))

    def _until_ready(self, action: Action, api: KubeAPI, path: str, deadline: float, what: str,
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

    def _etcd_gate(self, action: Action, p: CreateContainer, before: bool) -> None:
        """One etcd member at a time: the others healthy before it changes, it healthy after."""
        assert p.etcd is not None
        urls = p.etcd.peers if before else (p.etcd.client_url,)
        if not urls:
            return
        what = f"{'before' if before else 'after'} changing etcd on {action.node}"
        with self.etcd(action, p.etcd.peers or (p.etcd.client_url,)) as etcd:
            etcd.wait_healthy(list(urls), p.etcd.timeout, what)
            if before:
                etcd.hand_off_leadership(p.etcd.client_url, p.etcd.timeout, p.etcd.prefer)

    def remove_container(self, action: Action, p: Remove) -> None:
        if p.etcd is not None:  # it stops for an etcd change: that change's members healthy first
            urls = [u for u in (p.etcd.client_url, *p.etcd.peers) if u]
            with self.etcd(action, tuple(urls)) as etcd:
                etcd.wait_healthy(urls, p.etcd.timeout, f"before stopping {action.component} on {action.node} "
                                                        "for its etcd member")
        self._remove_container(action.hypervisor, p.target_id, action)

    def _remove_container(self, hypervisor: str, container_id: str, action: Action) -> None:
        """Stop and remove it (waiting while the runtime may still be starting it; fenced like any wait)."""
        self.client(hypervisor).stop_and_remove(container_id, STARTING_GRACE, lambda: self.refused(action))

    def remove_pod(self, action: Action, p: Remove) -> None:
        client = self.client(action.hypervisor)
        for container_id in p.stop_first:
            try:
                client.stop_container(container_id)
            except CRIError as err:
                if err.reason != Reason.NOT_FOUND:
                    raise
        if p.wipe_agent_id:
            try:
                agent.wipe(client, p.wipe_agent_id)
            except CRIError as err:
                if err.reason != Reason.NOT_FOUND:
                    raise
        client.stop_and_remove_sandbox(p.target_id, STARTING_GRACE, lambda: self.refused(action))
        if p.forget:
            self._forget(action.node, action.cluster)

    def label_host(self, action: Action, p: LabelHost) -> None:
        if self.provider is None:
            self.provider = self.connections.hosts(self.state)
        apply_change(self.provider, LabelChange(p.host, action.cluster, p.set, p.remove, action.reason), self.state)
        self.save()

    # ------------------------------------------------------------------ inside the cluster's own API

    def api(self, cluster: str, server: str) -> KubeAPI:
        """The cluster's API as its admin (credentials from the recorded state, in memory only)."""
        record = self.state.clusters[cluster]
        if record.admin is None:
            raise ApplyError(f"cluster {cluster} has no admin credential recorded")
        return KubeAPI(server, record.trust_bundle("cluster"),
                       Credentials(record.admin.cert_pem, record.admin.key_pem))

    def create_object(self, action: Action, p: PutObject) -> None:
        with self.api(p.cluster, p.server) as api:
            if p.wait_ready:
                deadline = time.monotonic() + p.wait_ready
                self._until_ready(action, api, "/readyz", deadline, f"the API of cluster {p.cluster}",
                                  lambda _: f"the API of cluster {p.cluster} at {p.server} not ready after "
                                            f"{p.wait_ready}s")
            api.apply(p.collection, json.loads(p.body))

    update_object = create_object

    def sign_certificate_request(self, action: Action, p: SignRequest) -> None:
        """Approve (when the plan says so) and sign exactly the request the plan saw."""
        path = f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{p.name}"
        with self.api(p.cluster, p.server) as api:
            current = api.get(path)
            if current is None or current["metadata"].get("uid") != p.uid:
                raise ApplyError(f"certificate request {p.name} is gone or was replaced since the plan")
            if p.approve:
                conditions = list((current.get("status") or {}).get("conditions") or [])
                if not any(c.get("type") == p.approval.type for c in conditions):
                    conditions.append(dataclasses.asdict(p.approval))
                    current = api.request("PUT", f"{path}/approval", {**current, "status": {
                        **(current.get("status") or {}), "conditions": conditions}})
            request = load_csr_pem(p.request)
            cert = sign_public_key(self.signer(p.cluster, "cluster"),
                                   request.public_key(), p.common_name, organizations=p.organizations,
                                   dns_names=p.dns_names, ip_addresses=p.ip_addresses, server=p.server_auth,
                                   client=p.client_auth, days=p.days, now=self.now)
            status = {**(current.get("status") or {}),
                      "certificate": base64.b64encode(cert_to_pem(cert).encode()).decode()}
            api.request("PUT", f"{path}/status", {**current, "status": status})

    def backup_etcd(self, action: Action, p: BackupEtcd) -> None:
        """Snapshot the cluster's etcd into its target before the plan changes it."""
        record = self.state.clusters[action.cluster]
        context = client_context(self.signer(action.cluster, "etcd"), record.trust_bundle("etcd"))
        snap = back_up(self.connections.backup_target(p.target), action.cluster, p.keep, context, dict(p.members))
        log.info("etcd snapshot %s of %s taken from %s at revision %d (%d bytes) into %s", snap.short_id,
                 action.cluster, snap.member, snap.revision, snap.bytes, p.target)

    def defragment_etcd(self, action: Action, p: EtcdHealth) -> None:
        """One member's database file rewritten: the others serving before (a leader known, alarms or not),
        leadership handed over if it leads, then it serving again."""
        with self.etcd(action, p.peers or (p.client_url,)) as etcd:
            etcd.wait_serving(list(p.peers), p.timeout, f"before defragmenting etcd on {action.node}")
            etcd.hand_off_leadership(p.client_url, p.timeout, p.prefer)
            etcd.defragment(p.client_url)
            etcd.wait_serving([p.client_url], p.timeout, f"after defragmenting etcd on {action.node}")

    def disarm_etcd_alarm(self, action: Action, p: EtcdAlarm) -> None:
        with self.etcd(action, p.client_urls) as etcd:
            cleared = etcd.disarm(p.alarm)
        log.info("%d %s alarm(s) of %s cleared", cleared, p.alarm, action.cluster)

    def recover_etcd(self, action: Action, p: RecoverEtcd) -> None:
        """Rebuild etcd from its surviving member: once with --force-new-cluster, then as usual (each time until
        healthy); then record it the only member. A run repeated after a crash forces again (a one-member
        cluster forced again is the same cluster)."""
        for container_id in p.stop:
            self._remove_container(action.hypervisor, container_id, action)
        client = self.client(action.hypervisor)
        spec = p.create.resolved({f.name: self.content(f) for f in p.create.files},
                                 self.certificate_digests(action, p.create))
        # labelled apart: should a crash leave it running, the next plan sees a changed spec and replaces it
        forced = dataclasses.replace(spec, args=(*spec.args, "--force-new-cluster"),
                                     labels={**spec.labels, SPEC_HASH: "force-new-cluster"})
        client.pull_image(spec.image)
        forced_id = client.create_container(self.pod(action, p.create.pod).sandbox_id, forced, p.create.sandbox)
        client.start_container(forced_id)
        with self.etcd(action, (p.client_url,)) as etcd:
            etcd.wait_healthy([p.client_url], p.timeout, f"after --force-new-cluster on {action.node}")
        self._remove_container(action.hypervisor, forced_id, action)
        self._create_container(action, p.create)
        with self.etcd(action, (p.client_url,)) as etcd:
            etcd.wait_healthy([p.client_url], p.timeout, f"after rebuilding etcd on {action.node}")
        record = self.state.clusters[action.cluster]
        record.etcd_members, record.etcd_learners = [action.node], []
        record.recovered, record.forcing = p.record, ""
        self.save()
        log.info("etcd of %s rebuilt from %s", action.cluster, action.node)

    def restore_etcd(self, action: Action, p: RestoreEtcd) -> None:
        """Copy the snapshot to every member (while the cluster still serves), stop its control plane, restore
        every member's data directory from the snapshot, record the restore (the plan's next actions start
        the containers again). Every step is safe to repeat."""
        restic = Restic(self.connections.backup_target(p.target))
        with tempfile.TemporaryFile() as data:  # unlinked from the start: nothing is left behind, even by SIGKILL
            restic.dump(p.snapshot, action.cluster, data)
            for member in p.members:
                agent.send_snapshot(self.client(member.hypervisor), member.pod.agent_id, data)
        for hypervisor, container_id in p.stop:
            self._remove_container(hypervisor, container_id, action)
        for member in p.members:
            self._restore_member(action, member)
        for member in p.members:
            agent.swap_restored(self.client(member.hypervisor), member.pod.agent_id, p.token)
        record = self.state.clusters[action.cluster]
        record.restored, record.etcd_learners = p.record, []
        self.save()
        log.info("etcd of %s restored from snapshot %s of %s", action.cluster, p.snapshot[:8], p.target)

    def _restore_member(self, action: Action, member: RestoreMember) -> None:
        """`etcdctl snapshot restore` in a one-shot container of the member's pod, until it exits 0."""
        client = self.client(member.hypervisor)
        for stale in client.list_containers({RESTORE_LABEL: member.node}, sandbox_id=member.pod.sandbox_id):
            self._remove_container(member.hypervisor, stale.id, action)  # left by a run that stopped on the way
        client.pull_image(member.restorer.image)
        container_id = client.create_container(member.pod.sandbox_id, member.restorer, member.sandbox)
        client.start_container(container_id)
        deadline = time.monotonic() + RESTORE_TIMEOUT
        status = client.container_status(container_id)
        while status.state != ContainerState.EXITED:
            if time.monotonic() > deadline:
                raise ApplyError(f"etcdctl snapshot restore on {member.node} still runs after {RESTORE_TIMEOUT}s")
            refused = self.refused(action)
            if refused:
                raise ApplyError(f"fenced while restoring etcd on {member.node}: {refused}")
            time.sleep(0.5)
            status = client.container_status(container_id)
        if status.exit_code != 0:
            output = agent.restore_log(client, member.pod.agent_id, member.restorer.log_path)
            raise ApplyError(f"etcdctl snapshot restore on {member.node} exited {status.exit_code}: "
                             f"{output or status.message or status.reason}")
        self._remove_container(member.hypervisor, container_id, action)

    def advance_ca_rotation(self, action: Action, p: RotationStep) -> None:
        """Record the next phase of the cluster's CA rotation: the phase the plan ran is done."""
        record = self.state.clusters.get(p.cluster)
        rotation = record.rotation if record is not None else None
        if record is None or rotation is None or (rotation.generation, rotation.phase) != (p.generation, p.phase):
            now = f"{rotation.generation}/{rotation.phase}" if rotation is not None else "none"
            raise ApplyError(f"cluster {p.cluster}: the plan ends CA rotation phase {p.generation}/{p.phase}, but the "
                             f"recorded rotation is {now}; plan again")
        self.state.clusters[p.cluster] = record.next_phase()
        self.save()

    def _forget(self, node: str, cluster: str) -> None:
        """The node left the repo and its pod is gone: free its ports and records."""
        self.state.nodes.pop(node, None)
        record = self.state.clusters.get(cluster)
        if record is not None:
            record.retire_service_account_key(node)
            record.etcd_members = [m for m in record.etcd_members if m != node]
            record.etcd_learners = [m for m in record.etcd_learners if m != node]
        self.save()
