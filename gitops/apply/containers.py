"""Apply's handlers of pods, keys, files and containers on a hypervisor (over CRI and the node's files agent)."""
from __future__ import annotations

import dataclasses
import time
from urllib.parse import urlsplit

from gitops import agent
from gitops.apply.run import STARTING_GRACE, ApplyError, Run
from gitops.cri.errors import CRIError, Reason
from gitops.cri.types import ContainerState
from gitops.kubeapi import KubeAPI
from gitops.pki import load_csr_pem, sign_public_key
from gitops.pki.x509 import cert_to_pem
from gitops.plan.actions import Action
from gitops.plan.payloads import (ApiReady, CreateContainer, CreatePod, GenerateKeys, PodRef, Reload, Remove, ServingFirst,
                                  WriteFiles)
from gitops.pods import AGENT, file_digest


def create_pod(run: Run, action: Action, p: CreatePod) -> None:
    client = run.client(action.hypervisor)
    for image in p.images:
        client.pull_image(image)
    record = run.state.clusters.get(action.cluster)
    if p.bootstrap_members and record is not None and not record.etcd_members:
        with run.recording():
            record.etcd_members = list(p.bootstrap_members)  # the initial members start together
    sandbox_id = client.run_sandbox(p.sandbox)
    agent_id = client.create_container(sandbox_id, p.agent, p.sandbox)
    client.start_container(agent_id)
    run.pods[action.node] = PodRef(sandbox_id, agent_id)


def generate_keys(run: Run, action: Action, p: GenerateKeys) -> None:
    client = run.client(action.hypervisor)
    agent_id = run.agent_id(action, p.pod)
    public = {key.name: agent.public_key(client, agent_id, key.name) for key in p.keys}
    with run.recording() as state:
        for key in p.keys:
            if key.purpose != "service-account":
                continue
            record = state.clusters[action.cluster]
            before = record.service_account_keys.get(action.node)
            if before is not None and before != public[key.name]:
                run.outcome.surprises.append(f"Node {action.node}: its service-account key was regenerated "
                                              "(the old one was gone); every API server must trust the new one")
            record.set_service_account_key(action.node, public[key.name])


def write_files(run: Run, action: Action, p: WriteFiles) -> None:
    client = run.client(action.hypervisor)
    agent_id = run.agent_id(action, p.pod)
    # everything is computed (contents, requests, signatures) before the first write, then written as
    # one batch: a failure anywhere leaves the node's old files whole
    batch = {spec.name: run.content(spec) for spec in p.files}
    for issue in p.certificates:
        spec = issue.spec
        csr = load_csr_pem(agent.certificate_request(client, agent_id, spec.name))
        cert = sign_public_key(
            run.signer(p.cluster, spec.signer), csr.public_key(), spec.common_name,
            organizations=spec.organizations, dns_names=spec.dns_names, ip_addresses=spec.ip_addresses,
            server=spec.server, client=spec.client, days=issue.days, now=run.now)
        batch[f"{spec.name}.crt"] = cert_to_pem(cert) + issue.chain
    agent.write_files(client, agent_id, batch)
    run.written.setdefault(action.node, {}).update({n: file_digest(c) for n, c in batch.items()})


def create_container(run: Run, action: Action, p: CreateContainer) -> None:
    if p.etcd is not None:
        _etcd_gate(run, action, p, before=True)
    start_container(run, action, p)
    if p.etcd is not None:
        _etcd_gate(run, action, p, before=False)
    if p.ready is not None:
        _wait_ready(run, action, p.ready)


def start_container(run: Run, action: Action, p: CreateContainer, attempt: int = 0) -> str:
    """Create and start the container `p` describes (its files' digests resolved now); its id."""
    client = run.client(action.hypervisor)
    spec = p.resolved({f.name: run.content(f) for f in p.files}, run.certificate_digests(action, p))
    client.pull_image(spec.image)
    ref = run.pod(action, p.pod)
    if attempt:  # beside a container of the same name: the runtime's name of it must differ
        spec = dataclasses.replace(spec, attempt=attempt)
    container_id = client.create_container(ref.sandbox_id, spec, p.sandbox)
    client.start_container(container_id)
    if action.component == AGENT:
        run.pods[action.node] = PodRef(ref.sandbox_id, container_id)
    return container_id


def recreate_container(run: Run, action: Action, p: CreateContainer) -> None:
    if p.etcd is not None:
        _etcd_gate(run, action, p, before=True)
    if p.serving is not None:
        _serving_first(run, action, p.serving)
    if p.overlap:
        _replace_beside(run, action, p)
    else:
        run.remove_container(action.hypervisor, action.target_id, action)
        start_container(run, action, p)
    if p.etcd is not None:
        _etcd_gate(run, action, p, before=False)
    if p.ready is not None:
        _wait_ready(run, action, p.ready)


def reload_container(run: Run, action: Action, p: Reload) -> None:
    client = run.client(action.hypervisor)
    code, out, err = client.exec_sync(p.target_id, p.command, timeout=30)
    if code != 0:
        said = (err or out).decode(errors="replace").strip()
        raise ApplyError(f"{action.component} of Node {action.node}: {' '.join(p.command)} exited {code}: {said}")
    agent.write_files(client, run.agent_id(action, p.pod), {p.record_file: p.record})


