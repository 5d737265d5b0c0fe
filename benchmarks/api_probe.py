"""Day-2 operations under the API probe: failed requests and duration of each (issue #13).

Starts a lab (3 containerd hypervisors on 127.0.28.x, 1 public; needs root and the cached
Kubernetes binaries scripts/build-kubernetes.sh builds from their Go modules), writes the example repo with the
team-a cluster only (3 controlplane nodes + 1 ingress, the newest release) and applies it. Then, for each
operation, it writes a ConfigMap through the ingress, starts the probe of `gitops.lab.probe`
(`GET /api/v1/namespaces/default` through the ingress every 100 ms, a fresh TLS connection each
time, as the admin of `gitops kubeconfig`), edits the repo, runs `gitops apply`, waits until
`/readyz` is ok and 2 s more, stops the probe and reads the ConfigMap back:

  idle               nothing applied for 20 s (the probe's floor)
  etcd-image         spec.images.etcd: the same etcd under another reference (3 members, rolling)
  apiserver-flag     spec.apiServer.extraArgs event-ttl (3 API servers, rolling)
  certificate-renewal  validityDays 400 / renewBeforeDays 366: every leaf re-issued, its readers restarted
  node-replacement   team-a-cp-3 leaves the repo and team-a-cp-4 joins in the same commit
  ca-rotation        spec.certificates.caGeneration 1 -> 2, applied until the plan is empty (one apply per
                     phase: trust both, re-issue, drop old); after each apply the probe switches to the admin
                     kubeconfig gitops publishes then

It prints per operation: requests, failed requests, outages (failed, and the immediate retry
failed too), apply and total duration, and what a plan right after it still shows (applied
before the next operation); `--json` ends with one JSON object. Run it alone, under
the lab lock: `flock /tmp/gitops-lab.lock .venv/bin/python benchmarks/api_probe.py`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from gitops import lab as labmod
from gitops.lab import kubebin
from gitops.lab.example import write_example_repo
from gitops.lab.probe import Probe

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from conftest import running_lab  # noqa: E402  (tests/conftest.py: test and benchmark tooling)

SUBNET = "127.0.28"
GITOPS = str(Path(sys.executable).parent / "gitops")


class Bench:
    def __init__(self, base: Path, lab: labmod.LabInfo):
        self.base, self.lab = base, lab
        self.repo, self.state = base / "repo", base / "state"
        self.kubeconfig = base / "team-a.kubeconfig"

    def gitops(self, *args: str) -> str:
        proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"gitops {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def apply(self) -> str:
        return self.gitops("apply", str(self.repo), "--state-dir", str(self.state))

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(self.kubeconfig), "--request-timeout=10s",
                               *args], capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}")
        return proc

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "--raw", "/readyz", check=False).stdout.strip() != "ok":
            if time.monotonic() > deadline:
                raise SystemExit("team-a never answered /readyz through the ingress")
            time.sleep(0.5)

    def edit(self, rel: str, change: Callable[[list[dict]], None]) -> None:
        path = self.repo / rel
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        change(docs)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def kubeconfig_text(self) -> str:
        return self.gitops("kubeconfig", str(self.repo), "--state-dir", str(self.state), "--cluster", "team-a")

    def operation(self, name: str, change: Callable[[], None] | None,
                  run: Callable[[Probe], str] | None = None) -> dict:
        """One operation under the probe; its figures. `run`: applies itself (instead of one apply)."""
        self.wait_ready()
        self.kubectl("-n", "default", "create", "configmap", f"probe-{name}", f"--from-literal=made={name}")
        probe = Probe(self.kubeconfig.read_text())
        probe.start()
        started = time.monotonic()
        try:
            if run is not None:
                output = run(probe)
            elif change is None:
                time.sleep(20)
                output = ""
            else:
                change()
                output = self.apply()
            applied = time.monotonic() - started
            self.wait_ready()
            time.sleep(2)
        finally:
            counts = probe.stop()
        data = self.kubectl("-n", "default", "get", "configmap", f"probe-{name}", "-o", "jsonpath={.data.made}",
                            check=False)
        actions = sum(1 for line in output.splitlines() if line.startswith("["))
        return {"operation": name, "requests": counts.requests, "failed": counts.failures,
                "outages": counts.outages, "apply_s": round(applied, 1), "probed_s": round(counts.seconds, 1),
                "actions": actions, "data_kept": data.returncode == 0 and data.stdout == name,
                "errors": list(counts.errors[:5])}


def set_cluster(spec_change: Callable[[dict], None]) -> Callable[[list[dict]], None]:
    def change(docs: list[dict]) -> None:
        spec_change(docs[0]["spec"])
    return change


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="end with the figures as one JSON object")
    args = parser.parse_args()
    results = []
    print("lab up (3 hypervisors, real images of the newest release) ...", flush=True)
    with running_lab("gitops-bench-probe-", hypervisors=3, public=1, subnet=SUBNET) as (base, lab):
        bench = Bench(base, lab)
        write_example_repo(lab, bench.repo, ingress_nodes=1)
        shutil.rmtree(bench.repo / "clusters/team-b")
        shutil.rmtree(bench.repo / "sip")
        bench.edit("gitops.yaml", lambda docs: docs[0]["spec"].update(
            paths=[p for p in docs[0]["spec"]["paths"] if p != "sip"]))
        started = time.monotonic()
        bench.apply()
        bench.kubeconfig.touch(mode=0o600)
        bench.kubeconfig.write_text(bench.kubeconfig_text())
        bench.wait_ready()
        print(f"team-a applied and ready through the ingress in {time.monotonic() - started:.1f} s", flush=True)
        etcd = lab.etcd_image().rsplit(":", 1)[0] + ":probe"
        labmod.alias_image(lab.etcd_image(), etcd, lab.dir)
        cluster = "clusters/team-a/cluster.yaml"

        def replace_node() -> None:
            def change(docs: list[dict]) -> None:
                next(d for d in docs if d["metadata"]["name"] == "team-a-cp-3")["metadata"]["name"] = "team-a-cp-4"
            bench.edit("clusters/team-a/nodes.yaml", change)

        def rotate_ca(probe: Probe) -> str:
            bench.edit(cluster, set_cluster(lambda s: s.setdefault("certificates", {}).update(caGeneration=2)))
            outputs = []
            for _ in range(6):  # 3 phases, and a restart of a leader-elected component that lost its Lease
                if "No changes." in bench.gitops("plan", str(bench.repo), "--state-dir", str(bench.state)):
                    break
                outputs.append(bench.apply())
                bench.kubeconfig.write_text(bench.kubeconfig_text())
                probe.use_kubeconfig(bench.kubeconfig.read_text())
            else:
                raise SystemExit("the CA rotation did not converge in 6 applies")
            return "".join(outputs)

        operations: list[tuple[str, Callable[[], None] | None]] = [
            ("idle", None),
            ("etcd-image", lambda: bench.edit(cluster, set_cluster(lambda s: s.setdefault("images", {}).update(
                etcd=etcd)))),
            ("apiserver-flag", lambda: bench.edit(cluster, set_cluster(lambda s: s["apiServer"].update(
                extraArgs={"event-ttl": "2h0m0s"})))),
            ("certificate-renewal", lambda: bench.edit(cluster, set_cluster(lambda s: s.update(
                certificates={"validityDays": 400, "renewBeforeDays": 366})))),
            ("node-replacement", replace_node),
            ("ca-rotation", None),
        ]
        print(f"{'operation':22} {'requests':>8} {'failed':>7} {'outages':>8} {'actions':>8} {'apply':>8} "
              f"{'probed':>8}  data kept", flush=True)
        for name, change in operations:
            row = bench.operation(name, change, rotate_ca if name == "ca-rotation" else None)
            results.append(row)
            print(f"{name:22} {row['requests']:8d} {row['failed']:7d} {row['outages']:8d} {row['actions']:8d} "
                  f"{row['apply_s']:7.1f}s {row['probed_s']:7.1f}s  {'yes' if row['data_kept'] else 'NO'}",
                  flush=True)
            for error in row["errors"]:
                print(f"    {error}", flush=True)
            if name == "certificate-renewal":  # back to the usual window: the new leaves are outside it
                bench.edit(cluster, set_cluster(lambda s: s.update(
                    certificates={"validityDays": 365, "renewBeforeDays": 30})))
            # what is left to do afterwards (a leader-elected component that exited when it could not renew
            # its Lease in time is restarted by the next apply, as the controller's next poll does)
            left = [line.strip() for line in bench.gitops("plan", str(bench.repo), "--state-dir",
                                                          str(bench.state)).splitlines()
                    if line.strip()[:2] in ("+ ", "~ ", "- ")]
            row["left_after"] = left
            for line in left:
                print(f"    left after it: {line}", flush=True)
            if left:
                bench.apply()
        if args.json:
            print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python "
                                         f"{platform.python_version()}",
                              "load_average": [round(x, 2) for x in os.getloadavg()],
                              "operations": results}, sort_keys=True))


if __name__ == "__main__":
    main()
