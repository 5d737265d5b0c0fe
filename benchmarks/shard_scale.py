#!/usr/bin/env python3
"""Sharding at scale (issue #14): N recorded clusters over S shards and R replica processes.

Reuses `plan_scale.py`'s generated repo and its cached converged state and snapshot
(`benchmarks/.cache`, same key). Starts a real kube-apiserver + etcd
(`tests/kubeapi.py`, on 127.0.30.240; no hypervisors, so no lab lock) for the Leases,
then R replica processes. Each replica runs a real coordination `Member` (renewals in its
background thread), waits until the S shard Leases are spread (at most ceil(S / R) each),
then loads what a controller of its shards loads (the whole repo model and recorded state,
the snapshot files of its own clusters only) and plans its clusters: first plan of the
process, then the steady state (best of --repeat), asserting an empty, complete plan.
It prints per-replica plan times and peak RSS. Then:

* Lease traffic: the API server's `apiserver_request_total{resource="leases"}` over a
  window, i.e. the QPS R replicas cost it while nothing changes;
* takeover: one replica is SIGKILLed; the time until every one of its shards is held by
  another replica (leaseDuration after they last saw it renewed, plus up to a retry period);
* status-branch contention: R processes each publish --commits commits of their own
  files to one bare repo holding one status file per cluster, concurrently
  (`StatusBranch.publish`: fetch, reset, write, commit, push, redone on a rejected push):
  commits per second and rejected pushes per commit.

    .venv/bin/python benchmarks/shard_scale.py --quick         # 200 clusters, 4 shards, 3 replicas
    .venv/bin/python benchmarks/shard_scale.py                 # 10,000 clusters / 500 hv, 10 shards, 3 replicas
    .venv/bin/python benchmarks/shard_scale.py --replicas 5 --json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "benchmarks", REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import plan_scale  # noqa: E402

from gitops.controller import scoped_model  # noqa: E402
from gitops.kubeapi import KubeAPI  # noqa: E402
from gitops.coordination.lease import LeaseAPI, Timing  # noqa: E402
from gitops.coordination.member import Member  # noqa: E402
from gitops.coordination.scope import Scope  # noqa: E402
from gitops.coordination.shards import fair_share, shard_leases  # noqa: E402
from gitops.engine import make_plan  # noqa: E402
from gitops.model.validate import validate_repo  # noqa: E402
from gitops.state.records import State  # noqa: E402
from gitops.status.branch import PUSH_ATTEMPTS, StatusBranch, StatusError  # noqa: E402
from gitops.status.snapshot import load_snapshot  # noqa: E402

API_IP = "127.0.30.240"
NAMESPACE = "gitops-bench"


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- one replica (a child process)


def replica(name: str, kubeconfig: str, shards: int, timing: Timing, repo: str, entry: str, repeat: int,
            go, results) -> None:
    """Hold Leases like a controller; once told, plan this replica's clusters and report; keep renewing."""
    api = KubeAPI.from_kubeconfig(kubeconfig, timeout=max(1.0, min(5.0, timing.renew_deadline / 2)))
    member = Member(LeaseAPI(api, NAMESPACE), name, shard_leases(shards), timing)
    member.tick()
    member.start()
    go.wait()
    held = frozenset(member.held())
    scope = Scope("shards", shards, held)
    t = time.perf_counter()
    validation = validate_repo(repo)
    validate_s = time.perf_counter() - t
    model, config = scoped_model(validation.model, scope), validation.repo.config
    del validation
    t = time.perf_counter()
    state = scope.narrow_state(State.from_dict(json.loads((Path(entry) / "state.json").read_text())))
    files = [f"{c}.json" for c in sorted(model.clusters)]
    observed = load_snapshot(lambda rel: _read(Path(entry) / rel), files)
    load_s = time.perf_counter() - t
    t, cpu = time.perf_counter(), time.process_time()
    plan = make_plan(model, config, state, observed, now=plan_scale.NOW).plan
    first_s, first_cpu = time.perf_counter() - t, time.process_time() - cpu
    assert plan.empty and plan.complete, (len(plan.actions), plan.unknowns[:2])
    steady, steady_cpu = [], []
    for _ in range(repeat):
        t, cpu = time.perf_counter(), time.process_time()
        plan = make_plan(model, config, state, observed, now=plan_scale.NOW).plan
        steady.append(time.perf_counter() - t)
        steady_cpu.append(time.process_time() - cpu)
        assert plan.empty
    results.put({"replica": name, "shards": sorted(held), "clusters": len(model.clusters),
                 "validate_s": validate_s, "load_s": load_s, "plan_first_s": first_s,
                 "plan_steady_s": min(steady), "plan_first_cpu_s": first_cpu, "plan_steady_cpu_s": min(steady_cpu),
                 "rss_mib": rss_mib()})
    signal.pause()  # renewals go on in the Member's thread until the parent kills us


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


