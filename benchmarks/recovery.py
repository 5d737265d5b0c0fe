"""Disaster recovery on a lab: how long a restore takes the API away, and a drain under the probe.

Brings up a lab (one public hypervisor, two private ones, then a third private one added empty),
applies the example repo (team-a and team-b, real control planes behind haproxy), then:

* restore: a snapshot of team-a (`gitops backup create`, a local restic repository), then
  `spec.restore` naming it, applied while a probe asks team-a's API through the ingress every 0.1 s:
  the downtime is the longest run of failed requests, from the first failure to the next success;
* drain: `spec.drain` on hv-private-1, which holds three controlplane nodes (two of team-a, one of
  team-b), applied plan after plan until it holds none, while a probe asks each cluster's API every
  0.1 s: every request must succeed.

Run it alone, under the lab lock (root; the cached Kubernetes build), about 8 minutes on 2 cores:
`flock /tmp/gitops-lab.lock .venv/bin/python benchmarks/recovery.py [--json]`. Prints a line per step; with --json the last line is
one JSON object: restore_downtime_s, restore_apply_s, restore_requests, restore_failed,
drain_nodes, drain_applies, drain_s, drain_requests, drain_failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import yaml  # noqa: E402
from conftest import running_lab  # noqa: E402

from gitops.lab.probe import target  # noqa: E402

GITOPS = str(Path(sys.executable).parent / "gitops")
SUBNET = "127.0.42"


def gitops(*args: str) -> str:
    done = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"gitops {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


class Watch(threading.Thread):
    """GET /api/v1/namespaces/default every 0.1 s; remembers when each request was made and whether it failed."""

    def __init__(self, kubeconfig: str):
        super().__init__(daemon=True)
        self.where = target(kubeconfig)
        self.samples: list[tuple[float, bool]] = []
        self.stopping = threading.Event()

    def ok(self) -> bool:
        import http.client
        conn = http.client.HTTPSConnection(self.where.host, self.where.port, context=self.where.context, timeout=5)
        try:
            conn.request("GET", "/api/v1/namespaces/default")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            self.samples.append((time.monotonic(), self.ok()))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=15)

    def failed(self) -> int:
        return sum(1 for _, ok in self.samples if not ok)

    def longest_outage(self) -> float:
        longest, began = 0.0, None
        for at, ok in self.samples:
            if not ok and began is None:
                began = at
            elif ok and began is not None:
                longest, began = max(longest, at - began), None
        if began is not None:
            longest = max(longest, self.samples[-1][0] - began)
        return round(longest, 1)


def set_spec(path: Path, **fields: object) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    docs[0]["spec"].update(fields)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, object] = {}
    print("lab up: 1 public and 3 private hypervisors ...", flush=True)
    with running_lab("gitops-bench-recovery-", hypervisors=4, public=1, subnet=SUBNET) as (base, _):
        lab_dir, repo, state = base / "lab", base / "repo", base / "state"
        gitops("lab", "example-repo", "--ingress-nodes", "1", "--dir", str(lab_dir), str(repo))
        third = repo / "hypervisors" / "hv-private-3.yaml"  # the lab's fourth machine: added empty, later
        held_back = third.read_text()
        third.unlink()
        print("applying team-a and team-b ...", flush=True)
        gitops("apply", str(repo), "--state-dir", str(state))
        kubeconfigs = {c: gitops("kubeconfig", str(repo), "--state-dir", str(state), "--cluster", c)
                       for c in ("team-a", "team-b")}

        # restore
        config, cluster = repo / "gitops.yaml", repo / "clusters/team-a/cluster.yaml"
        config.write_text(config.read_text() + "  backup:\n    targets:\n      - name: local\n"
                          f"        repository: {base / 'backups'}\n        password: bench password\n")
        set_spec(cluster, backup={"target": "local", "keep": 3})
        snapshot = gitops("backup", "create", str(repo), "--state-dir", str(state), "--cluster", "team-a").strip()
        set_spec(cluster, restore={"snapshot": snapshot[:8]})
        watch = Watch(kubeconfigs["team-a"])
        watch.start()
        started = time.monotonic()
        gitops("apply", str(repo), "--state-dir", str(state))
        out["restore_apply_s"] = round(time.monotonic() - started, 1)
        while not watch.samples or not watch.samples[-1][1]:
            time.sleep(0.2)  # until the API answers again through the ingress
        time.sleep(1)
        watch.stop()
        out.update(restore_downtime_s=watch.longest_outage(), restore_requests=len(watch.samples),
                   restore_failed=watch.failed())
        print(f"restore: apply {out['restore_apply_s']} s, the API away {out['restore_downtime_s']} s "
              f"({out['restore_failed']} of {out['restore_requests']} requests failed)", flush=True)

        # drain: a third private hypervisor, then hv-private-1 drained
        third.write_text(held_back)
        gitops("apply", str(repo), "--state-dir", str(state))
        nodes = json.loads((state / "state.json").read_text())["nodes"]
        held = sorted(n for n, r in nodes.items() if r["hypervisor"] == "hv-private-1")
        out["drain_nodes"] = len(held)
        print(f"drain: hv-private-1 holds {', '.join(held)}", flush=True)
        hv_file = repo / "hypervisors" / "hv-private-1.yaml"
        doc = yaml.safe_load(hv_file.read_text())
        doc["spec"]["drain"] = True
        hv_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        watches = [Watch(kubeconfigs[c]) for c in ("team-a", "team-b")]
        for w in watches:
            w.start()
        started, applies = time.monotonic(), 0
        while applies < 6:
            nodes = json.loads((state / "state.json").read_text())["nodes"]
            if not any(r["hypervisor"] == "hv-private-1" for r in nodes.values()):
                break
            gitops("apply", str(repo), "--state-dir", str(state))
            applies += 1
        out["drain_s"] = round(time.monotonic() - started, 1)
        time.sleep(2)
        for w in watches:
            w.stop()
        out.update(drain_applies=applies, drain_requests=sum(len(w.samples) for w in watches),
                   drain_failed=sum(w.failed() for w in watches))
        print(f"drain: {out['drain_applies']} applies in {out['drain_s']} s, {out['drain_failed']} of "
              f"{out['drain_requests']} requests failed", flush=True)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
