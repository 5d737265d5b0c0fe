#!/usr/bin/env python3
"""Plan at scale (issue #3): validate, load the observed snapshot and plan for a large fleet.

Generates a repo of N clusters (3 controlplane + 1 ingress node each) over M
hypervisors (one in five public) in a temporary directory, validates it, and
builds the recorded state and the observed state of a fully converged system:
every pod running with matching spec hashes, every file present with the right
digest, every leaf certificate issued by its cluster's authority with the
desired subject and SANs. That state and snapshot are expensive to produce the
first time (thousands of CAs, ~24 leaf certificates per cluster), so they are
cached as JSON under a directory keyed by the generator's parameters (and a
digest of the gitops code that determines spec hashes).

Then it measures, in this process only (the generator runs in a forked child
so that its memory does not count):

* a bare floor: PyYAML's CSafeLoader over every repo file and, per document,
  one jsonschema Draft 2020-12 validator of its kind's schema; the least any
  planner must spend to read and check this repo (make_plan is compared to it);
* validate_repo on the generated repo;
* loading the recorded state and the observed snapshot from JSON;
* make_plan against the converged observed state (asserts an empty plan): the
  first plan of the process (nothing compiled or certificate verified yet),
  then the steady state of a controller planning again and again;
* make_plan with one cluster changed since the last plan (each run gives that
  cluster's etcd a new image; asserts that only that cluster is touched);
* peak memory: tracemalloc peak over snapshot load + make_plan, and ru_maxrss.

Run from the repo root:

    .venv/bin/python benchmarks/plan_scale.py            # 1000 clusters / 50 hypervisors
    .venv/bin/python benchmarks/plan_scale.py --quick    # 50 clusters, a fast sanity run
    .venv/bin/python benchmarks/plan_scale.py --json     # the table, then the figures as JSON on the last line
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime as dt
import gc
import hashlib
import io
import json
import multiprocessing
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import yaml  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402

from gitops.compile import compile_desired  # noqa: E402
from gitops.compile.desired import SPEC_ANNOTATION, SPEC_HASH, DesiredState  # noqa: E402
from gitops.engine import make_plan  # noqa: E402
from gitops.model.config import Rollout, Wave  # noqa: E402
from gitops.model.resources import RepoModel  # noqa: E402
from gitops.model.schemas import schema  # noqa: E402
from gitops.model.validate import validate_repo  # noqa: E402
from gitops.observe.types import (  # noqa: E402
    ObservedCluster,
    ObservedContainer,
    ObservedHypervisor,
    ObservedPod,
    ObservedState,
)
from gitops.pki import CertKey, cert_to_pem, generate_key, sign_public_key  # noqa: E402
from gitops.plan.actions import Kind  # noqa: E402
from gitops.pods import NodeFiles  # noqa: E402
from gitops.state.records import State  # noqa: E402
from gitops.status.branch import StatusBranch  # noqa: E402
from gitops.status.reader import MANAGED, StatusReader  # noqa: E402
from gitops.status.report import Outcome, Result, resource_documents  # noqa: E402
from gitops.status.snapshot import HYPERVISORS, cluster_file, cluster_path, snapshot_files  # noqa: E402

#: bump when the generated repo, state or snapshot change shape
GENERATOR_VERSION = 3  # 3: the snapshot holds each cluster's API observation
#: fixed clock: certificates in the cached snapshot stay valid for the plan's `now`
NOW = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
#: gitops sources whose changes alter spec hashes, file digests or the JSON forms
HASHED_SOURCES = ("gitops/compile", "gitops/observe", "gitops/state", "gitops/pki", "gitops/cri/types.py",
                  "gitops/pods.py", "gitops/model/components.py")
CONTROLPLANE_PER_CLUSTER = 3
PORTS = {"controlplane": 5, "controlplane-ingress": 1}
PORT_BASE = 20000
CHANGED_IMAGE = "registry.example.com/etcd:3.5.17-{}"  # one new tag per run


# --------------------------------------------------------------------------- the repo


@dataclasses.dataclass(frozen=True)
class Params:
    clusters: int
    hypervisors: int

    @property
    def public(self) -> int:
        return max(1, self.hypervisors // 5)

    @property
    def private(self) -> int:
        return self.hypervisors - self.public

    def port_width(self) -> int:
        """Ports per hypervisor: twice what the busiest one needs, at least 1000."""
        cp = -(-self.clusters * CONTROLPLANE_PER_CLUSTER // self.private) * PORTS["controlplane"]
        ingress = -(-self.clusters // self.public) * PORTS["controlplane-ingress"]
        return max(1000, 2 * max(cp, ingress))


def hypervisor_names(p: Params) -> tuple[list[str], list[str]]:
    return ([f"hv-private-{i:03d}" for i in range(1, p.private + 1)],
            [f"hv-public-{i:03d}" for i in range(1, p.public + 1)])


def write_repo(root: Path, p: Params) -> None:
    if p.private < 1:
        raise SystemExit("need at least 2 hypervisors (one private, one public)")
    width = p.port_width()
    if PORT_BASE + width - 1 > 65535:
        raise SystemExit(f"{p.clusters} clusters need {width} ports per hypervisor: too many for one IP range")
    (root / "hypervisors").mkdir(parents=True)
    (root / "clusters").mkdir()
    (root / "gitops.yaml").write_text(
        "apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n"
        "  paths: [hypervisors, clusters]\n  prune:\n    enabled: true\n    maxDeletes: 10\n"
        "  certificates:\n    renewBeforeDays: 30\n")
    private, public = hypervisor_names(p)
    for i, name in enumerate(private + public):
        ip = f"127.0.{20 + i // 250}.{i % 250 + 1}"
        (root / "hypervisors" / f"{name}.yaml").write_text(
            "apiVersion: gitops.infra/v1alpha1\nkind: Hypervisor\nmetadata:\n"
            f"  name: {name}\n  labels:\n    topology.gitops.infra/zone: zone-{i % 3}\nspec:\n"
            f"  public: {'true' if name in public else 'false'}\n  ipAddress: {ip}\n"
            f"  portRange:\n    low: {PORT_BASE}\n    high: {PORT_BASE + width - 1}\n"
            f"  localCRIEndpoint:\n    criEndpointPath: /run/gitops-bench/{name}/containerd.sock\n")
    for c in range(1, p.clusters + 1):
        name = f"c{c:05d}"
        d = root / "clusters" / name
        d.mkdir()
        (d / "cluster.yaml").write_text(
            "apiVersion: gitops.infra/v1alpha1\nkind: Cluster\nmetadata:\n"
            f"  name: {name}\n  labels:\n    owner: team-{c % 37}\nspec:\n"
            '  kubernetesVersion: "1.37.2"\n'
            f"  apiServer:\n    endpointHosts:\n      - api.{name}.example.com\n"
            "  serviceCIDR: 10.96.0.0/12\n  podCIDR: 10.244.0.0/16\n"
            "  certificates:\n    validityDays: 365\n    renewBeforeDays: 30\n")
        nodes = []
        for n in range(1, CONTROLPLANE_PER_CLUSTER + 1):
            nodes.append(f"apiVersion: gitops.infra/v1alpha1\nkind: Node\nmetadata:\n  name: {name}-cp-{n}\n"
                         f"spec:\n  cluster: {name}\n  role: controlplane\n")
        nodes.append(f"apiVersion: gitops.infra/v1alpha1\nkind: Node\nmetadata:\n  name: {name}-ingress\n"
                     f"spec:\n  cluster: {name}\n  role: controlplane-ingress\n")
        (d / "nodes.yaml").write_text("---\n" + "---\n".join(nodes))


# --------------------------------------------------------------------------- converged state


def cache_key(p: Params) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"clusters": p.clusters, "hypervisors": p.hypervisors, "version": GENERATOR_VERSION,
                         "now": NOW.isoformat()}, sort_keys=True).encode())
    for rel in HASHED_SOURCES:
        path = REPO_ROOT / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.relative_to(REPO_ROOT).as_posix().encode())
            h.update(f.read_bytes())
    return f"c{p.clusters}-h{p.hypervisors}-{h.hexdigest()[:12]}"


def settled_state(model: RepoModel) -> tuple[State, DesiredState]:
    """What the recorded state holds once apply bootstrapped every cluster (as tests' settle())."""
    first = compile_desired(model, State(), now=NOW)
    state = first.state
    for name, cluster in first.desired.clusters.items():
        state.clusters[name].etcd_members = [m.node for m in cluster.etcd_members]
        for m in cluster.etcd_members:  # each node's own service-account key (public half)
            state.clusters[name].service_account_keys[m.node] = public_pem(generate_key())
    compiled = compile_desired(model, state, now=NOW)
    return compiled.state, compiled.desired


def public_pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _sign_chunk(job):
    """Issue the leaf certificates of some pods; runs in a worker process.

    Cheap but valid: each cluster's authorities are parsed once (not per certificate),
    and one fresh P-256 key per certificate costs ~10 us. Each certificate carries
    exactly the subject, organisations and SANs the desired spec asks for.
    """
    authorities, pods = job
    cas: dict[tuple[str, str], CertKey] = {}
    out = {}
    for node, cluster, specs in pods:
        certs = {}
        for spec in specs:
            ca = cas.get((cluster, spec["signer"]))
            if ca is None:
                cert_pem, key_pem = authorities[cluster][spec["signer"]]
                ca = cas[(cluster, spec["signer"])] = CertKey.from_pem(cert_pem, key_pem)
            cert = sign_public_key(ca, generate_key().public_key(), spec["common_name"],
                                   organizations=spec["organizations"], dns_names=spec["dns_names"],
                                   ip_addresses=spec["ip_addresses"], server=spec["server"],
                                   client=spec["client"], days=365, now=NOW)
            certs[spec["name"]] = cert_to_pem(cert)
        out[node] = certs
    return out


def issue_certificates(desired: DesiredState, state: State, workers: int) -> dict[str, dict[str, str]]:
    pods = [(p.node, p.cluster, [dataclasses.asdict(c) for c in p.certificates])
            for p in desired.pods.values() if p.certificates]
    size = max(1, -(-len(pods) // (workers * 8)))
    jobs = []
    for i in range(0, len(pods), size):
        chunk = pods[i:i + size]
        clusters = {c for _, c, _ in chunk}
        auth = {c: {r: (a.cert_pem, a.key_pem) for r, a in state.clusters[c].authorities.items()} for c in clusters}
        jobs.append((auth, chunk))
    out: dict[str, dict[str, str]] = {}
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for part in pool.imap_unordered(_sign_chunk, jobs):
                out.update(part)
    else:
        for job in jobs:
            out.update(_sign_chunk(job))
    return out


def _hexid(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def converged(desired: DesiredState, state: State, model: RepoModel, certs: dict[str, dict[str, str]]
              ) -> ObservedState:
    """What observe() reports once every desired pod runs with all its files (as tests' converged())."""
    pods: dict[str, list[ObservedPod]] = {n: [] for n in model.hypervisors}
    base = int(NOW.timestamp() * 1e9)
    for i, pod in enumerate(desired.pods.values()):
        mine = certs.get(pod.node, {})
        sa = state.clusters[pod.cluster].service_account_keys.get(pod.node)
        files = NodeFiles(digests={f.name: f.digest for f in pod.files}, certificates=dict(sorted(mine.items())),
                          keys=tuple(sorted([*mine, *(k.name for k in pod.keys)])),
                          public_keys={"sa": sa} if pod.keys and sa else {})
        created = base + i * 1_000_000
        containers = tuple(sorted(
            (ObservedContainer(_hexid(pod.node, c.spec.name), c.spec.name, "running", c.spec_hash, created + j + 1,
                               json.loads(c.spec.annotations[SPEC_ANNOTATION]))
             for j, c in enumerate(pod.containers)),
            key=lambda c: (c.component, c.created_at, c.id)))
        pods[pod.hypervisor].append(ObservedPod(_hexid(pod.node), pod.node, pod.cluster, pod.role, pod.hypervisor,
                                                True, pod.sandbox.labels[SPEC_HASH], created, containers, files))
    # each cluster's own API holds gitops's bootstrap objects (RBAC, cluster-info), no worker yet
    apis = {name: ObservedCluster(name, True, objects={o.key: o.spec_hash for o in cluster.objects})
            for name, cluster in desired.clusters.items()}
    return ObservedState({n: ObservedHypervisor(n, True, "", tuple(sorted(p, key=lambda p: (p.node, p.created_at))))
                          for n, p in sorted(pods.items())}, clusters=apis)


def write_snapshot(root: Path, files: dict[str, bytes]) -> None:
    """The snapshot's files (`snapshot_files`) under `root`, as the status branch stores them."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def generate(model: RepoModel, target: Path, workers: int) -> None:
    """Build state.json, observed/ (the status branch's per-cluster snapshot) and meta.json into `target`."""
    timings = {}
    t = time.perf_counter()
    state, desired = settled_state(model)
    timings["compile (placement, CAs, admin certs)"] = time.perf_counter() - t
    t = time.perf_counter()
    certs = issue_certificates(desired, state, workers)
    timings[f"leaf certificates ({sum(map(len, certs.values()))}, {workers} workers)"] = time.perf_counter() - t
    t = time.perf_counter()
    observed = converged(desired, state, model, certs)
    (target / "state.json").write_text(json.dumps(state.to_dict(), indent=2) + "\n")
    write_snapshot(target, snapshot_files(observed))
    timings["build + write JSON"] = time.perf_counter() - t
    (target / "meta.json").write_text(json.dumps({"timings": timings}, indent=2) + "\n")


def _generate_child(model: RepoModel, target: str, workers: int) -> None:
    try:
        generate(model, Path(target), workers)
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(1)


def ensure_cache(model: RepoModel, p: Params, cache_dir: Path, rebuild: bool, workers: int) -> tuple[Path, bool]:
    """The cache entry for `p`, built (in a forked child) when missing. Returns (dir, was cached)."""
    entry = cache_dir / cache_key(p)
    if entry.is_dir() and not rebuild and all((entry / f).is_file() for f in ("state.json", HYPERVISORS,
                                                                              "meta.json")):
        return entry, True
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".build-"))
    try:
        child = multiprocessing.get_context("fork").Process(target=_generate_child, args=(model, str(tmp), workers))
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"generating the converged state failed (exit {child.exitcode})")
        if entry.exists():
            shutil.rmtree(entry)
        tmp.rename(entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return entry, False


# --------------------------------------------------------------------------- measuring


def maxrss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextmanager
def timed(results: dict, label: str):
    """Record (seconds, ru_maxrss after) of the block under `label`."""
    gc.collect()
    t = time.perf_counter()
    yield
    results[label] = (time.perf_counter() - t, maxrss())


def repeated(results: dict, label: str, times: int, fn):
    """Run `fn(run)` `times` times; record the best time (and all of them); return the last result."""
    runs = []
    out = None
    for run in range(times):
        out = None  # let the previous result go before the next run
        gc.collect()
        t = time.perf_counter()
        out = fn(run)
        runs.append(time.perf_counter() - t)
    results[label] = (min(runs), maxrss())
    if times > 1:
        results[label] += (runs,)
    return out


def bare_floor(root: Path) -> int:
    """Load every YAML file of the repo with CSafeLoader and check each document with a
    Draft 2020-12 validator of its kind's schema: the floor under validating and planning.
    Returns the number of documents (every one must be valid)."""
    documents = 0
    for path in sorted(root.rglob("*.yaml")):
        for doc in yaml.load_all(path.read_bytes(), Loader=yaml.CSafeLoader):
            if doc is None:
                continue
            Draft202012Validator(schema(doc["kind"])).validate(doc)
            documents += 1
    return documents


def changed_model(model: RepoModel, cluster: str, image: str) -> RepoModel:
    c = model.clusters[cluster]
    changed = dataclasses.replace(c, image_overrides={**c.image_overrides, "etcd": image})
    return dataclasses.replace(model, clusters={**model.clusters, cluster: changed})


def check_changed_plan(plan, cluster: str, image: str) -> None:
    others = sorted({a.cluster for a in plan.actions} - {cluster})
    assert not others, f"plan touches other clusters: {others[:5]}"
    etcd = [(a.kind, a.node, a.component) for a in plan.actions]
    # each member replaced with its node's API server (which talks to it only) stopped before, started after
    want = [step for n in range(1, CONTROLPLANE_PER_CLUSTER + 1) for step in (
        (Kind.REMOVE_CONTAINER, f"{cluster}-cp-{n}", "kube-apiserver"), (Kind.RECREATE_CONTAINER, f"{cluster}-cp-{n}", "etcd"),
        (Kind.CREATE_CONTAINER, f"{cluster}-cp-{n}", "kube-apiserver"))]
    assert etcd == want, f"unexpected plan for {cluster}: {etcd}"
    rolls = [a for a in plan.actions if a.kind == Kind.RECREATE_CONTAINER]
    assert all(any(image in d for d in a.details) for a in rolls), [a.details for a in rolls]


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fmt_mib(n: float) -> str:
    mib = n / 2**20
    return f"{mib:.1f} MiB" if mib < 10 else f"{mib:.0f} MiB"


def load_observed(entry: Path) -> ObservedState:
    """The snapshot as `gitops plan --against-status` reads it, one cluster file at a time."""
    return StatusReader.in_dir(entry).observed()


def restarted(observed: ObservedState, cluster: str, run: int) -> list[ObservedPod]:
    """`cluster`'s pods with the containers of its first pod restarted (new ids): one cluster changed."""
    pods = sorted((p for p in observed.pods() if p.cluster == cluster), key=lambda p: p.node)
    first = pods[0]
    containers = tuple(dataclasses.replace(c, id=_hexid(c.id, str(run)), created_at=c.created_at + run + 1)
                       for c in first.containers)
    return [dataclasses.replace(first, containers=containers), *pods[1:]]


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def status_commits(files: dict[str, bytes], observed: ObservedState, cluster: str, runs: int
                   ) -> tuple[list[float], list[int]]:
    """Publish `files` (the whole status tree) to a bare repo, then `runs` status commits in which one
    cluster's observed file changed. Returns each commit's seconds (StatusBranch.publish: fetch, reset,
    write, add, commit, push) and the bytes it added to the bare repo's objects."""
    seconds, added = [], []
    with tempfile.TemporaryDirectory(prefix="gitops-status-bench-", ignore_cleanup_errors=True) as tmp:
        origin, seed = Path(tmp) / "origin.git", Path(tmp) / "seed"
        run = lambda *a, cwd=None: subprocess.run(a, cwd=cwd, check=True, capture_output=True)  # noqa: E731
        run("git", "init", "-q", "--bare", "-b", "main", str(origin))
        for key in ("gc.auto", "receive.autogc"):  # no background gc: the bytes each push adds, as stored
            run("git", "config", key, "0", cwd=origin)
        run("git", "clone", "-q", str(origin), str(seed))
        run("git", "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "--allow-empty", "-m", "init",
            cwd=seed)
        run("git", "push", "-q", "origin", "HEAD:main", cwd=seed)
        branch = StatusBranch(str(origin), Path(tmp) / "controller")
        branch.repo.configure({"gc.auto": "0"})
        tree = dict(files)
        branch.publish(lambda b: b.write_tree(tree, MANAGED), "the whole status tree")
        for i in range(runs):
            tree = {**tree, cluster_path(cluster): cluster_file(cluster, restarted(observed, cluster, i))}
            before = tree_bytes(origin / "objects")
            gc.collect()
            t = time.perf_counter()
            sha = branch.publish(lambda b: b.write_tree(tree, MANAGED), f"{cluster} restarted ({i})")
            seconds.append(time.perf_counter() - t)
            added.append(tree_bytes(origin / "objects") - before)
            assert sha is not None
    return seconds, added


def traced_pass(root: Path, state_path: Path, entry: Path) -> dict[str, int]:
    """Redo validate / load / plan under tracemalloc: what each input holds, and make_plan's peak."""
    out = {}
    gc.collect()
    tracemalloc.start()
    try:
        validation = validate_repo(root)
        model, config = validation.model, validation.repo.config
        del validation
        gc.collect()
        out["model"] = tracemalloc.get_traced_memory()[0]
        state = State.from_dict(json.loads(state_path.read_text()))
        gc.collect()
        out["state"] = tracemalloc.get_traced_memory()[0] - out["model"]
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        observed = load_observed(entry)
        out["observed load peak"] = tracemalloc.get_traced_memory()[1] - base
        gc.collect()
        out["observed"] = tracemalloc.get_traced_memory()[0] - base
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        planned = make_plan(model, config, state, observed, now=NOW)
        out["plan peak"] = tracemalloc.get_traced_memory()[1]
        out["plan above inputs"] = out["plan peak"] - base
        del planned
    finally:
        tracemalloc.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--hypervisors", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="50 clusters over 10 hypervisors: a fast sanity run")
    ap.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parent / ".cache",
                    help="where generated state/observed JSON is kept (default: benchmarks/.cache)")
    ap.add_argument("--rebuild", action="store_true", help="regenerate the cached state and snapshot")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes signing certificates")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each make_plan; the best is shown (default 3)")
    ap.add_argument("--profile", action="store_true", help="cProfile a converged and a one-change make_plan and print hot spots")
    ap.add_argument("--no-tracemalloc", action="store_true", help="skip the (slower) traced pass")
    ap.add_argument("--json", action="store_true",
                    help="end with the figures as one JSON object on the last line")
    args = ap.parse_args(argv)
    if args.quick:
        args.clusters, args.hypervisors = 50, 10
    p = Params(args.clusters, args.hypervisors)
    if p.clusters < 1 or p.hypervisors < 2 or args.repeat < 1:
        ap.error("need at least 1 cluster, 2 hypervisors and 1 repeat")

    wall = time.perf_counter()
    t: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="gitops-bench-") as tmp:
        root = Path(tmp) / "repo"
        with timed(t, "generate repo YAML"):
            write_repo(root, p)
        n_files = sum(1 for _ in root.rglob("*.yaml"))
        n_docs = repeated(t, FLOOR, args.repeat, lambda _: bare_floor(root))
        validation = repeated(t, "validate_repo", args.repeat, lambda _: validate_repo(root))
        if validation.model is None:
            for d in validation.diagnostics[:20]:
                print(d, file=sys.stderr)
            raise SystemExit("generated repo does not validate")
        model, config = validation.model, validation.repo.config
        del validation

        with timed(t, "state + snapshot (generate, or read cache)"):
            entry, cached = ensure_cache(model, p, args.cache_dir, args.rebuild, args.workers)

        state_path = entry / "state.json"
        with timed(t, "load state JSON (State.from_dict)"):
            state = State.from_dict(json.loads(state_path.read_text()))
        with timed(t, LOAD):
            observed = load_observed(entry)

        with timed(t, COLD):  # nothing compiled or verified yet in this process
            make_plan(model, config, state, observed, now=NOW)
        planned = repeated(t, CONVERGED, args.repeat, lambda _: make_plan(model, config, state, observed, now=NOW))
        plan = planned.plan
        assert plan.actions == (), f"converged system planned {len(plan.actions)} actions, e.g. " \
            f"{plan.actions[:3]}" + (" (cached snapshot: try --rebuild)" if cached else "")
        assert plan.warnings == (), plan.warnings[:3]
        assert plan.complete, plan.unknowns[:3]
        desired = planned.compiled.desired
        del planned, plan

        target = sorted(model.clusters)[len(model.clusters) // 2]
        # each run changes the etcd image of `target` again: one cluster changed since the last plan
        others = [changed_model(model, target, CHANGED_IMAGE.format(run)) for run in range(args.repeat)]
        planned = repeated(t, ONE_CHANGE, args.repeat, lambda run: make_plan(others[run], config, state, observed,
                                                                             now=NOW))
        check_changed_plan(planned.plan, target, CHANGED_IMAGE.format(args.repeat - 1))
        n_changed = len(planned.plan.actions)
        del planned

        # the same plans with the fleet in two waves (issue #46): a canary wave by label, then the rest
        waved = dataclasses.replace(config, rollout=Rollout(
            (Wave("canary", {"matchLabels": {"owner": "team-1"}}), Wave("rest")), 0.999))
        planned = repeated(t, CONVERGED_WAVES, args.repeat, lambda _: make_plan(model, waved, state, observed, now=NOW))
        assert planned.plan.actions == (), planned.plan.actions[:3]
        # (other images than above: nothing of these plans is cached yet, as for the plain one-change plans)
        others = [changed_model(model, target, CHANGED_IMAGE.format(args.repeat + run)) for run in range(args.repeat)]
        planned = repeated(t, ONE_CHANGE_WAVES, args.repeat, lambda run: make_plan(others[run], waved, state, observed,
                                                                                   now=NOW))
        gates = [a for a in planned.plan.actions if a.kind in (Kind.START_WAVE, Kind.SOAK_WAVE)]
        assert {a.cluster for a in planned.plan.actions if a not in gates} == {target}, planned.plan.actions[:3]
        assert gates, "the changed cluster's wave is started and soaked"
        del planned, others, waved

        # the status tree a report writes: every resource's status document and the snapshot
        with timed(t, DOCUMENTS):
            outcome = Outcome(sha="0" * 40, result=Result.APPLIED, applied_sha="0" * 40)
            placements = {n: (r.hypervisor, dict(r.ports)) for n, r in state.nodes.items()}
            docs = resource_documents(model, desired, observed, outcome, lambda rel: None, NOW, placements)
        del desired
        with timed(t, SNAPSHOT):
            files = snapshot_files(observed)
        n_status_files = len(docs) + len(files)
        commit_runs, commit_bytes = status_commits({**docs, **files}, observed, target, args.repeat)
        t[COMMIT] = (min(commit_runs), maxrss(), commit_runs)
        del docs, files

        profile_text = ""
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            make_plan(model, config, state, observed, now=NOW)  # converged, caches warm
            prof.disable()
            changed = changed_model(model, target, CHANGED_IMAGE.format("profiled"))
            one = cProfile.Profile()
            one.enable()
            make_plan(changed, config, state, observed, now=NOW)  # one cluster changed since the last plan
            one.disable()
            del changed
            out = io.StringIO()
            for title, profiled in (("converged", prof), ("one cluster changed", one)):
                out.write(f"\n--- make_plan, {title} ---\n")
                stats = pstats.Stats(profiled, stream=out).strip_dirs()
                stats.sort_stats("tottime").print_stats(20)
                stats.sort_stats("cumulative").print_stats(30)
            profile_text = out.getvalue()

        untraced_rss = maxrss()
        n_pods = len(observed.pods())
        n_containers = sum(len(x.containers) for x in observed.pods())
        n_certs = sum(len(pod.files.certificates) for pod in observed.pods() if pod.files)
        n_nodes = len(model.nodes)
        traced = None
        if not args.no_tracemalloc:
            del observed, state, model, config
            gc.collect()
            t0 = time.perf_counter()
            traced = traced_pass(root, state_path, entry)
            traced["secs"] = time.perf_counter() - t0

    facts = [
        ("clusters / nodes / hypervisors", f"{p.clusters} / {n_nodes} / {p.hypervisors} "
                                           f"({p.private} private, {p.public} public)"),
        ("repo YAML files / documents", f"{n_files} / {n_docs}"),
        ("observed pods / containers / leaf certs", f"{n_pods} / {n_containers} / {n_certs}"),
        ("state.json / observed snapshot size", f"{fmt_mib(state_path.stat().st_size)} / "
                                                f"{fmt_mib(tree_bytes(entry / 'observed'))} in "
                                                f"{sum(1 for _ in (entry / 'observed').rglob('*.json'))} files"),
        ("cache", f"{'USED' if cached else 'not found: built now'} ({entry})"),
    ]
    if not cached:
        meta = json.loads((entry / "meta.json").read_text())
        for label, secs in meta["timings"].items():
            facts.append((f"  generation: {label}", fmt_s(secs)))
    rows = []
    for label, (secs, rss, *runs) in t.items():
        extra = f"   (runs: {', '.join(f'{r:.2f}' for r in runs[0])} s)" if runs else ""
        rows.append((label, f"{fmt_s(secs):>9}   rss {fmt_mib(rss):>8}{extra}"))
    rows.append(("  -> changed plan actions", f"{n_changed} (all in {target}: etcd image)"))
    rows.append(("  -> bytes each status commit added to the repo",
                 f"{', '.join(f'{b / 1024:.0f}' for b in commit_bytes)} KiB ({n_status_files} files in the tree)"))
    mem = [("ru_maxrss (generator child excluded)", fmt_mib(untraced_rss))]
    if traced:
        mem += [
            ("tracemalloc: model held (validate_repo)", fmt_mib(traced["model"])),
            ("tracemalloc: recorded state held", fmt_mib(traced["state"])),
            ("tracemalloc: observed state held", fmt_mib(traced["observed"])),
            ("tracemalloc: observed JSON load, peak", fmt_mib(traced["observed load peak"])),
            ("tracemalloc: make_plan peak above its inputs", fmt_mib(traced["plan above inputs"])),
            ("tracemalloc: peak, inputs + make_plan", fmt_mib(traced["plan peak"])),
            ("  (traced pass time, tracing overhead included)", fmt_s(traced["secs"])),
            ("ru_maxrss after the traced pass", fmt_mib(maxrss())),
        ]
    mem.append(("total wall time", fmt_s(time.perf_counter() - wall)))

    width = max(len(label) for label, _ in facts + rows + mem) + 2
    rule = min(120, max(width + len(value) for _, value in facts + rows + mem))
    print(f"\ngitops plan at scale  (python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    for title, block in (("setup", facts),
                         ("timings (make_plan: best of --repeat; rss = ru_maxrss after the step)", rows),
                         ("memory", mem)):
        print(f"\n{title}\n" + "-" * rule)
        for label, value in block:
            print(f"{label:<{width}}{value}")
    if profile_text:
        print("\ncProfile of make_plan:\n" + profile_text)
    if args.json:
        print(json.dumps(figures(p, t, untraced_rss, max(commit_bytes))))
    return 0


FLOOR = "bare floor (CSafeLoader + Draft202012Validator)"
COLD = "make_plan, converged, first in this process"
CONVERGED = "make_plan, converged (no change)"
ONE_CHANGE = "make_plan, one cluster changed since the last plan"
CONVERGED_WAVES = "make_plan, converged, two waves"
ONE_CHANGE_WAVES = "make_plan, one cluster changed, two waves"
LOAD = "load the observed snapshot (per cluster files)"
DOCUMENTS = "status documents of every resource (YAML)"
SNAPSHOT = "snapshot files of every cluster (compact JSON)"
COMMIT = "status commit, one cluster's snapshot changed"


def figures(p: Params, t: dict[str, tuple], rss: int, commit_bytes: int) -> dict[str, float | int]:
    """The headline figures, for --json (seconds: best of --repeat, but the first plan's)."""
    return {
        "clusters": p.clusters,
        "hypervisors": p.hypervisors,
        "bare_floor_s": round(t[FLOOR][0], 3),
        "validate_s": round(t["validate_repo"][0], 3),
        "plan_first_s": round(t[COLD][0], 3),
        "plan_converged_s": round(t[CONVERGED][0], 3),
        "plan_one_change_s": round(t[ONE_CHANGE][0], 3),
        "plan_converged_over_floor": round(t[CONVERGED][0] / t[FLOOR][0], 2),
        "plan_converged_waves_s": round(t[CONVERGED_WAVES][0], 3),
        "plan_one_change_waves_s": round(t[ONE_CHANGE_WAVES][0], 3),
        "waves_over_plain_converged": round(t[CONVERGED_WAVES][0] / t[CONVERGED][0], 3),
        "waves_over_plain_one_change": round(t[ONE_CHANGE_WAVES][0] / t[ONE_CHANGE][0], 3),
        "rss_mib": round(rss / 2**20, 1),
        "rss_after_plans_mib": round(t[ONE_CHANGE][1] / 2**20, 1),  # before the snapshot is written
        "load_observed_s": round(t[LOAD][0], 3),
        "snapshot_files_s": round(t[SNAPSHOT][0], 3),
        "status_commit_one_s": round(t[COMMIT][0], 3),
        "status_commit_one_kib": round(commit_bytes / 1024, 1),  # the largest of the runs
    }


if __name__ == "__main__":
    sys.exit(main())
