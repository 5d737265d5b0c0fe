"""Controller state on the status branch: public part in the clear, private keys sealed with age.

`state/public.json` holds what plans need (placements, ports, CA certificates,
etcd members, service-account public keys) so `gitops plan --against-status`
works without any key. `state/secrets.age` holds the CA and admin private keys,
encrypted to the controller's own age identity, so a controller restarted on
another machine with that identity carries on. A local copy in the workdir
(same format) survives a crash between two pushes; the newer generation wins.
"""
from __future__ import annotations

import json
from pathlib import Path

from gitops.errors import GitopsError
from gitops.secrets import decrypt, encrypt, load_identity, public_recipient
from gitops.state.records import State
from gitops.state.sealing import merge, split
from gitops.status.reader import PLAINTEXT, PUBLIC, SEALED
from gitops.safeio import write_atomic


class StateSealError(GitopsError):
    pass


class Sealer:
    """Seals the private half: age to the controller's identity, or plaintext when told so loudly."""

    def __init__(self, identity_text: str | None, insecure_plaintext: bool = False):
        if identity_text is None and not insecure_plaintext:
            raise StateSealError("the controller needs an age identity (--identity FILE, from age-keygen) to keep "
                                 "its keys on the status branch; --insecure-plaintext-secrets is for labs only")
        self.identity = load_identity(identity_text) if identity_text else None
        self.insecure = self.identity is None

    @property
    def recipient(self) -> str | None:
        return public_recipient(self.identity) if self.identity else None

    @property
    def path(self) -> str:
        return PLAINTEXT if self.insecure else SEALED

    def seal(self, plaintext: bytes, previous: bytes | None, extra_recipients: tuple[str, ...] = ()) -> bytes:
        """Ciphertext for `plaintext`, reusing `previous` when it already holds the same plaintext
        (age output is randomised; re-encrypting would make a commit every time)."""
        if self.insecure:
            return plaintext
        if previous is not None:
            try:
                if self.open(previous) == plaintext:
                    return previous
            except GitopsError:
                pass
        assert self.recipient is not None
        return encrypt(plaintext, (self.recipient, *extra_recipients)).encode()

    def open(self, data: bytes) -> bytes:
        if self.insecure:
            return data
        assert self.identity is not None
        return decrypt(data.decode(), self.identity)


class ControllerStateStore:
    """A `StateStore` whose durable home is the status branch, with a local crash copy."""

    def __init__(self, sealer: Sealer, cache_dir: Path):
        self.sealer = sealer
        self.cache_dir = cache_dir
        self.state = State()
        self.generation = 0

    # -- the StateStore interface used by apply
    def load(self) -> State:
        return self.state.copy()

    def save(self, state: State) -> None:
        if state.to_dict() == self.state.to_dict():
            return
        self.state = state.copy()
        self.generation += 1
        self._write_cache()

    # -- moving state between the branch, the cache and memory
    def files(self, previous: dict[str, bytes | None]) -> dict[str, bytes]:
        """The state files for the branch (or cache), reusing unchanged ciphertext."""
        public, secrets = split(self.state)
        public["generation"] = self.generation
        plaintext = (json.dumps(secrets, indent=2, sort_keys=True) + "\n").encode()
        return {
            PUBLIC: (json.dumps(public, indent=2, sort_keys=True) + "\n").encode(),
            self.sealer.path: self.sealer.seal(plaintext, previous.get(self.sealer.path)),
        }

    def read(self, read_file) -> tuple[int, State] | None:
        """(generation, state) from files read with `read_file(rel) -> bytes | None`."""
        raw = read_file(PUBLIC)
        if raw is None:
            return None
        public = json.loads(raw)
        sealed = read_file(self.sealer.path)
        if sealed is None and public.get("clusters"):
            other = SEALED if self.sealer.insecure else PLAINTEXT
            raise StateSealError(f"the status branch has {PUBLIC} but no {self.sealer.path}"
                                 + (f" (it has {other}: started with the other secrets mode?)" if read_file(other) else ""))
        secrets = json.loads(self.sealer.open(sealed)) if sealed is not None else None
        return int(public.pop("generation", 0)), merge(public, secrets)

    def adopt(self, state: State, generation: int) -> None:
        """Hold `state` (merged with other writers') as generation `generation`, cached locally."""
        self.state, self.generation = state.copy(), generation
        self._write_cache()

    def restore(self, read_branch, use_cache: bool = True) -> str:
        """Load the newest of the branch's and the local cache's state; returns where it came from.
        `use_cache=False` (one of several controllers): the branch only, which every writer merges into."""
        found = [(g, s, "status branch") for g, s in [self.read(read_branch) or (-1, None)] if s is not None]
        cached = self.read(self._read_cache) if use_cache else None
        if cached is not None:
            found.append((cached[0], cached[1], "local cache"))
        if not found:
            self.state, self.generation = State(), 0
            return "empty"
        generation, state, origin = max(found, key=lambda item: item[0])
        self.state, self.generation = state, generation
        return origin

    def _read_cache(self, rel: str) -> bytes | None:
        path = self.cache_dir / rel
        return path.read_bytes() if path.is_file() else None

    def _write_cache(self) -> None:
        previous = {rel: self._read_cache(rel) for rel in (PUBLIC, self.sealer.path)}
        for rel, data in self.files(previous).items():
            path = self.cache_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(path, data)
