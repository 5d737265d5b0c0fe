"""Where recorded state lives."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol

from gitops.errors import GitopsError
from gitops.printable import printable, shorten
from gitops.safeio import FileRefused, MiB, read_text, write_atomic
from gitops.state.records import State

STATE_FILE = "state.json"
#: per cluster, what its last empty plan was made from (`gitops plan` leaves out what matches)
CONVERGED_FILE = "converged.json"
#: a fleet of a thousand clusters records about 20 MiB (certificates and keys)
MAX_STATE_BYTES = 256 * MiB


class StateStore(Protocol):
    def load(self) -> State: ...

    def save(self, state: State) -> None: ...


class LocalDirStore:
    """State as one JSON file (mode 0600) in a directory, replaced atomically; read through `gitops.safeio`."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def load(self) -> State:
        if not os.path.lexists(self.path):
            return State()
        try:
            text = read_text(self.path, MAX_STATE_BYTES)
        except FileRefused as err:
            raise GitopsError(f"cannot read state: {err}") from None
        try:
            return State.parse(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
            raise GitopsError(f"{printable(str(self.path))}: corrupt state file ({shorten(str(err), 300)}); restore "
                              "it from a backup or the status branch") from None

    def save(self, state: State) -> None:
        self._replace(self.path, json.dumps(state.to_dict(), indent=2) + "\n", "state")

    @property
    def converged_path(self) -> Path:
        return self.directory / CONVERGED_FILE

    def load_converged(self) -> dict:
        """`converged.json` (what `gitops plan` may leave out, `gitops.plan.converged`); {} when there is none
        or it cannot be read: it only ever saves work."""
        try:
            data = json.loads(read_text(self.converged_path, MAX_STATE_BYTES))
        except (FileRefused, OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save_converged(self, data: dict) -> None:
        self._replace(self.converged_path, json.dumps(data, indent=1, sort_keys=True) + "\n", "converged records")

    def _replace(self, path: Path, text: str, what: str) -> None:
        """Write `text` to `path` atomically (a temporary file, fsync, rename), mode 0600."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as err:
            raise GitopsError(f"{printable(str(self.directory))}: cannot save {what}: {err.strerror or err}") from None
        try:
            write_atomic(path, text)
        except OSError as err:
            raise GitopsError(f"{printable(str(path))}: cannot save {what}: {err.strerror or err}") from None
