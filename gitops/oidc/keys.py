"""The provider's signing keys: born in its key directory on the machine that runs it, never elsewhere.

`keys.json` lists them (kid, when made, when retired) and the longest token lifetime any provider using the
directory gave (`tokenTTL`); each private key is `<kid>.pem`, mode 0600. The newest signs. A rotation makes a
new one; the old ones are still published (JWKS) until the longest token they may have signed has expired,
then forgotten. A running provider takes a rotation made by another process (`gitops oidc rotate-keys`) at
once: its threads swap one snapshot of the keys under a lock.
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from joserfc.jwk import RSAKey

INDEX = "keys.json"


@dataclass(frozen=True)
class KeyEntry:
    kid: str
    created: float
    retired: float | None = None


@dataclass(frozen=True)
class _Snapshot:
    entries: tuple[KeyEntry, ...]
    keys: dict[str, RSAKey]
    token_ttl: int
    stamp: int


class KeyStore:
    """The keys in `directory` (made, with its first key, if it has none)."""

    def __init__(self, directory: str | os.PathLike[str], token_ttl: int):
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._lock = threading.Lock()
        with self._lock:
            entries, recorded = self._load()
            ttl = max(token_ttl, recorded)
            if ttl != recorded or not entries:
                self._save(entries, ttl)
            self._now = self._read_all(entries, ttl, None)
        if not any(e.retired is None for e in self._now.entries):
            self.rotate()

    # ------------------------------------------------------------------ files

    def _stamp(self) -> int:
        try:
            return (self.dir / INDEX).stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def _load(self) -> tuple[list[KeyEntry], int]:
        try:
            data = json.loads((self.dir / INDEX).read_text())
        except FileNotFoundError:
            return [], 0
        return [KeyEntry(**e) for e in data["keys"]], int(data.get("tokenTTL", 0))

    def _save(self, entries: list[KeyEntry], token_ttl: int) -> None:
        fd, temp = tempfile.mkstemp(dir=self.dir, prefix=".keys-")
        with os.fdopen(fd, "w") as f:
            json.dump({"keys": [asdict(e) for e in entries], "tokenTTL": token_ttl}, f, indent=1)
        os.replace(temp, self.dir / INDEX)

    def _read_all(self, entries: list[KeyEntry], token_ttl: int, before: _Snapshot | None) -> _Snapshot:
        known = before.keys if before is not None else {}
        keys = {e.kid: known.get(e.kid) or RSAKey.import_key(
            (self.dir / f"{e.kid}.pem").read_bytes(), parameters={"kid": e.kid, "use": "sig", "alg": "RS256"})
            for e in entries}
        return _Snapshot(tuple(entries), keys, token_ttl, self._stamp())

    def _current(self) -> _Snapshot:
        """The keys as the directory has them now (re-read when another process rotated them)."""
        with self._lock:
            if self._stamp() != self._now.stamp:
                entries, ttl = self._load()
                self._now = self._read_all(entries, max(ttl, self._now.token_ttl), self._now)
            return self._now

    # ------------------------------------------------------------------ use

    def rotate(self, now: float | None = None) -> str:
        """A new signing key; the current one retires (published until what it signed expired)."""
        now = time.time() if now is None else now
        kid = f"{time.strftime('%Y%m%d', time.gmtime(now))}-{secrets.token_hex(4)}"
        key = RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True)
        with self._lock:
            entries, recorded = self._load()
            ttl = max(recorded, self._now.token_ttl)
            fd = os.open(self.dir / f"{kid}.pem", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key.as_pem(private=True))
            kept = [e if e.retired is not None else KeyEntry(e.kid, e.created, now) for e in entries
                    if e.retired is None or e.retired + ttl > now]
            for gone in {e.kid for e in entries} - {e.kid for e in kept}:
                (self.dir / f"{gone}.pem").unlink(missing_ok=True)
            entries = [*kept, KeyEntry(kid, now)]
            self._save(entries, ttl)
            self._now = self._read_all(entries, ttl, self._now)
        return kid

    @property
    def signing(self) -> RSAKey:
        """The key that signs now (its `kid` is the one to put in a token's header)."""
        now = self._current()
        current = next(e for e in reversed(now.entries) if e.retired is None)
        return now.keys[current.kid]

    def jwks(self, now: float | None = None) -> dict:
        """The public keys a token may be checked with: the signing one and those retired less than the
        longest token lifetime ago."""
        snap = self._current()
        now = time.time() if now is None else now
        return {"keys": [snap.keys[e.kid].as_dict(private=False) for e in snap.entries
                         if e.retired is None or e.retired + snap.token_ttl > now]}
