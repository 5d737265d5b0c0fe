"""Serial, idempotent execution of a plan.

Actions run one at a time, in plan order, on one hypervisor at a time. The
first failure stops the run with a message naming the action. Every action is
safe to repeat: a re-run after a crash (even SIGKILL) observes what exists and
plans only what is missing; containerd refuses a second sandbox or container
with the same name, so nothing is ever duplicated.

`apply` works in rounds (observe, plan, execute) until a round plans nothing:
generating a node's service-account key changes a file every API server
reads, so the round stops after key generation and the next one plans the
files and containers with the keys known.
"""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gitops.apply import agent
from gitops.apply.etcd import EtcdAdmin
from gitops.compile.authorities import authority
from gitops.compile.desired import COMPONENT, MANAGED, MANAGER, NODE, SPEC_HASH, DesiredPod
from gitops.cri.client import CRIClient
from gitops.cri.errors import CRIError, Reason
from gitops.cri.types import ContainerState, SandboxState
from gitops.engine import Planned, make_plan, observe_all
from gitops.errors import GitopsError
from gitops.model.config import RepoConfig
from gitops.model.resources import CONTROLPLANE, RepoModel
from gitops.compile.components import AGENT
from gitops.observe import ObservedState, read_node_files
from gitops.pki import load_csr_pem, sign_public_key
from gitops.pki.x509 import cert_to_pem
from gitops.plan.actions import Action, Kind, Plan
from gitops.plan.diff import certificate_problem
from gitops.sip.reconcile import apply_change, provider_for
from gitops.state.records import State
from gitops.state.store import StateStore

log = logging.getLogger(__name__)

Progress = Callable[[int, int, Action, str], None]


class ApplyError(GitopsError):
    """An action failed; the run stopped there."""


class MassDeleteRefused(GitopsError):
    def __init__(self, plan: Plan, limit: int):
        self.plan = plan
        nodes = ", ".join(a.node for a in plan.prunes)
        super().__init__(f"the plan removes {len(plan.prunes)} pods whose nodes left the repo ({nodes}), more than "
                         f"prune.maxDeletes={limit}; re-run with --allow-mass-delete if that is intended")


@dataclass
class ApplyResult:
    first_plan: Plan
    executed: list[Action] = field(default_factory=list)
    rounds: int = 0
    stopped: bool = False
    #: the last round's planning pass: when the run converged, its observed state is the live state
    last: Planned | None = None


def apply(model: RepoModel, config: RepoConfig, store: StateStore, *, allow_mass_delete: bool = False,
          progress: Progress | None = None, max_rounds: int = 5, source: str = "",
          should_stop: Callable[[], bool] = lambda: False,
          observe_fn: Callable[[RepoModel], ObservedState] | None = None) -> ApplyResult:
    """Reconcile the hypervisors with `model` until nothing is left to do."""
    watch = observe_fn or (lambda m: observe_all(m, config))
    result: ApplyResult | None = None
    for round_no in range(1, max_rounds + 1):
        planned = make_plan(model, config, store.load(), watch(model), source=source)
        store.save(planned.state)
        if result is None:
            result = ApplyResult(first_plan=planned.plan)
        result.rounds = round_no
        result.last = planned
        prunes = planned.plan.prunes
        if len(prunes) > config.prune.max_deletes and not allow_mass_delete:
            raise MassDeleteRefused(planned.plan, config.prune.max_deletes)
        if planned.plan.empty:
            return result
        runner = Runner(model, config, planned, store, progress)
        try:
            finished = runner.run(should_stop)
        finally:
            runner.close()
            result.executed.extend(runner.executed)
        if not finished:
            result.stopped = True
            return result
    raise ApplyError(f"still not converged after {max_rounds} rounds; run `gitops plan` to see what remains")


