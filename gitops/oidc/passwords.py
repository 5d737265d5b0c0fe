"""Declared users' password hashes: bcrypt (`$2b$`) or argon2id (`$argon2id$`), never plaintext.

Costs are bounded, so that a hash in the repo cannot make each check take minutes or gigabytes: bcrypt 4-14,
argon2id at most 1 GiB of memory, 10 passes and 16 lanes. bcrypt reads at most 72 bytes of a password; a
longer one is refused (bcrypt 5 raises rather than truncate), after the same work as any other check.
"""
from __future__ import annotations

import functools
import re

import bcrypt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

BCRYPT_MAX_BYTES = 72
#: what a password hash of a declared user must look like (the model refuses anything else)
HASH = re.compile(r"^(\$2[aby]\$(0[4-9]|1[0-4])\$[./A-Za-z0-9]{53}"
                  r"|\$argon2id\$v=19\$m=(\d{1,7}),t=(\d{1,2}),p=(\d{1,2})\$[A-Za-z0-9+/]+\$[A-Za-z0-9+/]+)$")
_ARGON2 = PasswordHasher()


@functools.cache
def _dummy() -> bytes:
    """Checked when the user is unknown, so that an unknown name costs what a wrong password costs."""
    return bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=12))


def is_hash(text: str) -> bool:
    """A bcrypt or argon2id hash within the cost bounds."""
    match = HASH.match(text)
    if match is None:
        return False
    if match.group(3) is not None:  # argon2id: memory (KiB), passes, lanes
        memory, passes, lanes = int(match.group(3)), int(match.group(4)), int(match.group(5))
        return 8 <= memory <= 1 << 20 and 1 <= passes <= 10 and 1 <= lanes <= 16
    return True


def verify(hashed: str | None, password: str) -> bool:
    """Whether `password` matches `hashed` (None: an unknown user; the same work is done, False)."""
    secret = password.encode()
    if hashed is not None and is_hash(hashed) and hashed.startswith("$argon2id$"):
        try:
            return _ARGON2.verify(hashed, password)
        except (VerificationError, InvalidHashError):
            return False
    known = hashed is not None and is_hash(hashed) and len(secret) <= BCRYPT_MAX_BYTES
    try:
        matched = bcrypt.checkpw(secret[:BCRYPT_MAX_BYTES], hashed.encode() if known else _dummy())
    except ValueError:
        return False
    return known and matched


def hash_password(password: str, rounds: int = 12) -> str:
    """A bcrypt hash of `password`, as a repo declares it (`gitops oidc hash-password`); `rounds`: its cost (12:
    about a quarter of a second per check here; tests use less). ValueError past 72 bytes (bcrypt's limit)."""
    if len(password.encode()) > BCRYPT_MAX_BYTES:
        raise ValueError(f"a password longer than {BCRYPT_MAX_BYTES} bytes (bcrypt reads no more)")
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()
