"""A local clone of a remote, reused across runs."""
from __future__ import annotations

from pathlib import Path

import git


def as_url(repo: str) -> str:
    """A repo given as a URL (kept) or as a local path (made absolute: clones live elsewhere)."""
    if "://" not in repo and ":" not in repo.split("/")[0]:
        return str(Path(repo).absolute())
    return repo


def open_clone(url: str, directory: Path) -> git.Repo:
    """The clone of `url` in `directory`: opened (origin re-pointed at `url`) or made without checkout.

    Raises git.GitCommandError or ValueError; callers turn them into their own errors.
    """
    if (directory / ".git").is_dir():
        repo = git.Repo(directory)
        repo.remote("origin").set_url(url)
        return repo
    directory.parent.mkdir(parents=True, exist_ok=True)
    return git.Repo.clone_from(url, directory, no_checkout=True)
