"""A fresh real control plane: time from `gitops apply` to `/readyz` through the ingress, and RSS.

Starts a lab (3 containerd hypervisors, 1 public; needs root and the cached
Kubernetes binaries scripts/build-kubernetes.sh builds from their Go modules), writes a repo with
the example's team-a cluster only (3 controlplane nodes + 1 ingress, the newest release),
then runs `gitops apply` and polls `GET /readyz` through the ingress with the
admin kubeconfig every 100 ms. Once ready (and after `--settle` seconds, so the
controller-manager and scheduler have started their work), it reads the RSS of
every real component process from /proc. The lab is torn down at the end.

    python benchmarks/control_plane.py [--settle 20] [--json]

The last line with --json is one JSON object: apply_s, ready_after_apply_start_s,
and rss_mib per component (min/max over the 3 nodes).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gitops.lab.probe import admin_tls
from gitops.lab.example import write_example_repo
from gitops.lab.network import LabNetwork

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from conftest import running_lab  # noqa: E402  (tests/conftest.py: test and benchmark tooling)

SUBNET = "127.0.27"
MACHINES = LabNetwork.for_subnet(SUBNET).prefixes[0].removesuffix("0/24")  # "10.249.27."
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "haproxy")
GITOPS = str(Path(sys.executable).parent / "gitops")


def ready(host: str, port: int, context: ssl.SSLContext) -> bool:
    try:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=2)
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        return (response.status, response.read()) == (200, b"ok")
    except (OSError, http.client.HTTPException):
        return False


def component_rss() -> dict[str, list[float]]:
    """RSS (MiB) of every component process of this benchmark's lab (run it alone: another
    lab's ingress haproxy would be counted too)."""
    found: dict[str, list[float]] = {c: [] for c in COMPONENTS}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        name = os.path.basename(argv[0].decode(errors="replace"))
        # the ingress haproxy names no address in its arguments (its config does)
        # the others name their machine's address (10.249.T.N: each lab hypervisor is a machine of its own)
        mark = b"/etc/gitops/haproxy.cfg" if name == "haproxy" else MACHINES.encode()
        if name not in found or mark not in b" ".join(argv):
            continue
        rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        found[name].append(rss_kib / 1024)
    return found


def drop_path(repo: Path, name: str) -> None:
    """Delete the resource directory `name` of `repo` and its entry in gitops.yaml `spec.paths`
    (a listed directory that does not exist fails validation)."""
    shutil.rmtree(repo / name)
    config_file = repo / "gitops.yaml"
    config = yaml.safe_load(config_file.read_text())
    paths = config["spec"]["paths"]
    if name not in paths:
        raise SystemExit(f"{config_file}: spec.paths {paths} lists no {name!r}; update drop_path's caller")
    config["spec"]["paths"] = [p for p in paths if p != name]
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after ready before reading RSS")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object last")
    args = parser.parse_args()
    print("lab up (3 hypervisors, real images of the newest release) ...", flush=True)
    with running_lab("gitops-bench-cp-", hypervisors=3, public=1, subnet=SUBNET) as (base, lab):
        repo = base / "repo"
        write_example_repo(lab, repo, ingress_nodes=1)
        shutil.rmtree(repo / "clusters/team-b")
        drop_path(repo, "sip")
        state = base / "state"
        started = time.monotonic()
        subprocess.run([GITOPS, "apply", str(repo), "--state-dir", str(state)], check=True,
                       stdout=subprocess.DEVNULL)
        applied = time.monotonic() - started
        kubeconfig = yaml.safe_load(subprocess.run(
            [GITOPS, "kubeconfig", str(repo), "--state-dir", str(state), "--cluster", "team-a"],
            check=True, capture_output=True, text=True).stdout)
        host, port, context = admin_tls(yaml.safe_dump(kubeconfig))
        while not ready(host, port, context):
            if time.monotonic() - started > 300:
                raise SystemExit("the API never answered /readyz through the ingress")
            time.sleep(0.1)
        ready_s = time.monotonic() - started
        print(f"gitops apply (4 pods, 17 containers)            {applied:6.1f} s")
        print(f"apply start -> /readyz ok through the ingress   {ready_s:6.1f} s")
        time.sleep(args.settle)
        rss = component_rss()
        for name in COMPONENTS:
            values = rss[name]
            print(f"RSS {name:24} " + (f"{min(values):6.0f}-{max(values):4.0f} MiB  (n={len(values)})"
                                        if values else "not found"))
        if args.json:
            print(json.dumps({"apply_s": round(applied, 2), "ready_after_apply_start_s": round(ready_s, 2),
                              "rss_mib": {n: {"min": round(min(v)), "max": round(max(v)), "n": len(v)}
                                          for n, v in sorted(rss.items()) if v}}, sort_keys=True))


if __name__ == "__main__":
    main()
