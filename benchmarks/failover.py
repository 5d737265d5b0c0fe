"""Failover of a cluster's virtual IP: what powering off the public machine that holds it costs the API
(issue #44.5).

Brings up a lab of two private and two public machines (network namespaces on the lab bridge), applies
team-a with one controlplane node and two ingress nodes behind a virtual IP (keepalived beside haproxy in
each ingress pod, tests/failover.py), then `--rounds` times: powers off the machine holding the address
under the probe (reads through the virtual IP every 100 ms, 1 s timeout) and a writer (a ConfigMap every
200 ms), powers it on, applies (its ingress node restored, under the probe too). Then one partition of the
holder and its heal. Prints one line per round and the outage seconds per failover (min/median/max);
with --json the last line is one JSON object: rounds (takeover_s, outage_s, requests, failed_requests,
writes_acknowledged, writes_lost, restore_failed_requests, ...), outage_s {min, median, max},
failed_requests, writes_lost, partition.

Run it alone, under the lab lock (root; the cached Kubernetes build), about 30 s a round on 2 cores:
`flock /tmp/gitops-lab.lock .venv/bin/python benchmarks/failover.py [--rounds N] [--json]`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from conftest import running_lab  # noqa: E402
from failover import make_world, partition_holder, power_off_holder, public  # noqa: E402

SUBNET = "127.0.47"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds: list[dict[str, object]] = []
    with running_lab("gitops-bench-failover-") as (base, _):
        print("lab up and team-a applied (two ingress nodes, a virtual IP) ...", flush=True)
        world = make_world(base, SUBNET)
        print(f"virtual IP {world.virtual_ip()}, held by {world.wait_holder()}", flush=True)
        for n in range(args.rounds):
            figures = public(power_off_holder(world))
            rounds.append(figures)
            print(f"round {n + 1}: {json.dumps(figures, sort_keys=True)}", flush=True)
        partition = public(partition_holder(world))
        print(f"partition: {json.dumps(partition, sort_keys=True)}", flush=True)
    outages = [float(r["outage_s"]) for r in rounds]  # type: ignore[arg-type]
    summary = {"outage_s": {"min": min(outages), "median": statistics.median(outages), "max": max(outages)},
               "takeover_s": {"min": min(float(r["takeover_s"]) for r in rounds),  # type: ignore[arg-type]
                              "max": max(float(r["takeover_s"]) for r in rounds)},  # type: ignore[arg-type]
               "failed_requests": sum(int(r["failed_requests"]) for r in rounds),  # type: ignore[call-overload]
               "restore_failed_requests": sum(int(r["restore_failed_requests"]) for r in rounds),  # type: ignore[call-overload]
               "writes_lost": sum(int(r["writes_lost"]) for r in rounds)}  # type: ignore[call-overload]
    print(f"outage per failover over {len(rounds)}: min {summary['outage_s']['min']:.2f} s, "  # type: ignore[index]
          f"median {summary['outage_s']['median']:.2f} s, max {summary['outage_s']['max']:.2f} s; "  # type: ignore[index]
          f"{summary['failed_requests']} failed requests, {summary['writes_lost']} writes lost", flush=True)
    if args.json:
        print(json.dumps({"rounds": rounds, "partition": partition, **summary}, sort_keys=True))


if __name__ == "__main__":
    main()
