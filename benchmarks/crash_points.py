"""Every crash point of day-2 plans: SIGKILL the applier after each action and inside each wait (issue #26).

Starts its own lab (3 containerd hypervisors on 127.0.29.x, 1 public; needs root and the cached
Kubernetes binaries scripts/build-kubernetes.sh builds from their Go modules), writes the example repo with the team-a
cluster only (3 controlplane nodes + 1 ingress, the newest release) and applies it. Then for each scenario
(`tests/crashpoints.py` SCENARIOS: leaf-renewal, etcd-image, node-replacement, ca-rotation,
scale-3-1-3, worker-certificate-signing, for which lab-worker-1 joins first from its own network
namespace) it makes the scenario's plan again and again, each round from where the last one left
the lab, and kills `gitops apply` once after every action k = 1..N and once inside every gated action
(etcd health, `/readyz`), then applies again and checks: converged (plan empty), etcd members as
recorded, a ConfigMap written before still there, no probe failure through the ingress outside the
window of a stopped API server (`crashpoints.run_crash_point`, tests/crashpoints.py).

Prints a line per step and a table (scenario, kill point, action killed after, outcome, seconds);
`--json` ends with one JSON object holding the rows. `--scenario NAME` runs one (repeatable),
`--limit N` only the first N points of each, `--stride S` every S-th point, `--resume LOG` skips the
points that converged in an earlier run (its `--json` output; repeatable), so an exploration can be
spread over several sittings. The lab is torn down on exit, Ctrl-C and SIGTERM included.
Run it alone, under the lab lock: `flock /tmp/gitops-lab.lock .venv/bin/python benchmarks/crash_points.py`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import crashpoints  # noqa: E402  (tests/crashpoints.py: test and benchmark tooling, not shipped)

SUBNET = "127.0.29"


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def table(rows: list[crashpoints.Outcome]) -> list[str]:
    """The rows as fixed-width text lines, in the order they ran."""
    head = ("scenario", "variant", "kill point", "action", "outcome", "seconds")
    cells = [(r.scenario, r.variant or "-", r.point, r.action, r.outcome, f"{r.seconds:.1f}") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *cells]]


def explored(logs: list[Path]) -> dict[str, set[tuple[str, str, str]]]:
    """The points that converged in earlier `--json` runs (the JSON object is the log's last line), as
    scenario -> {(variant, point key, action text)}."""
    done: dict[str, set[tuple[str, str, str]]] = {}
    for log in logs:
        lines = log.read_text().strip().splitlines()
        try:
            rows = json.loads(lines[-1])["rows"] if lines else None
        except (ValueError, KeyError, TypeError):
            rows = None
        if not isinstance(rows, list):
            raise SystemExit(f"{log}: its last line is not the JSON object of a --json run")
        for row in rows:
            try:
                if row["outcome"] == "converged":
                    point = (row["variant"], crashpoints.point_key(row["point"]), row["action"])
                    done.setdefault(row["scenario"], set()).add(point)
            except (KeyError, TypeError):
                raise SystemExit(f"{log}: a row without scenario, variant, point, action and outcome: {row!r:.200}")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=sorted(crashpoints.SCENARIOS),
                        help="run this scenario only (repeatable; default: all, in the order of SCENARIOS)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N crash points of each scenario")
    parser.add_argument("--stride", type=int, default=1,
                        help="only every S-th crash point of each list (after-points, inside-points): a sample")
    parser.add_argument("--resume", action="append", type=Path, default=[], metavar="LOG",
                        help="skip the points that converged in this earlier --json run's output (repeatable)")
    parser.add_argument("--subnet", default=SUBNET, help="the lab's loopback /24 (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="end with the rows as one JSON object")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root: the lab runs real containerd instances", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    names = args.scenario or list(crashpoints.SCENARIOS)
    skip = explored(args.resume)
    rows: list[crashpoints.Outcome] = []
    started = time.monotonic()
    interrupted = False
    try:
        print("lab up (3 hypervisors, team-a applied) ...", flush=True)
        with crashpoints.workspace("gitops-bench-crash-", args.subnet) as ws:
            print(f"team-a applied and ready in {ws.dir} in {time.monotonic() - started:.1f}s", flush=True)
            for name in names:
                crashpoints.explore(ws, crashpoints.SCENARIOS[name], log=lambda s: print(s, flush=True),
                                    limit=args.limit, outcomes=rows, stride=args.stride,
                                    skip=skip.get(name, set()))
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: lab torn down", flush=True)
    print()
    for line in table(rows):
        print(line)
    failed = [r for r in rows if not r.ok]
    print(f"\n{len(rows)} crash point(s), {len(rows) - len(failed)} converged, {len(failed)} failed, "
          f"{time.monotonic() - started:.0f}s")
    for row in failed:
        print(f"\n{row.scenario} {row.variant} {row.point} ({row.action}):")
        for problem in row.problems:
            print("  " + problem.replace("\n", "\n  "))
    if args.json:
        print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python "
                                     f"{platform.python_version()}",
                          "scenarios": names, "interrupted": interrupted,
                          "rows": [r.row() for r in rows]}, sort_keys=True))
    return 130 if interrupted else (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
