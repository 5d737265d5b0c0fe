"""Declared users' password hashes: bcrypt (`$2b$`) or argon2id (`$argon2id$`), never plaintext."""
from __future__ import annotations

import functools
import re

import bcrypt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

#: what a password hash of a declared user must look like (the model refuses anything else)
HASH = re.compile(r"^(\$2[aby]\$\d{2}\$[./A-Za-z0-9]{53}"
                  r"|\$argon2id\$v=\d+\$m=\d+,t=\d+,p=\d+\$[A-Za-z0-9+/]+\$[A-Za-z0-9+/]+)$")
_ARGON2 = PasswordHasher()


@functools.cache
def _dummy() -> bytes:
    """Checked when the user is unknown, so that an unknown name costs what a wrong password costs."""
    return bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=12))


def is_hash(text: str) -> bool:
    return bool(HASH.match(text))


def verify(hashed: str | None, password: str) -> bool:
    """Whether `password` matches `hashed` (None: an unknown user; the same work is done, False)."""
    secret = password.encode()
    if hashed is None or not is_hash(hashed):
        bcrypt.checkpw(secret, _dummy())
        return False
    if hashed.startswith("$argon2id$"):
        try:
            return _ARGON2.verify(hashed, password)
        except (VerificationError, InvalidHashError):
            return False
    try:
        return bcrypt.checkpw(secret, hashed.encode())
    except ValueError:
        return False


def hash_password(password: str, rounds: int = 12) -> str:
    """A bcrypt hash of `password`, as a repo declares it (`gitops oidc hash-password`); `rounds`: its cost (12:
    about a quarter of a second per check here; tests use less)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()
