"""The controller's status branch on a real bare git repo, with nothing to apply (no lab, fast).

Each reconcile is its own `gitops reconcile` process, as in production, so whatever the
controller remembers between commits has to survive a restart.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

GITOPS = str(Path(sys.executable).parent / "gitops")
GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com"]
CONFIG = """\
apiVersion: gitops.infra/v1alpha1
kind: GitopsConfig
spec:
  statusBranch: something-else
"""
BAD_NODE = """\
apiVersion: gitops.infra/v1alpha1
kind: Node
metadata:
  name: lost
spec:
  role: controlplan
"""


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 or not check, f"git {' '.join(args)}: {proc.stderr}"
    return proc


def push(work: Path, message: str, branch: str = "main") -> str:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    git(work, "push", "-q", "origin", f"HEAD:{branch}")
    return git(work, "rev-parse", "HEAD").stdout.strip()


def reconcile(origin: Path, workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([GITOPS, "reconcile", "--repo", str(origin), "--workdir", str(workdir),
                           "--insecure-plaintext-secrets", "--log-format", "text"],
                          capture_output=True, text=True, timeout=120)


def source_on(origin: Path, branch: str) -> dict:
    shown = git(origin, "show", f"{branch}:status/source.yaml")
    return yaml.safe_load(shown.stdout)["status"]


def _repos(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A bare origin, a work clone holding gitops.yaml (status on another branch), the controller's workdir."""
    origin, work, workdir = tmp_path / "origin.git", tmp_path / "work", tmp_path / "controller"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    git(work, "remote", "add", "origin", str(origin))
    (work / "gitops.yaml").write_text(CONFIG)
    return origin, work, workdir


def test_a_refused_commit_is_reported_on_the_status_branch_in_force(tmp_path: Path):
    origin, work, workdir = _repos(tmp_path)
    good = push(work, "status elsewhere, nothing to apply")

    applied = reconcile(origin, workdir)
    assert applied.returncode == 0 and applied.stdout.startswith("Applied: "), applied.stdout + applied.stderr
    assert source_on(origin, "something-else")["appliedSHA"] == good

    (work / "node.yaml").write_text(BAD_NODE)
    bad = push(work, "typo")
    refused = reconcile(origin, workdir)  # a new process: the branch in force must come from the workdir
    assert refused.returncode == 1 and refused.stdout.startswith("Refused: "), refused.stdout + refused.stderr
    source = source_on(origin, "something-else")
    assert source["result"] == "Refused" and source["lastSeenSHA"] == bad and source["appliedSHA"] == good
    assert any("node.yaml" in e for e in source["errors"]), source["errors"]
    assert git(origin, "rev-parse", "--verify", "--quiet", "refs/heads/gitops/status", check=False).returncode == 1
    log = git(origin, "log", "--format=%s", "something-else").stdout.splitlines()
    assert log[0] == f"refuse {bad[:12]}: {len(source['errors'])} error(s)"
    # each outcome is also a git note on the commit itself (issue #30.3)
    noted = git(origin, "log", "--notes=gitops", "--format=%H%n%N--", "main").stdout
    assert f"{bad}\ngitops: Refused: {len(source['errors'])} error(s)\n" in noted, noted
    assert "node.yaml" in noted.split(bad)[1].split("--")[0]
    assert f"{good}\ngitops: Applied: 0 action(s)" in noted, noted

    # the CLI finds the same branch from the clone's gitops.yaml and reads it
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    pinned = ["--status-signers", str(workdir / "status-signing-key.pub")]  # (the controller's own key)
    shown = subprocess.run([GITOPS, "status", "--repo", str(clone), "-o", "json", *pinned], capture_output=True,
                           text=True)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    data = json.loads(shown.stdout)
    assert data["ref"] == "origin/something-else" and data["source"]["result"] == "Refused"
    assert data["source"]["appliedSHA"] == good and data["clusters"] == {}
    git(clone, "checkout", "-q", good)
    planned = subprocess.run([GITOPS, "plan", str(clone), "--against-status", "origin/something-else", *pinned,
                              "--detailed-exitcode"], capture_output=True, text=True)
    assert planned.returncode == 0, planned.stdout + planned.stderr


def _killed_holding_locks(clone: Path) -> list[str]:
    """Real git processes in `clone` SIGKILLed while they hold its index lock and a ref transaction's locks
    (HEAD's and its branch's): what a controller killed with -9 in the middle of a commit leaves behind."""
    head = git(clone, "rev-parse", "HEAD").stdout.strip()
    holders = [subprocess.Popen(["git", "update-index", "--stdin"], cwd=clone, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL),
               subprocess.Popen(["git", "update-ref", "--stdin"], cwd=clone, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)]
    try:
        holders[1].stdin.write(f"start\nupdate HEAD {head}\ncreate refs/heads/killed/mid-push {head}\nprepare\n")
        holders[1].stdin.flush()
        assert holders[1].stdout.readline() == "start: ok\n" and holders[1].stdout.readline() == "prepare: ok\n"
        for _ in range(200):
            if (clone / ".git" / "index.lock").exists():
                break
            time.sleep(0.05)
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
            proc.stdin.close()
    locks = sorted(str(p.relative_to(clone)) for p in (clone / ".git").rglob("*.lock"))
    assert ".git/index.lock" in locks and ".git/HEAD.lock" in locks and len(locks) >= 3, locks
    return locks


def test_git_locks_left_by_a_killed_controller_do_not_stop_the_next_one(tmp_path: Path):
    origin, work, workdir = _repos(tmp_path)
    push(work, "first")
    assert reconcile(origin, workdir).returncode == 0

    clones = sorted(p.parent for p in workdir.glob("*/.git"))
    assert len(clones) == 2, clones  # the source and the status branch
    for clone in clones:
        _killed_holding_locks(clone)

    (work / "README.md").write_text("second\n")
    second = push(work, "second")
    again = reconcile(origin, workdir)
    assert again.returncode == 0 and again.stdout.startswith("Applied: "), again.stdout + again.stderr
    assert source_on(origin, "something-else")["appliedSHA"] == second
    assert "git lock left by a killed process removed" in again.stderr
    assert not [p for clone in clones for p in (clone / ".git").rglob("*.lock")]