# --------------------------------------------------------------------------- status branch contention


def publisher(name: str, origin: str, workdir: str, clusters: list[str], commits: int, results) -> None:
    branch = StatusBranch(origin, Path(workdir))
    rejected = 0
    real_sync = branch.sync

    def counting_sync():
        nonlocal rejected
        rejected += 1
        return real_sync()

    branch.sync = counting_sync  # type: ignore[method-assign]  # one sync per attempt
    started = time.perf_counter()
    gave_up = 0
    for i in range(commits):
        cluster = clusters[i % len(clusters)]
        rel = f"status/Cluster/{cluster}.yaml"
        try:
            branch.publish(lambda b, rel=rel, i=i: b.write_tree({rel: f"round: {i}\n".encode()}, (rel,)),
                           f"{name} {i}")
        except StatusError:
            gave_up += 1  # still racing after PUSH_ATTEMPTS: the caller would publish again next poll
    results.put({"replica": name, "commits": commits - gave_up, "seconds": time.perf_counter() - started,
                 "attempts": rejected, "gave_up": gave_up})


def contention(n_clusters: int, replicas: int, shards: int, commits: int, tmp: Path) -> dict:
    origin = tmp / "status.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    seed = StatusBranch(str(origin), tmp / "seed")
    names = [f"c{c:05d}" for c in range(1, n_clusters + 1)]
    seed.publish(lambda b: b.write_tree({f"status/Cluster/{n}.yaml": b"round: -1\n" for n in names}, ("status",)),
                 "seed")
    share = [names[i::replicas] for i in range(replicas)]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=publisher, args=(f"r{i}", str(origin), str(tmp / f"pub-{i}"), share[i],
                                                             commits, results)) for i in range(replicas)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    rows = [results.get(timeout=3600) for _ in procs]
    wall = time.perf_counter() - started
    for p in procs:
        p.join()
    total = sum(r["commits"] for r in rows)
    on_branch = int(subprocess.run(["git", "--git-dir", str(origin), "rev-list", "--count", "gitops/status"],
                                   capture_output=True, text=True, check=True).stdout) - 1
    assert on_branch == total, (on_branch, total)
    gave_up = sum(r["gave_up"] for r in rows)
    return {"commits": total, "wall_s": wall, "commits_per_s": total / wall,
            "rejected_per_commit": (sum(r["attempts"] for r in rows) - total - gave_up * PUSH_ATTEMPTS) / total,
            "commit_latency_s": sum(r["seconds"] for r in rows) / total, "gave_up": gave_up}


# --------------------------------------------------------------------------- the parent