class Runner:
    """Executes one round's actions with the state and desired pods of that round."""

    def __init__(self, model: RepoModel, config: RepoConfig, planned: Planned, store: StateStore,
                 progress: Progress | None):
        self.model = model
        self.config = config
        self.planned = planned
        self.desired = planned.compiled.desired
        self.state: State = planned.state.copy()
        self.store = store
        self.progress = progress
        self.clients: dict[str, CRIClient] = {}
        self.executed: list[Action] = []
        self.now = dt.datetime.now(dt.timezone.utc)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def client(self, hypervisor: str) -> CRIClient:
        if hypervisor not in self.clients:
            self.clients[hypervisor] = CRIClient(self.model.hypervisors[hypervisor])
        return self.clients[hypervisor]

    def save(self) -> None:
        self.store.save(self.state)

    def run(self, should_stop: Callable[[], bool]) -> bool:
        """True when the round finished (or ended early to re-plan), False when asked to stop."""
        actions = self.planned.plan.actions
        last_key = max((i for i, a in enumerate(actions) if a.kind == Kind.GENERATE_KEYS), default=None)
        for index, action in enumerate(actions):
            if should_stop():
                log.info("stop requested; %d of %d actions done", index, len(actions))
                return False
            self._report(index, len(actions), action, "start")
            try:
                HANDLERS[action.kind](self, action)
            except (GitopsError, OSError) as err:
                self._report(index, len(actions), action, "failed")
                raise ApplyError(f"action {index + 1}/{len(actions)} failed: {action.symbol} {action.subject} "
                                 f"{action.kind.value}: {err}") from None
            self.executed.append(action)
            self._report(index, len(actions), action, "done")
            if index == last_key:
                return True  # file contents depend on the new keys: plan again
        return True

    def _report(self, index: int, total: int, action: Action, status: str) -> None:
        log.info("action %s", status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                            "subject": action.subject})
        if self.progress is not None:
            self.progress(index, total, action, status)

    # ---------------------------------------------------------------- lookups

    def pod(self, action: Action) -> DesiredPod:
        return self.desired.pods[action.node]

    def sandbox_id(self, pod: DesiredPod) -> str:
        client = self.client(pod.hypervisor)
        found = [s for s in client.list_sandboxes({MANAGED: MANAGER, NODE: pod.node}, state=SandboxState.READY)
                 if s.labels.get(SPEC_HASH) == pod.sandbox.labels[SPEC_HASH]]
        if not found:
            raise ApplyError(f"no ready pod sandbox for Node {pod.node} on {pod.hypervisor}")
        return max(found, key=lambda s: s.created_at).id

    def agent_id(self, pod: DesiredPod) -> str:
        client = self.client(pod.hypervisor)
        running = client.list_containers({MANAGED: MANAGER, NODE: pod.node, COMPONENT: AGENT},
                                         sandbox_id=self.sandbox_id(pod), state=ContainerState.RUNNING)
        if not running:
            raise ApplyError(f"the files agent of Node {pod.node} is not running on {pod.hypervisor}")
        return max(running, key=lambda c: c.created_at).id

    # ---------------------------------------------------------------- handlers

    def create_pod(self, action: Action) -> None:
        pod = self.pod(action)
        client = self.client(pod.hypervisor)
        for container in pod.containers:
            client.pull_image(container.spec.image)
        if pod.role == CONTROLPLANE:
            record = self.state.clusters[pod.cluster]
            if not record.etcd_members:  # bootstrap: the initial members start together
                record.etcd_members = [m.node for m in self.desired.clusters[pod.cluster].etcd_members]
                self.save()
        sandbox_id = client.run_sandbox(pod.sandbox)
        agent_spec = pod.containers[0].spec
        container_id = client.create_container(sandbox_id, agent_spec, pod.sandbox)
        client.start_container(container_id)

    def generate_keys(self, action: Action) -> None:
        pod = self.pod(action)
        client = self.client(pod.hypervisor)
        agent_id = self.agent_id(pod)
        for key in pod.keys:
            public = agent.public_key(client, agent_id, key.name)
            if key.purpose == "service-account":
                self.state.clusters[pod.cluster].set_service_account_key(pod.node, public)
        self.save()

    def write_files(self, action: Action) -> None:
        pod = self.pod(action)
        client = self.client(pod.hypervisor)
        agent_id = self.agent_id(pod)
        files = read_node_files(client, agent_id)
        if files is None:
            raise ApplyError(f"cannot list the files of Node {pod.node}")
        for spec in pod.certificates:  # only control-plane pods have certificates
            cluster = self.model.clusters[pod.cluster]
            authorities = self.state.clusters[pod.cluster].authorities
            ca_pem = authorities[spec.signer].cert_pem
            if certificate_problem(spec, files, ca_pem, cluster.renew_before_days, self.now) is None:
                continue
            csr = load_csr_pem(agent.certificate_request(client, agent_id, spec.name))
            cert = sign_public_key(
                authority(authorities, spec.signer), csr.public_key(), spec.common_name,
                organizations=spec.organizations, dns_names=spec.dns_names, ip_addresses=spec.ip_addresses,
                server=spec.server, client=spec.client, days=cluster.validity_days, now=self.now)
            agent.write_file(client, agent_id, f"{spec.name}.crt", cert_to_pem(cert))
        for spec in pod.files:
            if files.digests.get(spec.name) != spec.digest:
                agent.write_file(client, agent_id, spec.name, spec.content)

    def _etcd(self, cluster: str, exclude: str) -> EtcdAdmin:
        record = self.state.clusters[cluster]
        want = self.desired.clusters.get(cluster)
        urls = [m.client_url for m in (want.etcd_members if want else ())
                if m.node in record.etcd_members and m.node != exclude]
        return EtcdAdmin(authority(record.authorities, "etcd"), urls)

    def etcd_member_add(self, action: Action) -> None:
        peer_url = action.details[0]
        with self._etcd(action.cluster, exclude=action.node) as etcd:
            etcd.add(peer_url)
        self.state.clusters[action.cluster].etcd_members.append(action.node)
        self.save()

    def etcd_member_remove(self, action: Action) -> None:
        with self._etcd(action.cluster, exclude=action.node) as etcd:
            etcd.remove(action.node)
        members = self.state.clusters[action.cluster].etcd_members
        self.state.clusters[action.cluster].etcd_members = [m for m in members if m != action.node]
        self.save()

    def create_container(self, action: Action) -> None:
        pod = self.pod(action)
        client = self.client(pod.hypervisor)
        spec = next(c.spec for c in pod.containers if c.spec.name == action.component)
        client.pull_image(spec.image)
        container_id = client.create_container(self.sandbox_id(pod), spec, pod.sandbox)
        client.start_container(container_id)

    def recreate_container(self, action: Action) -> None:
        self.remove_container(action)
        self.create_container(action)

    def remove_container(self, action: Action) -> None:
        client = self.client(action.hypervisor)
        try:
            client.stop_container(action.target_id)
            client.remove_container(action.target_id)
        except CRIError as err:
            if err.reason != Reason.NOT_FOUND:
                raise

    def remove_pod(self, action: Action) -> None:
        client = self.client(action.hypervisor)
        want = self.desired.pods.get(action.node)
        leaving = want is None or want.hypervisor != action.hypervisor
        if leaving:
            agents = client.list_containers({MANAGED: MANAGER, NODE: action.node, COMPONENT: AGENT},
                                            sandbox_id=action.target_id, state=ContainerState.RUNNING)
            for container in agents[:1]:
                agent.wipe(client, container.id)
        try:
            client.stop_sandbox(action.target_id)
            client.remove_sandbox(action.target_id)
        except CRIError as err:
            if err.reason != Reason.NOT_FOUND:
                raise
        if want is None:
            self._forget(action)

    def label_host(self, action: Action) -> None:
        change = next(c for c in self.planned.sip.changes if c.host == action.node)
        provider = provider_for(self.model, self.config, self.state)
        if self.config.bare_metal.provider == "kubernetes":
            provider.list_hosts()  # the current resourceVersion to patch against
        apply_change(provider, change, self.state)
        self.save()

    def _forget(self, action: Action) -> None:
        """The node left the repo and its pod is gone: free its ports and records."""
        self.state.nodes.pop(action.node, None)
        record = self.state.clusters.get(action.cluster)
        if record is not None:
            record.retire_service_account_key(action.node)
            record.etcd_members = [m for m in record.etcd_members if m != action.node]
            if action.cluster not in self.model.clusters and not any(
                    r.cluster == action.cluster for r in self.state.nodes.values()):
                del self.state.clusters[action.cluster]
        self.save()


HANDLERS: dict[Kind, Callable[[Runner, Action], None]] = {
    Kind.CREATE_POD: Runner.create_pod,
    Kind.GENERATE_KEYS: Runner.generate_keys,
    Kind.WRITE_FILES: Runner.write_files,
    Kind.ETCD_MEMBER_ADD: Runner.etcd_member_add,
    Kind.ETCD_MEMBER_REMOVE: Runner.etcd_member_remove,
    Kind.CREATE_CONTAINER: Runner.create_container,
    Kind.RECREATE_CONTAINER: Runner.recreate_container,
    Kind.REMOVE_CONTAINER: Runner.remove_container,
    Kind.REMOVE_POD: Runner.remove_pod,
    Kind.LABEL_HOST: Runner.label_host,
}
