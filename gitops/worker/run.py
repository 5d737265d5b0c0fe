"""Joining and leaving, on the worker machine.

`join`: discover and pin the cluster, check the token, write the worker's files,
start kubelet (or write systemd units), wait until the cluster signed its client
certificate (gitops signs it on its next reconcile), then start kube-proxy.
`leave`: stop both, remove the Node, the pods kubelet left in the CRI, kube-proxy's
iptables chains, the CNI bridge, kubelet's mounts and the worker directory.
`follow`: the cluster's API endpoint moved (a plan said so): point this worker at the new one.
`abandon`: what `leave` undoes on the machine's own disk, for a worker whose machine (network,
runtime, cluster) is already gone: `gitops lab down` with a lab worker still joined.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import yaml

from gitops.cri.client import CRIClient
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError
from gitops.kubeapi import Credentials, KubeAPI, KubeAPIError, node_ready
from gitops.safeio import write_atomic
from gitops import procs
from gitops.model import versions
from gitops.worker import configs
from gitops.worker.configs import WorkerSpec
from gitops.worker.discovery import JoinError, discover

log = logging.getLogger(__name__)

STATE = "worker.json"
#: sandboxes kubelet created carry this label (gitops's own pods never do)
KUBELET_POD_LABEL = "io.kubernetes.pod.uid"


def join(spec: WorkerSpec, token: str, ca_cert_hash: str, *, kubelet: str, kube_proxy: str,
         cluster_cidr: str = "10.88.0.0/16", systemd_dir: Path | None = None, timeout: float = 600.0,
         say: Callable[[str], None] = print) -> None:
    found = discover(spec.server, token, ca_cert_hash)
    say(f"cluster CA matches {ca_cert_hash}; bootstrap token accepted by {spec.server}")
    have = kubelet_version(kubelet)
    if found.server_version:
        why = versions.kubelet_skew_problem(spec.name, have, found.server_version)
        if why:
            raise JoinError(why)
    say(f"kubelet {have}, API server {found.server_version or 'of an unknown version'}")
    if (spec.dir / STATE).exists():
        raise JoinError(f"{spec.dir} already holds a worker; run `gitops leave --dir {spec.dir}` first")
    spec.dir.mkdir(parents=True, exist_ok=True)
    spec.dir.chmod(0o700)
    _write(spec.ca_file, found.ca_pem)
    _write(spec.bootstrap_kubeconfig, configs.bootstrap_kubeconfig(spec, token), secret=True)
    _write(spec.dir / "kubelet.yaml", configs.kubelet_config(spec))
    _write(spec.dir / "kube-proxy.yaml", configs.kube_proxy_config(spec, cluster_cidr))
    if spec.cni_file is not None:
        spec.cni_file.parent.mkdir(parents=True, exist_ok=True)
        _write(spec.cni_file, configs.bridge_network(spec))
    kubelet_argv = [kubelet, *configs.kubelet_args(spec)]
    proxy_argv = [kube_proxy, *configs.kube_proxy_args(spec)]
    state: dict[str, object] = {"spec": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items()},
                                "ip_forward": _ip_forward(), "kube_proxy": kube_proxy, "processes": []}
    if systemd_dir is not None:
        systemd_dir.mkdir(parents=True, exist_ok=True)
        _write(systemd_dir / "gitops-kubelet.service", configs.systemd_unit("kubelet (gitops worker)", kubelet_argv))
        _write(systemd_dir / "gitops-kube-proxy.service", configs.systemd_unit(
            "kube-proxy (gitops worker)", proxy_argv, after="gitops-kubelet.service"))
        state["systemd"] = str(systemd_dir)
        _save(spec, state)
        say(f"wrote gitops-kubelet.service and gitops-kube-proxy.service in {systemd_dir}; "
            "start them with `systemctl daemon-reload && systemctl enable --now gitops-kubelet gitops-kube-proxy`")
        return
    started = _start(spec, "kubelet", kubelet_argv)
    state["processes"] = [started]
    _save(spec, state)
    say(f"kubelet started (pid {started['pid']}); waiting for the cluster to sign this node's client certificate: "
        "gitops signs it on its next reconcile (`gitops apply`, or `gitops watch` running)")
    deadline = time.monotonic() + timeout
    while not spec.client_certificate.exists():
        if not procs.start_time(int(started["pid"])):  # type: ignore[arg-type]
            raise JoinError(f"kubelet exited; see {spec.dir / 'kubelet.log'}")
        if time.monotonic() > deadline:
            raise JoinError(f"no client certificate after {timeout:.0f}s: is gitops reconciling this cluster? "
                            f"(kubelet keeps waiting; see {spec.dir / 'kubelet.log'})")
        time.sleep(1)
    proxy = _start(spec, "kube-proxy", proxy_argv)
    state["processes"] = [started, proxy]
    _save(spec, state)
    say(f"node {spec.name} registered; kube-proxy started (pid {proxy['pid']}). It turns Ready once its network "
        "is up; its serving certificate is signed by gitops on the next reconcile")


def kubelet_version(kubelet: str) -> str:
    """What `kubelet --version` says ("v1.37.2"); JoinError naming the binary if it does not run."""
    try:
        done = subprocess.run([kubelet, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        raise JoinError(f"cannot run {kubelet} --version: {err}") from None
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 2 or words[0] != "Kubernetes":
        raise JoinError(f"{kubelet} --version did not say its version: {(done.stdout + done.stderr).strip()[:200]}")
    return words[1]


def recorded(directory: Path) -> tuple[WorkerSpec, dict[str, object]] | None:
    """The worker `join` recorded in `directory` (its spec and state), None if there is none."""
    path = directory / STATE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        raw = state["spec"]
        spec = WorkerSpec(**{**raw, "dir": Path(raw["dir"]),
                             "cni_conf_dir": Path(raw["cni_conf_dir"]) if raw.get("cni_conf_dir") else None})
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise JoinError(f"unreadable worker state {path}: {err}") from None
    return spec, state


def stop(directory: Path) -> list[str]:
    """Stop the kubelet and kube-proxy `join` started from `directory` (recorded PID and start time)."""
    found = recorded(directory)
    if found is None:
        return []
    started = found[1].get("processes") or []
    try:
        procs.terminate([(p["pid"], p["start_time"]) for p in started], timeout=10)  # type: ignore[union-attr,index]
    except procs.ProcError as err:
        raise JoinError(str(err)) from None
    return ["stopped kubelet and kube-proxy"]


def leave(directory: Path, *, say: Callable[[str], None] = print) -> list[str]:
    """Undo `join` on this machine; returns what was cleaned. Safe to repeat."""
    found = recorded(directory)
    if found is None:
        return []
    spec, state = found
    done = stop(directory)
    if _delete_node(spec):
        done.append(f"deleted Node {spec.name}")
    done += _remove_pods(spec)
    done += _clean_iptables(str(state.get("kube_proxy", "kube-proxy")))
    if subprocess.run(["ip", "link", "show", spec.bridge], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "delete", spec.bridge], check=False, capture_output=True)
        done.append(f"deleted bridge {spec.bridge}")
    done += _remove_local(spec, ip_forward=str(state.get("ip_forward", "")))
    for line in done:
        say(line)
    return done


def follow(directory: Path, server: str, *, timeout: float = 120.0, say: Callable[[str], None] = print) -> None:
    """Point the worker in `directory` at `server`, the cluster's new API endpoint: checked first to be the same
    cluster (its serving certificate signed by the CA the worker pinned at `join`, the node's own credentials
    accepted), then written into its kubeconfigs and state, kubelet and kube-proxy restarted on them, and the
    Node Ready again through `server`. Run it again after a failure: each step is whole or not done."""
    found = recorded(directory)
    if found is None:
        raise JoinError(f"{directory} holds no worker (`gitops join` writes one)")
    spec, state = found
    credentials = _node_credentials(spec)
    try:
        with KubeAPI(server, spec.ca_file.read_text(), credentials, timeout=10) as api:
            node = api.get(f"/api/v1/nodes/{spec.name}")  # the Node authorizer lets a node read itself
    except (KubeAPIError, OSError) as err:
        raise JoinError(f"{server} is not this worker's cluster, or does not answer: {err}") from None
    if node is None:
        raise JoinError(f"{server} serves a cluster with this worker's CA but no Node {spec.name}")
    say(f"{server} serves this worker's cluster (CA pinned at join) and accepts node {spec.name}")
    for path in (spec.bootstrap_kubeconfig, spec.kubeconfig):
        if path.exists():
            config = yaml.safe_load(path.read_text())
            for entry in config.get("clusters") or []:
                entry["cluster"]["server"] = server
            _write(path, yaml.safe_dump(config, sort_keys=True), secret=True)
    state["spec"] = {**state["spec"], "server": server}  # type: ignore[dict-item]
    _save(spec, state)
    if state.get("systemd"):
        say("wrote the new server into its kubeconfigs; restart them: "
            "`systemctl restart gitops-kubelet gitops-kube-proxy`")
        return
    processes = [p for p in state.get("processes") or [] if isinstance(p, dict)]  # type: ignore[union-attr]
    # their command lines, read while they run and kept in the state before they stop: a follow killed
    # between the stop and the start finds them there when run again
    kept = state.get("commands")
    kept = kept if isinstance(kept, dict) else {}
    argvs = {str(p["name"]): _argv(p) or [str(a) for a in kept.get(str(p["name"])) or []] for p in processes}
    if not processes or not all(argvs.values()):
        raise JoinError(f"kubelet or kube-proxy of {directory} does not run as `join` recorded: start it, or "
                        f"`gitops leave --dir {directory}` and join again")
    state["commands"] = argvs
    _save(spec, state)
    restarted = dt.datetime.now(dt.timezone.utc)
    stop(directory)
    started: list[dict[str, object]] = []
    for name, argv in argvs.items():  # each recorded as it starts (the others keep their stopped entries)
        started.append(_start(spec, name, argv))
        state["processes"] = started + [p for p in processes if str(p["name"]) not in {s["name"] for s in started}]
        _save(spec, state)
    say("restarted " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in started))
    # the restarted kubelet renews its node's Lease through `server` (every 10 s), and the Node stays Ready
    deadline = time.monotonic() + timeout
    while True:
        try:
            with KubeAPI(server, spec.ca_file.read_text(), credentials, timeout=10) as api:
                lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{spec.name}")
                node = api.get(f"/api/v1/nodes/{spec.name}")
            renewed = dt.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))
            if renewed > restarted and node_ready(node or {}):
                break
        except (KubeAPIError, OSError, KeyError, TypeError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise JoinError(f"node {spec.name} not Ready through {server} after {timeout:.0f}s; "
                            f"see {spec.dir / 'kubelet.log'}")
        time.sleep(1)
    say(f"node {spec.name} Ready, its kubelet renewing its Lease through {server}")


def _node_credentials(spec: WorkerSpec) -> Credentials:
    """The kubelet's signed client certificate and key (one PEM file)."""
    try:
        pem = spec.client_certificate.read_text()
    except OSError as err:
        raise JoinError(f"the worker has no client certificate yet ({err}): wait for `gitops join` to finish") \
            from None
    key = "".join(re.findall(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----\n?", pem, re.S))
    return Credentials(pem, key)


def _argv(process: dict) -> list[str]:
    """The command line of a process `join` started, while it still runs as recorded ([] otherwise)."""
    pid, started = int(process["pid"]), process.get("start_time")
    if procs.start_time(pid) != started:
        return []
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def abandon(directory: Path) -> list[str]:
    """What `leave` undoes on this machine's disk, for a worker whose network, runtime and cluster are gone
    (a lab worker when its lab goes down): kubelet and kube-proxy stopped, kubelet's mounts undone, its pod
    logs, CNI addresses and `directory` removed. Nothing over the network, no iptables, bridge or
    ip_forward (they went with the machine's namespace). Returns what was done; safe to repeat."""
    found = recorded(directory)
    if found is None:
        return []
    return stop(directory) + _remove_local(found[0])


def _remove_local(spec: WorkerSpec, ip_forward: str = "") -> list[str]:
    """The worker's files on this machine: CNI network and addresses, kubelet's mounts (lazily, kubelet being
    stopped), pod logs, `spec.dir`; `ip_forward` put back to 0 if `join` found it so."""
    done = []
    if spec.cni_file is not None and spec.cni_file.exists():
        spec.cni_file.unlink()
    shutil.rmtree(Path("/var/lib/cni/networks") / spec.bridge, ignore_errors=True)
    try:
        done += [f"unmounted {m}" for m in procs.unmount_under(spec.dir)]
    except procs.ProcError as err:
        raise JoinError(f"{err}: stop what still uses them (fuser -vm PATH), then run this again") from None
    for entry in _pod_logs(spec):
        shutil.rmtree(entry, ignore_errors=True)
    if ip_forward == "0" and _ip_forward() == "1":
        Path("/proc/sys/net/ipv4/ip_forward").write_text("0\n")
        done.append("net.ipv4.ip_forward back to 0")
    shutil.rmtree(spec.dir, ignore_errors=True)
    done.append(f"removed {spec.dir}")
    return done


def _start(spec: WorkerSpec, name: str, argv: list[str]) -> dict[str, object]:
    try:
        proc = procs.spawn(name, spec.name, argv, spec.dir / f"{name}.log", spec.dir)
    except procs.ProcError as err:
        raise JoinError(str(err)) from None
    return {"name": name, "pid": proc.pid, "start_time": proc.start_time}


def _write(path: Path, text: str, secret: bool = False) -> None:
    """Whole or not at all (a kill leaves the old file); a secret is never readable by others, even briefly."""
    write_atomic(path, text, mode=0o600 if secret else 0o644)


def _save(spec: WorkerSpec, state: dict[str, object]) -> None:
    _write(spec.dir / STATE, json.dumps(state, indent=2, sort_keys=True) + "\n")


def _ip_forward() -> str:
    try:
        return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    except OSError:
        return ""


def _delete_node(spec: WorkerSpec) -> bool:
    """Delete our Node object with the node's own credentials (the Node authorizer allows exactly that)."""
    cert = spec.client_certificate
    if not cert.exists() or not spec.ca_file.exists():
        return False
    try:
        with KubeAPI(spec.server, spec.ca_file.read_text(), _node_credentials(spec)) as api:
            return api.delete(f"/api/v1/nodes/{spec.name}")
    except (KubeAPIError, JoinError) as err:
        log.warning("cannot delete Node %s: %s (delete it as an admin: kubectl delete node %s)",
                    spec.name, err, spec.name)
        return False


def _remove_pods(spec: WorkerSpec) -> list[str]:
    """Sandboxes kubelet left in the CRI (stopping one tears its network down through CNI)."""
    done = []
    try:
        with CRIClient(CRIEndpoint.unix(spec.name, spec.cri_endpoint.removeprefix('unix://'))) as client:
            for sandbox in client.list_sandboxes():
                if KUBELET_POD_LABEL not in sandbox.labels:
                    continue
                for container in client.list_containers(sandbox_id=sandbox.id):
                    client.stop_and_remove(container.id)
                client.stop_and_remove_sandbox(sandbox.id)
                done.append(f"removed pod {sandbox.namespace}/{sandbox.name}")
    except CRIError as err:
        log.warning("cannot clean pods from %s: %s", spec.cri_endpoint, err)
    return done


def _clean_iptables(kube_proxy: str) -> list[str]:
    """kube-proxy --cleanup, then every KUBE-* chain it leaves behind (KUBE-MARK-*, KUBE-PROXY-CANARY)."""
    if shutil.which(kube_proxy) or Path(kube_proxy).exists():
        subprocess.run([kube_proxy, "--cleanup"], capture_output=True, check=False)
    removed = []
    for table in ("nat", "filter", "mangle"):
        listing = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False)
        chains = sorted({line.split()[1] for line in listing.stdout.splitlines()
                         if line.startswith("-N KUBE-")})
        rules = [shlex.split(line) for line in listing.stdout.splitlines()
                 if line.startswith("-A ") and " KUBE-" in line and not line.split()[1].startswith("KUBE-")]
        for rule in rules:
            subprocess.run(["iptables", "-t", table, "-D", *rule[1:]], capture_output=True, check=False)
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True, check=False)
        for chain in chains:
            if subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True).returncode == 0:
                removed.append(f"{table}/{chain}")
    return [f"removed iptables chains {', '.join(removed)}"] if removed else []


def _pod_logs(spec: WorkerSpec) -> list[Path]:
    """kubelet writes pod logs under /var/log/pods/<namespace>_<pod>_<uid> whatever its root dir."""
    pods = spec.root_dir / "pods"
    uids = {p.name for p in pods.iterdir()} if pods.is_dir() else set()
    root = Path("/var/log/pods")
    dirs = [e for e in root.iterdir() if e.name.rsplit("_", 1)[-1] in uids] if root.is_dir() else []
    links = Path("/var/log/containers")
    for link in (links.iterdir() if links.is_dir() else ()):
        if link.is_symlink() and any(str(d) in str(link.readlink()) for d in dirs):
            link.unlink()
    return dirs
