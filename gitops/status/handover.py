"""Moving recorded state between a state dir (`gitops apply` by hand) and the status branch (the controller).

`pull` opens the state sealed on the status branch (`state/public.json` and `state/secrets.age`,
decrypted with the controller's age identity); `push` seals a state onto it as the next
generation, which the controller restores on its next reconcile (the newest generation wins
over its local cache). Neither overwrites a different state unless forced: a team moves its
clusters from one to the other without losing a CA key or a placement.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from gitops.errors import GitopsError
from gitops.state.records import State
from gitops.status.branch import StatusBranch
from gitops.status.reader import PUBLIC, STATE_DIR
from gitops.status.sealed_state import ControllerStateStore, Sealer


class HandoverError(GitopsError):
    pass


def pull(branch: StatusBranch, sealer: Sealer) -> tuple[int, State]:
    """(generation, state) sealed on the status branch's tip."""
    branch.sync()
    with tempfile.TemporaryDirectory(prefix="gitops-state-") as scratch:
        found = ControllerStateStore(sealer, Path(scratch)).read(branch.read)
    if found is None:
        raise HandoverError(f"the status branch {branch.branch} of {branch.url} holds no state ({PUBLIC})")
    return found


def push(branch: StatusBranch, sealer: Sealer, state: State, *, force: bool = False) -> tuple[int, str | None]:
    """Seal `state` onto the status branch as its next generation; (generation, commit or None if unchanged).
    A different state already there is refused unless `force`."""
    pushed: list[int] = []

    def write(tip: StatusBranch) -> None:
        with tempfile.TemporaryDirectory(prefix="gitops-state-") as scratch:
            store = ControllerStateStore(sealer, Path(scratch))
            found = store.read(tip.read)
            generation, there = found if found is not None else (0, None)
            if there is None or there.to_dict() != state.to_dict():
                if there is not None and there.clusters and not force:
                    raise HandoverError(
                        f"the status branch {tip.branch} already holds another state (generation {generation}, "
                        f"clusters {', '.join(sorted(there.clusters))}): `gitops state pull` it to look, "
                        "or --force to replace it")
                generation += 1
            store.state, store.generation = state.copy(), generation
            pushed[:] = [store.generation]
            previous = {rel: tip.read(rel) for rel in (PUBLIC, sealer.path)}
            tip.write_tree(store.files(previous), managed=(STATE_DIR,))

    sha = branch.publish(write, "gitops state push: recorded state handed to the controller")
    return pushed[0], sha
