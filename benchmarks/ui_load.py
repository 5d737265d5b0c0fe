#!/usr/bin/env python3
"""The web UI under load (issue #42, point 4): `gitops ui` as a process, over real git repos.

Three measurements, each against a `gitops ui` process of its own:

* **/healthz under plans**: pr_plan.py's converged fleet (N clusters) and its status branch, plus `--plans`
  branches that each change gitops.yaml's rollout health timeout (which every cluster's plan reads: each is
  a full cold plan). All of them are asked at once (`/plan?ref=...`) while /healthz is asked every 20 ms
  (a new connection each): its latencies (p50, p99, max, the idle ones before), what the plans answered
  (200, or 503 beyond the UI's 2 plans at once) and how long, the same requests again (kept plans), and the
  process's peak RSS.
* **/plan of a 200 MB branch**: a branch of that fleet with 200 MB of zeros committed (`--zeros-mib`). Its
  peak RSS (VmHWM, before and after the request): refused by the branch-size limit (default 64 MiB), and
  with the limit raised (`--plan-max-mib 1024`), archived and planned (the archive streams to disk).
* **/applies**: a status branch of `--applies` commits, each writing a status/apply.yaml of about
  `--apply-kib` KiB; the page timed cold (every record parsed; asked twice at once, /healthz timed
  meanwhile), warm (kept by status commit), and one apply's page; beside, in this process, parsing one
  such record (mean of 5) with PyYAML's pure-Python SafeLoader and with libyaml's CSafeLoader (the UI's).

    .venv/bin/python benchmarks/ui_load.py --json                  # 1,000 clusters, 4 plans at once
    .venv/bin/python benchmarks/ui_load.py --quick                 # 50 clusters
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
for path in (str(REPO_ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import plan_scale as ps  # noqa: E402
import pr_plan  # noqa: E402
import yaml  # noqa: E402

from gitops.model.validate import validate_repo  # noqa: E402

GITOPS = str(Path(sys.executable).parent / "gitops")
git = pr_plan.git


def log(message: str) -> None:
    print(f"[ui_load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ a `gitops ui` process

class UI:
    """`gitops ui --repo REPO ARGS...` on a free loopback port, until `stop`."""

    def __init__(self, repo: Path, *args: str):
        self.proc = subprocess.Popen([GITOPS, "ui", "--repo", str(repo), "--address", "127.0.0.1:0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if not found:
            self.stop()
            raise SystemExit(f"gitops ui did not start: {line!r}")
        self.base = found.group(0)

    def memory(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in bytes."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def ask(url: str, timeout: float = 900) -> tuple[float, int, str]:
    """(seconds, status, body) of one GET on a new connection."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body, code = answer.read().decode(), answer.status
    except urllib.error.HTTPError as err:
        body, code = err.read().decode(), err.code
    return time.perf_counter() - started, code, body


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(values), "p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1)}


