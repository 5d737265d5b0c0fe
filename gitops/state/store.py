"""Where recorded state lives."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Protocol

from gitops.errors import GitopsError
from gitops.state.records import State

STATE_FILE = "state.json"


class StateStore(Protocol):
    def load(self) -> State: ...

    def save(self, state: State) -> None: ...


class LocalDirStore:
    """State as one JSON file (mode 0600) in a directory, replaced atomically."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def load(self) -> State:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return State()
        except OSError as err:
            raise GitopsError(f"{self.path}: cannot read state: {err.strerror}") from None
        try:
            return State.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError) as err:
            raise GitopsError(f"{self.path}: corrupt state file ({err}); restore it from a backup "
                              "or the status branch") from None

    def save(self, state: State) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = json.dumps(state.to_dict(), indent=2) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".state-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
