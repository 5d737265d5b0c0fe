#!/usr/bin/env python3
"""The pull-request plan as a cold process (issue #31): `gitops plan CLONE --against-status REF`, timed
as whole processes beside the bare floor, on a real status branch of a large fleet.

Builds plan_scale.py's converged fleet (N clusters, 3 controlplane + 1 ingress node each), then a git
repo holding the repo on `main` and, at `origin/gitops/status`, the status tree a controller writes after
a converged reconcile: `state/public.json`, the per-cluster observed snapshot, `status/source.yaml` and
`observed/converged/<cluster>.json` (made by `gitops.status.commit.converged_files` from a full plan, as
the controller does). Then it times, each as a new process (best of --repeat):

* the bare floor: a Python process that loads every repo YAML file with CSafeLoader and checks each
  document with a Draft 2020-12 validator of its kind's schema (plan_scale.py's floor, plus the
  interpreter's start and imports, as every other figure here pays them);
* `gitops validate CLONE`;
* `gitops plan CLONE --against-status origin/gitops/status --detailed-exitcode`:
  - converged (main as applied): exit 0, every cluster left out;
  - one cluster changed on a branch (a new API endpoint host): exit 2, that cluster only planned;
  - a change touching every cluster (gitops.yaml's rollout health timeout, which every cluster's plan
    reads): exit 0, nothing left out: the full cold plan.

Peak RSS is each process's own (`wait4`). The certificates are issued at the start of the current month
so that the plan's real clock finds none due.

    .venv/bin/python benchmarks/pr_plan.py                      # 1000 clusters / 50 hypervisors
    .venv/bin/python benchmarks/pr_plan.py --clusters 10000 --hypervisors 500 --repeat 2
    .venv/bin/python benchmarks/pr_plan.py --quick --json       # 50 clusters; figures as JSON, last line
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
for path in (str(REPO_ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import plan_scale as ps  # noqa: E402

from gitops.engine import make_plan  # noqa: E402
from gitops.model.validate import validate_repo  # noqa: E402
from gitops.plan.converged import code_digest  # noqa: E402
from gitops.state.records import State  # noqa: E402
from gitops.state.sealing import split  # noqa: E402
from gitops.status.commit import converged_files  # noqa: E402
from gitops.status.reader import CONVERGED_DIR, PUBLIC, SOURCE  # noqa: E402
from gitops.status.snapshot import CLUSTERS_DIR, HYPERVISORS  # noqa: E402

GITOPS = str(Path(sys.executable).parent / "gitops")
REF = "origin/gitops/status"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}
FLOOR_CODE = """
import sys
from pathlib import Path
import yaml
from jsonschema import Draft202012Validator
from gitops.model.schemas import schema
n = 0
for path in sorted(Path(sys.argv[1]).rglob("*.yaml")):
    for doc in yaml.load_all(path.read_bytes(), Loader=yaml.CSafeLoader):
        if doc is not None:
            Draft202012Validator(schema(doc["kind"])).validate(doc)
            n += 1
