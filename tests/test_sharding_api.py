"""Several `gitops watch` replicas sharding a repo through Leases on a real kube-apiserver.

No lab (the clusters have no Nodes: nothing runs on a hypervisor, so no lab lock), but
everything else is real: the API server and its Leases, the replicas as separate
processes, git. Each replica writes only its shards' status and its records merged into
the shared state; one is killed with SIGKILL and another takes its shards over.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from gitops.coordination.shards import shard_leases, shard_of
from tests.kubeapi import kube_api_server
from signing import shared_status_key

pytestmark = pytest.mark.lab("faults")

GITOPS = str(Path(sys.executable).parent / "gitops")
GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com"]
IP = "127.0.30.2"
SHARDS = 4
CLUSTERS = ("team-a", "team-b", "team-c", "team-d", "team-e")
LEASE, RENEW, RETRY = 4, 3, 1


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def cluster(name: str) -> str:
    return (f"apiVersion: gitops.infra/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n"
            f"  kubernetesVersion: \"1.37.2\"\n")


@pytest.fixture(scope="module")
def server():
    with kube_api_server(IP) as api:
        yield api


def show(origin: Path, rel: str) -> str | None:
    proc = subprocess.run(["git", "--git-dir", str(origin), "show", f"gitops/status:{rel}"], capture_output=True,
                          text=True)
    return proc.stdout if proc.returncode == 0 else None


def holders(origin: Path) -> dict[str, str]:
    out = {}
    for lease in shard_leases(SHARDS):
        doc = show(origin, f"status/Shard/{lease}.yaml")
        out[lease] = yaml.safe_load(doc)["status"]["holder"] if doc else ""
    return out


def wait_for(what: str, check, timeout: float, logs: list[Path]) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:]) for p in logs)
            raise AssertionError(f"not {what} after {timeout:.0f}s\n{tails}")
        time.sleep(0.2)
    return time.monotonic() - started


def test_replicas_share_the_shards_and_take_over_a_killed_one(server, tmp_path):
    namespace = "gitops-sharding"
    server.ensure_namespace(namespace)
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    git(tmp_path, "clone", "-q", str(origin), str(work))
    (work / "gitops.yaml").write_text(yaml.safe_dump({
        "apiVersion": "gitops.infra/v1alpha1", "kind": "GitopsConfig",
        "spec": {"coordination": {"mode": "shards", "shards": SHARDS, "namespace": namespace,
                                  "leaseDurationSeconds": LEASE, "renewDeadlineSeconds": RENEW,
                                  "retryPeriodSeconds": RETRY}}}))
    for name in CLUSTERS:
        (work / f"{name}.yaml").write_text(cluster(name))
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "clusters")
    git(work, "push", "-q", "origin", "HEAD:main")

    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        for replica in ("r1", "r2"):
            log = tmp_path / f"{replica}.log"
            logs.append(log)
            with open(log, "wb") as out:
                procs[replica] = subprocess.Popen(
                    [GITOPS, "watch", "--repo", str(origin), "--workdir", str(tmp_path / replica),
                     "--insecure-plaintext-secrets", "--interval", "1s", "--metrics-address", "",
                     "--coordination-kubeconfig", str(server.admin_kubeconfig), "--replica-id", replica,
                     "--status-signing-key", str(shared_status_key(tmp_path))],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            time.sleep(2 if replica == "r1" else 0)  # r1 first takes every shard; r2 makes it give half up

        def shared() -> bool:
            held = holders(origin)
            return sorted(held.values()) == ["r1", "r1", "r2", "r2"]

        wait_for("sharing the 4 shards 2 / 2", shared, 60, logs)
        wait_for("reporting every cluster", lambda: all(show(origin, f"status/Cluster/{c}.yaml") for c in CLUSTERS),
                 30, logs)
        state = yaml.safe_load(show(origin, "state/public.json"))
        assert sorted(state["clusters"]) == sorted(CLUSTERS)  # both replicas' records, merged
        assert all(state["clusters"][c]["authorities"]["cluster"]["cert_pem"] for c in CLUSTERS)
        held = holders(origin)
        for name in CLUSTERS:  # each cluster's status file was written by the holder of its shard
            lease = f"gitops-shard-{shard_of(name, SHARDS)}-of-{SHARDS}"
            shard_doc = yaml.safe_load(show(origin, f"status/Shard/{lease}.yaml"))
            assert name in shard_doc["status"]["clusters"] and shard_doc["status"]["holder"] == held[lease]
        subjects = subprocess.run(["git", "--git-dir", str(origin), "log", "--format=%s", "gitops/status"],
                                  capture_output=True, text=True, check=True).stdout
        assert "[r1: " in subjects and "[r2: " in subjects

        victim = held[f"gitops-shard-{shard_of('team-a', SHARDS)}-of-{SHARDS}"]
        survivor = "r2" if victim == "r1" else "r1"
        os.killpg(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait(timeout=10)
        took = wait_for("taken over", lambda: set(holders(origin).values()) == {survivor}, 30, logs)
        # the survivor saw the victim's last renewal at most one retry period before it died; it takes
        # the Leases once they expire, then reconciles at once (the held set changed), publishing in ~1 s
        assert took < LEASE + RETRY + 1 + 3, took
        git(work, "fetch", "-q", "origin", "gitops/status:refs/remotes/origin/gitops/status")
        pinned = ["--status-signers", f"{shared_status_key(tmp_path)}.pub"]  # the replicas' shared key
        table = subprocess.run([GITOPS, "status", "--repo", str(work), *pinned], capture_output=True, text=True,
                               timeout=60)
        assert table.returncode == 0, table.stderr
        for lease in shard_leases(SHARDS):
            assert any(lease in line and survivor in line for line in table.stdout.splitlines()), table.stdout
        # the web UI's shards page shows the same holders (issue #30)
        ui = subprocess.Popen([GITOPS, "ui", "--repo", str(origin), "--address", "127.0.0.1:0", *pinned],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        procs["ui"] = ui
        url = re.search(r"http://127\.0\.0\.1:\d+/", ui.stdout.readline())  # type: ignore[union-attr]
        assert url, "gitops ui printed no URL"
        page = urllib.request.urlopen(url.group(0) + "shards", timeout=60).read().decode()
        rows = re.findall(r"<tr><td>(gitops-shard-[^<]+)</td><td>([^<]*)</td>", page)
        assert sorted(rows) == sorted((lease, survivor) for lease in shard_leases(SHARDS)), page
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
