"""The provider's signing keys: born in its key directory on the machine that runs it, never elsewhere.

`keys.json` lists them (kid, when made, when retired); each private key is `<kid>.pem`, mode 0600. The
newest signs. A rotation makes a new one; the old ones are still published (JWKS) until the longest
token they signed has expired, then forgotten.
"""
from __future__ import annotations

import json
import os
import secrets
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


class KeyStore:
    """The keys in `directory` (made, with its first key, if it has none)."""

    def __init__(self, directory: str | os.PathLike[str], token_ttl: int):
        self.dir = Path(directory)
        self.token_ttl = token_ttl
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.entries = self._load()
        if not any(e.retired is None for e in self.entries):
            self.rotate()
        self._keys = {e.kid: self._read(e.kid) for e in self.entries}
        self._seen = self._stamp()

    def _stamp(self) -> int:
        try:
            return (self.dir / INDEX).stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def _fresh(self) -> None:
        """Keys rotated by another process (`gitops oidc rotate-keys`) are taken as soon as it wrote them."""
        stamp = self._stamp()
        if stamp != self._seen:
            self.entries = self._load()
            self._keys = {e.kid: self._keys.get(e.kid) or self._read(e.kid) for e in self.entries}
            self._seen = stamp

    def _load(self) -> list[KeyEntry]:
        try:
            data = json.loads((self.dir / INDEX).read_text())
        except FileNotFoundError:
            return []
        return [KeyEntry(**e) for e in data["keys"]]

    def _read(self, kid: str) -> RSAKey:
        return RSAKey.import_key((self.dir / f"{kid}.pem").read_bytes(),
                                 parameters={"kid": kid, "use": "sig", "alg": "RS256"})

    def _save(self) -> None:
        path = self.dir / INDEX
        path.with_suffix(".new").write_text(json.dumps({"keys": [asdict(e) for e in self.entries]}, indent=1))
        os.replace(path.with_suffix(".new"), path)

    def rotate(self, now: float | None = None) -> str:
        """A new signing key; the current one retires (published until what it signed expired)."""
        now = time.time() if now is None else now
        kid = f"{time.strftime('%Y%m%d', time.gmtime(now))}-{secrets.token_hex(4)}"
        key = RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True)
        fd = os.open(self.dir / f"{kid}.pem", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.as_pem(private=True))
        kept = [e if e.retired is not None else KeyEntry(e.kid, e.created, now) for e in self.entries
                if e.retired is None or e.retired + self.token_ttl > now]
        for gone in {e.kid for e in self.entries} - {e.kid for e in kept}:
            (self.dir / f"{gone}.pem").unlink(missing_ok=True)
        self.entries = [*kept, KeyEntry(kid, now)]
        self._save()
        if hasattr(self, "_keys"):
            self._keys = {e.kid: self._keys.get(e.kid) or self._read(e.kid) for e in self.entries}
            self._seen = self._stamp()
        return kid

    @property
    def signing(self) -> RSAKey:
        self._fresh()
        current = next(e for e in reversed(self.entries) if e.retired is None)
        return self._keys[current.kid]

    def jwks(self, now: float | None = None) -> dict:
        """The public keys a token may be checked with: the signing one and those retired less than the
        token lifetime ago."""
        self._fresh()
        now = time.time() if now is None else now
        return {"keys": [self._keys[e.kid].as_dict(private=False) for e in self.entries
                         if e.retired is None or e.retired + self.token_ttl > now]}