print(n)
"""


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**GIT_ENV, **(env or {})}).stdout.strip()


def log(message: str) -> None:
    print(f"[pr_plan {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def converged_records(model, config, entry: Path, cache_dir: Path) -> Path:
    """observed/converged/ of the converged fleet, as a controller writes it after a full plan (cached by
    the fleet's cache entry and the gitops code: the records hold a digest of both)."""
    target = cache_dir / f"pr-{entry.name}-{code_digest()[:12]}"
    if (target / "done").is_file():
        return target
    log("recording the converged clusters (one full plan in this process)")
    state = State.from_dict(json.loads((entry / "state.json").read_text()))
    observed = ps.load_observed(entry)
    after = make_plan(model, config, state, observed, now=ps.NOW)
    assert after.plan.actions == () and after.settled, "the generated fleet is not converged"
    files = {rel.relative_to(entry).as_posix(): rel.read_bytes() for rel in (entry / CLUSTERS_DIR).iterdir()}
    records = converged_files(after, model, config, state, files)
    assert len(records) == len(model.clusters), f"{len(records)} of {len(model.clusters)} clusters recorded"
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".pr-"))
    for rel, data in records.items():
        (tmp / Path(rel).name).write_bytes(data)
    (tmp / "public.json").write_text(json.dumps(split(state)[0], sort_keys=True))
    (tmp / "done").write_text("")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def make_clone(base: Path, repo: Path, entry: Path, records: Path, target: str) -> Path:
    """A git repo: the fleet on main, a branch with one cluster changed, a branch with the settings
    changed, and the status tree at origin/gitops/status."""
    clone = base / "clone"
    shutil.copytree(repo, clone)
    git(clone, "init", "-q", "-b", "main")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "the fleet")
    applied = git(clone, "rev-parse", "HEAD")
    git(clone, "checkout", "-q", "-b", "one-change")
    cluster_yaml = clone / "clusters" / target / "cluster.yaml"
    host = f"      - api.{target}.example.com\n"
    cluster_yaml.write_text(cluster_yaml.read_text().replace(host, host + f"      - api2.{target}.example.com\n"))
    git(clone, "commit", "-q", "-am", f"{target}: a second API endpoint host")
    git(clone, "checkout", "-q", "-b", "all-changed", "main")
    config = clone / "gitops.yaml"
    config.write_text(config.read_text() + "  rollout:\n    healthTimeoutSeconds: 90\n")
    git(clone, "commit", "-q", "-am", "every cluster: a longer health timeout")
    git(clone, "checkout", "-q", "main")

    status = base / "status"
    (status / "state").mkdir(parents=True)
    shutil.copy(records / "public.json", status / PUBLIC)
    shutil.copytree(entry / CLUSTERS_DIR, status / CLUSTERS_DIR)
    shutil.copy(entry / HYPERVISORS, status / HYPERVISORS)
    shutil.copytree(records, status / CONVERGED_DIR, ignore=shutil.ignore_patterns("public.json", "done"))
    (status / SOURCE).parent.mkdir(parents=True)
    (status / SOURCE).write_text(f"status:\n  result: Applied\n  lastSeenSHA: {applied}\n  appliedSHA: {applied}\n")
    index = {"GIT_INDEX_FILE": str(base / "status-index"), "GIT_WORK_TREE": str(status),
             "GIT_DIR": str(clone / ".git")}
    subprocess.run(["git", "add", "-A", "."], cwd=status, check=True, env={**GIT_ENV, **index})
    tree = subprocess.run(["git", "write-tree"], cwd=status, check=True, capture_output=True, text=True,
                          env={**GIT_ENV, **index}).stdout.strip()
    # signed as the controller signs it (issue #42): the plan verifies it against --status-signers
    key = base / "status-signing-key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    commit = git(clone, "-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit-tree", "-S", tree, "-m",
                 "applied")
    git(clone, "update-ref", f"refs/remotes/{REF}", commit)
    return clone


def best(label: str, cmd: list[str], repeat: int, check) -> tuple[float, int, list[float]]:
    runs, peak = [], 0
    for _ in range(repeat):
        secs, rss, code, out = run_one(cmd)
        check(code, out)
        runs.append(secs)
        peak = max(peak, rss)
    log(f"{label}: best {min(runs):.2f} s of {', '.join(f'{r:.2f}' for r in runs)}; peak RSS {peak / 2**20:.0f} MiB")
    return min(runs), peak, runs