def _replace_beside(run: Run, action: Action, p: CreateContainer) -> None:
    """The new container first, `p.overlap` seconds beside the old one, then the old one stopped."""
    client = run.client(action.hypervisor)
    try:
        old = client.container_status(action.target_id)
    except CRIError as err:
        if err.reason != Reason.NOT_FOUND:
            raise
        start_container(run, action, p)  # gone meanwhile: nothing to overlap with
        return
    new = start_container(run, action, p, attempt=old.attempt + 1)
    time.sleep(p.overlap)
    if client.container_status(new).state != ContainerState.RUNNING:
        raise ApplyError(f"the new {action.component} on {action.node} is not running {p.overlap}s after it "
                         "started; the old one is left in place")
    run.remove_container(action.hypervisor, action.target_id, action)


def _wait_ready(run: Run, action: Action, ready: ApiReady) -> None:
    """Until the API server's own /readyz answers ok (anonymous; TLS verified against the cluster's CAs)."""
    api, path = _readyz_api(ready.url, run.state.clusters[action.cluster].trust_bundle("cluster"), timeout=5)
    deadline = time.monotonic() + ready.timeout
    with api:
        run.until_ready(action, api, path, deadline, f"kube-apiserver on {action.node}",
                          lambda last: f"kube-apiserver on {action.node} not ready after {ready.timeout}s "
                                       f"({ready.url}: {last}); stopping before any other API server is touched")
    counted_in = time.monotonic() + ready.ingress  # the ingress's health check takes it back meanwhile
    while (left := counted_in - time.monotonic()) > 0:
        refused = run.refused(action)
        if refused:
            raise ApplyError(f"fenced while the ingress counts kube-apiserver on {action.node} in: {refused}")
        time.sleep(min(left, 0.5))


def _serving_first(run: Run, action: Action, serving: ServingFirst) -> None:
    """Until one of the other API servers has answered /readyz for `serving.steady` seconds (polled every
    0.5 s; a miss starts its count again), or at once when neither it nor the one about to stop answers."""
    ca_pem = run.state.clusters[action.cluster].trust_bundle("cluster")
    apis = [_readyz_api(url, ca_pem) for url in (serving.url, *serving.peers)]
    deadline, since, last = time.monotonic() + serving.timeout, dict[int, float](), ""
    try:
        while True:
            for index, (api, path) in enumerate(apis[1:], start=1):
                why = api.not_ready(path)
                if why:
                    since.pop(index, None)
                    last = f"{api.server}{path}: {why}"
                else:
                    since.setdefault(index, time.monotonic())
            now = time.monotonic()
            if any(now - start >= serving.steady for start in since.values()):
                return
            if not since and apis[0][0].not_ready(apis[0][1]):
                return  # nothing serves: no service to keep
            if now > deadline:
                raise ApplyError(f"no other API server of cluster {action.cluster} served for {serving.steady}s within "
                                 f"{serving.timeout}s ({last}); kube-apiserver on {action.node} is left running")
            refused = run.refused(action)
            if refused:
                raise ApplyError(f"fenced while waiting for another API server to serve: {refused}")
            time.sleep(0.5)
    finally:
        for api, _ in apis:
            api.close()


def _readyz_api(url: str, ca_pem: str, timeout: float = 2) -> tuple[KubeAPI, str]:
    """An anonymous client of the API server at `url` (its /readyz; TLS verified against `ca_pem`), and the path."""
    parts = urlsplit(url)
    return KubeAPI(f"{parts.scheme}://{parts.netloc}", ca_pem, timeout=timeout), parts.path


def _etcd_gate(run: Run, action: Action, p: CreateContainer, before: bool) -> None:
    """One etcd member at a time: the others healthy before it changes, it healthy after."""
    assert p.etcd is not None
    urls = p.etcd.peers if before else (p.etcd.client_url,)
    if not urls:
        return
    what = f"{'before' if before else 'after'} changing etcd on {action.node}"
    with run.etcd(action, p.etcd.peers or (p.etcd.client_url,)) as etcd:
        etcd.wait_healthy(list(urls), p.etcd.timeout, what)
        if before:
            etcd.hand_off_leadership(p.etcd.client_url, p.etcd.timeout, p.etcd.prefer)


def remove_container(run: Run, action: Action, p: Remove) -> None:
    if p.etcd is not None:  # it stops for an etcd change: that change's members healthy first
        urls = [u for u in (p.etcd.client_url, *p.etcd.peers) if u]
        with run.etcd(action, tuple(urls)) as etcd:
            etcd.wait_healthy(urls, p.etcd.timeout, f"before stopping {action.component} on {action.node} "
                                                    "for its etcd member")
    if p.serving is not None:
        _serving_first(run, action, p.serving)
    run.remove_container(action.hypervisor, p.target_id, action)


def remove_pod(run: Run, action: Action, p: Remove) -> None:
    client = run.client(action.hypervisor)
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
    client.stop_and_remove_sandbox(p.target_id, STARTING_GRACE, lambda: run.refused(action))
    if p.forget:
        run.forget(action.node, action.cluster)