def lease_requests(api) -> float:
    """The API server's count of requests on Leases so far."""
    with urllib.request.urlopen(urllib.request.Request(api.url + "/metrics"), context=api.ssl_context,
                                timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{") and 'resource="leases"' in line)


def holders(leases: LeaseAPI, shards: int) -> dict[str, str]:
    records = leases.list()
    return {n: records[n].holder if n in records else "" for n in shard_leases(shards)}


def measure_replicas(args, timing: Timing, repo: Path, entry: Path, out: dict, ctx) -> None:
    """Replica processes on real Leases: plan time and memory each, Lease QPS, takeover after a kill."""
    from kubeapi import kube_api_server

    with kube_api_server(API_IP) as api:
        api.ensure_namespace(NAMESPACE)
        leases = LeaseAPI(KubeAPI.from_kubeconfig(api.admin_kubeconfig), NAMESPACE)
        go, results = ctx.Event(), ctx.Queue()
        procs: dict = {}
        try:
            for i in range(args.replicas):
                name = f"replica-{i}"
                procs[name] = ctx.Process(daemon=True, target=replica, args=(
                    name, str(api.admin_kubeconfig), args.shards, timing, str(repo), str(entry), args.repeat, go,
                    results))
                procs[name].start()
            share, floor = fair_share(args.shards, args.replicas), args.shards // args.replicas
            deadline = time.monotonic() + 120 + 4 * timing.lease_duration
            while True:  # until every shard is held, each replica between floor and ceil of S / R
                held = holders(leases, args.shards)
                counts = [list(held.values()).count(n) for n in procs]
                if all(held.values()) and max(counts) <= share and min(counts) >= floor:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"shards not spread: {held}")
                time.sleep(0.5)
            out["spread_s"] = time.monotonic() - (deadline - 120 - 4 * timing.lease_duration)
            go.set()
            rows = sorted((results.get(timeout=7200) for _ in procs), key=lambda r: r["replica"])
            out["per_replica"] = rows
            print(f"\n{'replica':<11} {'shards':>6} {'clusters':>8} {'validate':>9} {'load':>7} {'1st plan':>9} "
                  f"{'plan':>7} {'(CPU)':>13} {'peak RSS':>9}")
            for r in rows:
                print(f"{r['replica']:<11} {len(r['shards']):>6} {r['clusters']:>8} {r['validate_s']:>8.1f}s "
                      f"{r['load_s']:>6.1f}s {r['plan_first_s']:>8.1f}s {r['plan_steady_s']:>6.2f}s "
                      f"({r['plan_first_cpu_s']:>4.0f}s/{r['plan_steady_cpu_s']:>4.2f}s) "
                      f"{r['rss_mib']:>6.0f} MiB")

            before, t0 = lease_requests(api), time.monotonic()
            time.sleep(max(20, 5 * timing.retry_period))
            qps = (lease_requests(api) - before) / (time.monotonic() - t0)
            out["lease_qps"] = qps
            print(f"\nLease requests while idle: {qps:.1f}/s for {args.replicas} replicas "
                  f"(retry period {timing.retry_period:g}s; per replica per round: 1 list, 1 heartbeat, 1 per shard)")

            victim = max(rows, key=lambda r: len(r["shards"]))
            orphans = victim["shards"]
            os.kill(procs[victim["replica"]].pid, signal.SIGKILL)
            killed = time.monotonic()
            while True:
                held = holders(leases, args.shards)
                if all(held[s] not in ("", victim["replica"]) for s in orphans):
                    break
                if time.monotonic() - killed > 10 * timing.lease_duration:
                    raise SystemExit(f"no takeover: {held}")
                time.sleep(0.1)
            out["takeover_s"] = time.monotonic() - killed
            print(f"takeover of {len(orphans)} shard(s) after SIGKILL of {victim['replica']}: "
                  f"{out['takeover_s']:.1f}s (leaseDuration {timing.lease_duration:g}s, retry "
                  f"{timing.retry_period:g}s)")
        finally:
            for proc in procs.values():
                if proc.is_alive():
                    os.kill(proc.pid, signal.SIGKILL)
                proc.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=10000)
    ap.add_argument("--hypervisors", type=int, default=500)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="200 clusters, 20 hypervisors, 4 shards")
    ap.add_argument("--repeat", type=int, default=2, help="steady-state plans per replica (best shown)")
    ap.add_argument("--lease", type=int, default=15, help="leaseDurationSeconds (renew deadline 2/3, retry 2)")
    ap.add_argument("--commits", type=int, default=20, help="status commits per replica in the contention run")
    ap.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parent / ".cache")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--contention-only", action="store_true", help="only the status-branch contention run")
    args = ap.parse_args(argv)
    if args.quick:
        args.clusters, args.hypervisors, args.shards = 200, 20, 4
    timing = Timing(args.lease, max(2, args.lease * 2 // 3), 2 if args.lease >= 6 else 1)

    out: dict = {"clusters": args.clusters, "shards": args.shards, "replicas": args.replicas,
                 "lease": [timing.lease_duration, timing.renew_deadline, timing.retry_period]}
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with client threads
    with tempfile.TemporaryDirectory(prefix="gitops-shards-bench-") as tmpdir:
        tmp = Path(tmpdir)
        p = plan_scale.Params(args.clusters, args.hypervisors)
        repo = tmp / "repo"
        plan_scale.write_repo(repo, p)
        validation = validate_repo(repo)
        assert validation.model is not None
        entry, cached = plan_scale.ensure_cache(validation.model, p, args.cache_dir, False, args.workers)
        del validation
        print(f"{args.clusters} clusters / {args.hypervisors} hypervisors, {args.shards} shards, {args.replicas} "
              f"replicas; snapshot {'cached' if cached else 'generated'} in {entry}", flush=True)
        if not args.contention_only:
            measure_replicas(args, timing, repo, entry, out, ctx)
        out["status_branch"] = contention(args.clusters, args.replicas, args.shards, args.commits, tmp)
        sb = out["status_branch"]
        print(f"status branch, {args.replicas} writers x {args.commits} commits over {args.clusters} files: "
              f"{sb['commits_per_s']:.2f} commits/s, {sb['commit_latency_s']:.2f}s per commit, "
              f"{sb['rejected_per_commit']:.2f} rejected pushes per commit; {sb['gave_up']} publish(es) gave up "
              f"after {PUSH_ATTEMPTS} attempts; every pushed commit is on the branch")
    if args.json:
        print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
