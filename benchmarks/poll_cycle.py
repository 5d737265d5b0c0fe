"""Cost of the controller's quiet work: a no-change poll cycle, and one status commit.

Runs against a real lab (3 containerd hypervisors, needs root) with the example
repo in a real bare git repo: the first reconcile applies it, then each measured
poll fetches while it lists pods and containers on every hypervisor (CRI reads; node
files are not read again while the containers are unchanged) and reads each cluster's
nodes and certificate requests (over the clients kept from the last poll; gitops's own
objects are listed again only after `spec.drift.clusterObjectsIntervalSeconds`), finds
the commit and the live state unchanged and stops: no validation, compile or plan,
nothing written, nothing committed (checked). The drift-check polls are the same with
every pod's node files read again (one ExecSync per pod) and every cluster's objects
listed again, as when the drift intervals have passed. The status commit figure is
`StatusBranch.publish` of the full status tree with one file changed: write,
`git add`, commit, push.

    python benchmarks/poll_cycle.py [--polls 10]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gitops.controller import Controller, ControllerConfig
from gitops.engine import cluster_targets
from gitops.observe.hypervisors import observe
from gitops.lab.example import write_example_repo
from gitops.status.branch import StatusBranch
from gitops.status.poll import live_fingerprint
from gitops.status.reader import MANAGED

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from conftest import running_lab  # noqa: E402  (tests/conftest.py: test and benchmark tooling)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@x", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def figures(samples: list[float]) -> str:
    return (f"mean {statistics.mean(samples) * 1000:7.0f} ms   min {min(samples) * 1000:7.0f} ms   "
            f"max {max(samples) * 1000:7.0f} ms   (n={len(samples)})")


def breakdown(controller: Controller, polls: int) -> dict[str, list[float]]:
    """The parts of a quiet poll, each timed on its own: fetch, CRI listing (node files reused), each
    cluster's API, the fingerprint."""
    quiet = controller._quiet
    assert quiet is not None, "the controller is not quiet after a converged reconcile"
    model = quiet.target.model
    state = controller.store.load()
    parts: dict[str, list[float]] = {"fetch (git fetch of the followed branch)": [],
                                     "observe hypervisors (CRI lists, files reused)": [],
                                     "observe cluster APIs (kept clients, parallel)": [],
                                     "live fingerprint": []}
    labels = list(parts)
    for _ in range(polls):
        t0 = time.monotonic()
        controller.source.fetch()
        t1 = time.monotonic()
        observed = observe(model.hypervisors.values(), reuse=controller.files.reuse)
        t2 = time.monotonic()
        clusters = controller.clusters.observe(cluster_targets(model, state, observed))
        t3 = time.monotonic()
        live_fingerprint(dataclasses.replace(observed, clusters=clusters), controller.files.files_digest)
        t4 = time.monotonic()
        for label, took in zip(labels, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[label].append(took)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=10)
    args = parser.parse_args()
    with running_lab("gitops-bench-poll-", hypervisors=3, public=1, subnet="127.0.26") as (base, lab):
        work = base / "work"
        write_example_repo(lab, work, ingress_nodes=1)
        origin = base / "origin.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
        git("init", "-q", "-b", "main", cwd=work)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", "example", cwd=work)
        git("push", "-q", str(origin), "HEAD:main", cwd=work)
        identity = subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout
        controller = Controller(ControllerConfig(repo=str(origin), workdir=base / "controller", identity=identity))
        started = time.monotonic()
        first = controller.reconcile_once()
        print(f"first reconcile (apply 8 pods, 34 containers)   {time.monotonic() - started:6.2f} s   "
              f"{first.result}, {first.actions} actions")
        head = git("rev-parse", "gitops/status", cwd=origin)
        polls = []
        for _ in range(args.polls):
            started = time.monotonic()
            outcome = controller.reconcile_once()
            polls.append(time.monotonic() - started)
            assert outcome.actions == 0, "a quiet poll must not act"
        assert git("rev-parse", "gitops/status", cwd=origin) == head, "a quiet poll must not commit"
        print(f"no-change poll cycle                             {figures(polls)}")
        for label, samples in breakdown(controller, args.polls).items():
            print(f"  {label:<47}{figures(samples)}")
        controller.files.interval = 0  # every pod's node files are read again on each poll
        controller.clusters.objects_interval = 0  # and every cluster's objects listed again
        drift = []
        for _ in range(args.polls):
            started = time.monotonic()
            outcome = controller.reconcile_once()
            drift.append(time.monotonic() - started)
            assert outcome.actions == 0, "a drift check that finds nothing must not act"
        assert git("rev-parse", "gitops/status", cwd=origin) == head, "a drift check must not commit"
        print(f"no-change poll with a drift check of node files  {figures(drift)}")
        branch = StatusBranch(str(origin), base / "bench-writer")
        branch.sync()
        tree = {p.relative_to(branch.dir).as_posix(): p.read_bytes() for p in branch.dir.rglob("*")
                if p.is_file() and ".git" not in p.parts}
        commits = []
        for i in range(args.polls):
            changed = dict(tree)
            changed["status/benchmark.yaml"] = f"run: {i}\n".encode()
            started = time.monotonic()
            sha = branch.publish(lambda b: b.write_tree(changed, MANAGED),
                                 f"benchmark {i}")
            commits.append(time.monotonic() - started)
            assert sha is not None
        size = sum(len(v) for v in tree.values())
        print(f"one status commit ({len(tree)} files, {size / 1024:.0f} KiB)          {figures(commits)}")


if __name__ == "__main__":
    main()
