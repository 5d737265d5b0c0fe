"""SSH signing keys for tests of the status branch's trust (real `ssh-keygen`, ed25519)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from gitops.status.trust import BranchTrust, Signers, SigningKey, Verifier, ensure_key


def make_key(directory: Path, name: str) -> SigningKey:
    """A new key `directory/name` (its `.pub` beside it)."""
    return ensure_key(directory / name, f"{name}@test")


def trust(key: SigningKey | None, *pinned: SigningKey) -> BranchTrust:
    """Signs with `key`, reads commits signed by `key` or one of `pinned`."""
    signers = Signers(tuple(k.signer for k in ((key,) if key else ()) + pinned))
    return BranchTrust(Verifier(signers), key)


def commit_unsigned(bare: str, branch: str, files: dict[str, str], message: str = "not from gitops",
                    work: Path | None = None) -> str:
    """A commit on `branch` of the bare repo `bare` changing `files` (a value starting with '->' is a symlink
    to the rest), made and pushed with plain git and no signature, as anyone with push access could."""
    assert work is not None
    subprocess.run(["git", "clone", "-q", bare, str(work)], check=True, capture_output=True)
    git = ["git", "-C", str(work), "-c", "user.name=someone", "-c", "user.email=someone@example.invalid",
           "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "checkout", "-q", "-B", branch, f"origin/{branch}"], check=False, capture_output=True)
    for rel, content in files.items():
        path = work / rel
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if content.startswith("->"):
            path.symlink_to(content[2:])
        else:
            path.write_text(content)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    subprocess.run([*git, "push", "-q", "origin", f"HEAD:refs/heads/{branch}"], check=True, capture_output=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def shared_status_key(directory: Path) -> Path:
    """One status signing key several replicas are given with --status-signing-key (each trusts its own)."""
    return ensure_key(directory / "shared-status-key", "replicas@test").path
