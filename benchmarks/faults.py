"""Network faults on a lab of machines of their own: what a partition, a leader's partition and a power cut
cost team-a's API (issue #43.4).

Brings up a lab of one public and three private hypervisors, each in its own network namespace on the lab
bridge and reached over its mTLS front, applies team-a with one member per private machine, then runs each
scenario `--rounds` times (tests/faults.py):

* member: a follower member's machine partitioned from everything (iptables in its namespace) for about
  30 s, plan and apply while it is cut off, heal, converge;
* leader: the same for the etcd leader's machine: how long until the two others agree on a new leader;
* power: a follower member's machine powered off (every process SIGKILLed, link down), apply, power on,
  the next apply brings its node back from the recorded state.

During each, a probe reads through the ingress every 100 ms and a writer creates a ConfigMap every 200 ms;
every acknowledged ConfigMap must be there afterwards. Prints one line per round; with --json the last
line is one JSON object: per scenario a list of rounds, each with requests, failed_requests, outages,
writes_acknowledged, writes_failed, writes_lost, leaderless_s (leader), members_replaced, plan_exit,
apply_exit (3: incomplete, naming the machine), and the lab's memory (rss_mib: every process of each
machine).

Run it alone, under the lab lock (root; the cached Kubernetes build), about 4 minutes a round on 2 cores:
`flock /tmp/gitops-lab.lock .venv/bin/python benchmarks/faults.py [--rounds N] [--json]`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from conftest import running_lab  # noqa: E402
from faults import make_world, partition_member, power_cycle, public  # noqa: E402

from gitops import lab as labmod  # noqa: E402
from gitops.lab import network  # noqa: E402

SUBNET = "127.0.43"


def machine_rss_mib(lab: labmod.LabInfo) -> dict[str, float]:
    """Resident memory of every process of each machine (containerd, front, pods), MiB."""
    return {hv.name: round(network.rss_kib(hv.netns) / 1024, 1) for hv in lab.hypervisors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"member": [], "leader": [], "power": []}
    with running_lab("gitops-bench-faults-") as (base, _):
        print("lab up and team-a applied ...", flush=True)
        world = make_world(base, SUBNET)
        results["rss_mib"] = machine_rss_mib(world.lab)
        print(f"memory per machine (MiB): {results['rss_mib']}", flush=True)
        for n in range(args.rounds):
            for name, run in (("member", lambda: partition_member(world, leader=False)),
                              ("leader", lambda: partition_member(world, leader=True)),
                              ("power", lambda: power_cycle(world))):
                figures = public(run())
                results[name].append(figures)  # type: ignore[union-attr]
                print(f"round {n + 1} {name}: {json.dumps(figures, sort_keys=True)}", flush=True)
    if args.json:
        print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