def healthz_during(base: str, paths: list[str]) -> tuple[dict[str, float], list[tuple[float, int, str]]]:
    """/healthz's latencies (every 20 ms, a new connection each) while `paths` are all asked at once; and
    their answers. Beside: the machine's own stalls, the late wake-ups (over 50 ms) of a thread of this
    process sleeping 5 ms at a time, and how many /healthz over 100 ms no such stall overlaps."""
    busy, samples, stalls = threading.Event(), [], []
    busy.set()

    def poll() -> None:
        while busy.is_set():
            started = time.perf_counter()
            seconds, code, _ = ask(base + "healthz", timeout=30)
            assert code == 200, code
            samples.append((started, started + seconds))
            time.sleep(0.02)

    def watch() -> None:
        last = time.perf_counter()
        while busy.is_set():
            time.sleep(0.005)
            now = time.perf_counter()
            if now - last > 0.05:
                stalls.append((last, now))
            last = now

    threads = [threading.Thread(target=poll), threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
            answers = list(pool.map(lambda p: ask(base + p), paths))
    finally:
        busy.clear()
        for thread in threads:
            thread.join()
    figures = ms([b - a for a, b in samples])
    figures["machine_stall_max_ms"] = round(max((b - a for a, b in stalls), default=0) * 1000, 1)
    figures["over_100ms_unexplained"] = sum(1 for a, b in samples if b - a >= 0.1
                                            and not any(x < b and y > a for x, y in stalls))
    return figures, answers


# ------------------------------------------------------------------------------ the measurements

def fleet_clone(base: Path, clusters: int, hypervisors: int, cache_dir: Path, workers: int) -> tuple[Path, int]:
    """pr_plan.py's clone of the converged fleet with its status branch; its cluster count."""
    today = dt.datetime.now(dt.timezone.utc)
    ps.NOW = dt.datetime(today.year, today.month, 1, tzinfo=dt.timezone.utc)  # certificates valid today
    p = ps.Params(clusters, hypervisors)
    repo = base / "repo"
    ps.write_repo(repo, p)
    validation = validate_repo(repo)
    assert validation.model is not None, validation.diagnostics[:5]
    model, config = validation.model, validation.repo.config
    entry, _cached = ps.ensure_cache(model, p, cache_dir, False, workers)
    records = pr_plan.converged_records(model, config, entry, cache_dir)
    target = sorted(model.clusters)[len(model.clusters) // 2]
    count = len(model.clusters)
    del validation, model
    return pr_plan.make_clone(base, repo, entry, records, target), count


def plans_under_load(clone: Path, count: int) -> dict:
    """`count` branches, each a full cold plan, asked at once while /healthz is timed."""
    names = []
    for i in range(count):
        name = f"timeout-{i}"
        git(clone, "checkout", "-q", "-B", name, "main")
        config = clone / "gitops.yaml"
        config.write_text(config.read_text() + f"  rollout:\n    healthTimeoutSeconds: {91 + i}\n")
        git(clone, "commit", "-q", "-am", f"every cluster: health timeout {91 + i}")
        names.append(name)
    git(clone, "checkout", "-q", "main")
    ui = UI(clone, "--refresh", "3600")
    try:
        assert ask(ui.base + "plan")[1] == 200
        idle, _ = healthz_during(ui.base, ["plan"])
        log(f"/healthz idle: {idle}; asking {count} full plans at once")
        busy, answers = healthz_during(ui.base, [f"plan?ref={n}" for n in names])
        log(f"/healthz under {count} plans: {busy}")
        for seconds, code, body in answers:
            if code == 200:
                assert 'id="headline"' in body, body[-2000:]
        _, again = healthz_during(ui.base, [f"plan?ref={n}" for n in names])
        rss, peak = ui.memory()
    finally:
        ui.stop()
    return {"idle": idle, "under_plans": busy,
            "plans": [{"status": code, "s": round(seconds, 2)} for seconds, code, _ in answers],
            "asked_again": [{"status": code, "s": round(seconds, 3)} for seconds, code, _ in again],
            "ui_rss_mib": round(rss / 2**20), "ui_peak_rss_mib": round(peak / 2**20)}


def zeros_branch(clone: Path, mib: int) -> dict:
    """/plan of a branch with `mib` MiB of zeros: refused by the size limit, then planned with it raised."""
    git(clone, "checkout", "-q", "-B", "zeros", "main")
    with open(clone / "zeros.bin", "wb") as out:
        block = b"\0" * 2**20
        for _ in range(mib):
            out.write(block)
    git(clone, "add", "zeros.bin")
    git(clone, "commit", "-q", "-m", f"{mib} MiB of zeros")
    git(clone, "checkout", "-q", "main")
    (clone / "zeros.bin").unlink(missing_ok=True)
    out = {}
    for label, args in (("refused", ()), ("limit_raised", ("--plan-max-mib", str(2 * mib)))):
        ui = UI(clone, "--refresh", "3600", *args)
        try:
            assert ask(ui.base + "plan")[1] == 200
            before = ui.memory()
            seconds, code, body = ask(ui.base + "plan?ref=zeros")
            after = ui.memory()
        finally:
            ui.stop()
        said = re.search(r'class="box Failed mono">([^<]*)<', body)
        out[label] = {"status": code, "s": round(seconds, 2), "rss_before_mib": round(before[0] / 2**20),
                      "peak_before_mib": round(before[1] / 2**20), "peak_after_mib": round(after[1] / 2**20),
                      "said": said.group(1).replace("&#39;", "'") if said else ""}
        log(f"/plan of {mib} MiB of zeros, {label}: {out[label]}")
    return out


def apply_record(i: int, kib: int) -> str:
    """A status/apply.yaml of about `kib` KiB: an apply whose actions all went well."""
    actions, size, n = [], 0, 0
    while size < kib * 1024:
        n += 1
        action = {"index": n, "kind": "pod-create", "subject": f"cluster-{n % 97:03d}/cluster-{n % 97:03d}-cp-{n % 3}",
                  "hypervisor": f"hv-{n % 50:03d}", "reason": f"Node cluster-{n % 97:03d}-cp-{n % 3} is new: its "
                  "pod is created with its containers and files", "result": "Done", "seconds": 1.25,
                  "details": [f"image registry.example.com/etcd:3.5.{n % 20}", "files: 12 (certificates, configs)"]}
        actions.append(action)
        size += 330
    return yaml.safe_dump({"status": {"result": "Applied", "sha": f"{i:040x}", "durationSeconds": 42.5,
                                      "time": "2026-11-27T10:00:00+00:00", "summary": {"planned": n, "executed": n},
                                      "actions": actions}}, sort_keys=False)


def applies_page(base: Path, count: int, kib: int) -> dict:
    """/applies over `count` status commits of a `kib` KiB apply.yaml each: cold, warm, one apply's page."""
    repo = base / "applies"
    git(base, "init", "-q", "-b", "main", str(repo))
    (repo / "README").write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the repo")
    git(repo, "checkout", "-q", "--orphan", "gitops/status")
    records = []
    (repo / "status").mkdir()
    for i in range(1, count + 1):
        records.append(apply_record(i, kib))
        (repo / "status" / "apply.yaml").write_text(records[-1])
        (repo / "status" / "source.yaml").write_text(f"status:\n  result: Applied\n  lastSeenSHA: {i:040x}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"applied {i:040x}")
    git(repo, "checkout", "-q", "main")
    sizes = [len(r.encode()) for r in records]
    log(f"{count} status commits, apply.yaml {min(sizes) // 1024}-{max(sizes) // 1024} KiB")
    ui = UI(repo, "--refresh", "3600")
    try:
        assert ask(ui.base + "plan")[1] == 200  # (imports, the mirror fetched)
        health, answers = healthz_during(ui.base, ["applies", "applies"])  # two readers, the history not parsed yet
        cold = max(seconds for seconds, _, _ in answers)
        for _, code, page in answers:
            assert code == 200 and page.count('data-kind="Applied"') == count, page[-2000:]
        warm = [ask(ui.base + "applies")[0] for _ in range(5)]
        sha = re.search(r'href="/applies/([0-9a-f]{40})"', page).group(1)  # type: ignore[union-attr]
        one = [ask(ui.base + f"applies/{sha}")[0] for _ in range(3)]
        _rss, peak = ui.memory()
    finally:
        ui.stop()
    parse = {}
    for name, loader in (("SafeLoader", yaml.SafeLoader), ("CSafeLoader", yaml.CSafeLoader)):
        started = time.perf_counter()
        for record in records[:5]:
            yaml.load(record, Loader=loader)
        parse[name] = round((time.perf_counter() - started) / 5, 3)
    out = {"commits": count, "apply_kib": round(statistics.mean(sizes) / 1024), "cold_s": round(cold, 2),
           "healthz_during_cold": health,
           "warm_s": round(min(warm), 3), "warm_max_s": round(max(warm), 3),
           "one_apply_cold_s": round(one[0], 2), "one_apply_warm_s": round(min(one[1:]), 3),
           "ui_peak_rss_mib": round(peak / 2**20), "parse_one_record_s": parse}
    log(f"/applies: {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--hypervisors", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="50 clusters over 10 hypervisors")
    ap.add_argument("--plans", type=int, default=4, help="plans of distinct branches asked at once")
    ap.add_argument("--zeros-mib", type=int, default=200)
    ap.add_argument("--applies", type=int, default=100)
    ap.add_argument("--apply-kib", type=int, default=500)
    ap.add_argument("--cache-dir", type=Path, default=HERE / ".cache")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", action="store_true", help="end with the figures as one JSON object")
    args = ap.parse_args(argv)
    if args.quick:
        args.clusters, args.hypervisors = 50, 10
    figures: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                     "loadavg_start": [round(x, 1) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="gitops-ui-load-") as tmp:
        base = Path(tmp)
        figures["applies"] = applies_page(base, args.applies, args.apply_kib)
        clone, count = fleet_clone(base, args.clusters, args.hypervisors, args.cache_dir, args.workers)
        figures["clusters"] = count
        figures["healthz"] = plans_under_load(clone, args.plans)
        figures["zeros"] = zeros_branch(clone, args.zeros_mib)
    figures["loadavg_end"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(figures, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