#: runs argv[1:] and prints its peak RSS in KiB last: wait4 reports a child's peak as at least the size of
#: the process that forked it, so the fork comes from this small interpreter, not from the benchmark
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stdout.flush()
print(f"\\nmaxrss-kib {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_one(cmd: list[str]) -> tuple[float, int, int, str]:
    """(seconds, peak RSS bytes, exit code, output) of one new process."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *cmd], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    secs = time.perf_counter() - t
    out, _, rss = done.stdout.decode(errors="replace").rpartition("\nmaxrss-kib ")
    return secs, int(rss) * 1024, done.returncode, out


def expect(code: int, left_out: int | None):
    def check(got: int, out: str) -> None:
        assert got == code, f"exit {got}, expected {code}:\n{out[-3000:]}"
        line = f"{left_out} cluster(s) not planned again"
        if left_out:
            assert line in out, f"expected {line!r}:\n{out[:3000]}"
        else:
            assert "not planned again" not in out, out[:3000]
    return check


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--hypervisors", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="50 clusters over 10 hypervisors")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each process; the best is shown")
    ap.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    ap.add_argument("--rebuild", action="store_true", help="regenerate the cached fleet")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", action="store_true", help="end with the figures as one JSON object")
    args = ap.parse_args(argv)
    if args.quick:
        args.clusters, args.hypervisors = 50, 10
    today = dt.datetime.now(dt.timezone.utc)
    ps.NOW = dt.datetime(today.year, today.month, 1, tzinfo=dt.timezone.utc)  # certificates valid today
    p = ps.Params(args.clusters, args.hypervisors)
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gitops-pr-plan-") as tmp:
        base = Path(tmp)
        repo = base / "repo"
        ps.write_repo(repo, p)
        validation = validate_repo(repo)
        assert validation.model is not None, validation.diagnostics[:5]
        model, config = validation.model, validation.repo.config
        log(f"{p.clusters} clusters / {len(model.nodes)} nodes / {p.hypervisors} hypervisors: the converged fleet")
        entry, cached = ps.ensure_cache(model, p, args.cache_dir, args.rebuild, args.workers)
        records = converged_records(model, config, entry, args.cache_dir)
        target = sorted(model.clusters)[len(model.clusters) // 2]
        del validation, model
        clone = make_clone(base, repo, entry, records, target)
        log(f"status branch written ({sum(1 for _ in (entry / CLUSTERS_DIR).iterdir())} cluster snapshots); timing")
        plan = [GITOPS, "plan", str(clone), "--against-status", REF, "--detailed-exitcode", "--status-signers",
                str(base / "status-signing-key.pub")]
        figures: dict[str, tuple[float, int, list[float]]] = {}
        figures["floor"] = best("bare floor (process)", [sys.executable, "-c", FLOOR_CODE, str(clone)], args.repeat,
                                lambda code, out: None if code == 0 else sys.exit(out))
        figures["validate"] = best("gitops validate", [GITOPS, "validate", str(clone)], args.repeat,
                                   lambda code, out: None if code == 0 else sys.exit(out))
        figures["converged"] = best("cold plan, converged", plan, args.repeat, expect(0, p.clusters))
        git(clone, "checkout", "-q", "one-change")
        figures["one"] = best(f"cold plan, {target} changed", plan, args.repeat, expect(2, p.clusters - 1))
        git(clone, "checkout", "-q", "all-changed")
        figures["all"] = best("cold plan, every cluster changed", plan, args.repeat, expect(0, 0))
        git(clone, "checkout", "-q", "main")

    floor = figures["floor"][0]
    rows = [("bare floor, a process (CSafeLoader + Draft202012Validator)", "floor"),
            ("gitops validate", "validate"),
            ("gitops plan --against-status, converged", "converged"),
            (f"gitops plan --against-status, one cluster changed ({target})", "one"),
            ("gitops plan --against-status, every cluster changed", "all")]
    width = max(len(label) for label, _ in rows) + 2
    print(f"\ngitops cold pull-request plan  (python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
          f"{p.clusters} clusters, {p.hypervisors} hypervisors, fleet cache {'used' if cached else 'built now'})")
    print("-" * (width + 60))
    for label, key in rows:
        secs, rss, runs = figures[key]
        print(f"{label:<{width}}{secs:7.2f} s  {secs / floor:5.2f}x floor  peak RSS {rss / 2**20:5.0f} MiB"
              f"   (runs: {', '.join(f'{r:.2f}' for r in runs)})")
    print(f"total wall time {time.perf_counter() - wall:.0f} s")
    if args.json:
        plans = [figures[k] for k in ("converged", "one", "all")]
        print(json.dumps({
            "clusters": p.clusters, "hypervisors": p.hypervisors,
            "floor_s": round(floor, 3), "validate_s": round(figures["validate"][0], 3),
            "cold_converged_s": round(figures["converged"][0], 3), "cold_one_change_s": round(figures["one"][0], 3),
            "cold_all_changed_s": round(figures["all"][0], 3),
            "validate_over_floor": round(figures["validate"][0] / floor, 2),
            "cold_converged_over_floor": round(figures["converged"][0] / floor, 2),
            "cold_one_change_over_floor": round(figures["one"][0] / floor, 2),
            "rss_mib": round(max(f[1] for f in plans) / 2**20, 1),
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
