"""age encryption for what goes to git: ASCII-armored, readable by the standard `age -d`."""
from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence

import pyrage
from pyrage import x25519

from gitops.errors import GitopsError

BEGIN = "-----BEGIN AGE ENCRYPTED FILE-----"
END = "-----END AGE ENCRYPTED FILE-----"
#: the first line of every age file (the armor wraps it)
AGE_HEADER = b"age-encryption.org/v1\n"
COLUMNS = 64


class SecretsError(GitopsError):
    pass


def recipient(text: str) -> x25519.Recipient:
    try:
        return x25519.Recipient.from_str(text.strip())
    except Exception as err:  # noqa: BLE001 - pyrage raises its own types
        raise SecretsError(f"not an age recipient (age1...): {text.strip()[:20]!r}: {err}") from None


def load_identity(text: str) -> x25519.Identity:
    """An age identity from the text of an `age-keygen` file (comments allowed)."""
    return load_identities(text)[0]


def load_identities(text: str) -> list[x25519.Identity]:
    """Every identity of an `age-keygen` file (several keys may be concatenated, as `age -i` reads)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("AGE-SECRET-KEY-"):
            try:
                out.append(x25519.Identity.from_str(line))
            except Exception as err:  # noqa: BLE001
                raise SecretsError(f"invalid age identity: {err}") from None
    if not out:
        raise SecretsError("no AGE-SECRET-KEY-... line in the identity file")
    return out


def public_recipient(identity: x25519.Identity) -> str:
    return str(identity.to_public())


def encrypt(data: bytes, recipients: Iterable[str]) -> str:
    """Encrypt to every recipient; returns armored text."""
    parsed = [recipient(r) for r in recipients]
    if not parsed:
        raise SecretsError("no age recipient to encrypt to")
    body = base64.b64encode(pyrage.encrypt(data, parsed)).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "\n".join([BEGIN, *lines, END]) + "\n"


def is_armored(value: object) -> bool:
    """Whether a value is meant as an armored age file (it starts with the BEGIN line)."""
    return isinstance(value, str) and value.lstrip().startswith(BEGIN)


def dearmor(armored: str) -> bytes:
    """The binary age file inside an armored one, checked as strictly as `age -d` reads it."""
    lines = armored.strip().split("\n")
    if lines[0].rstrip() != BEGIN:
        raise SecretsError(f"corrupt age armor: the first line is not {BEGIN}")
    if lines[-1].rstrip() != END:
        raise SecretsError(f"corrupt age armor: the last line is not {END} (truncated?)")
    body = [line.strip() for line in lines[1:-1]]
    if not body:
        raise SecretsError("corrupt age armor: nothing between the BEGIN and END lines")
    for number, line in enumerate(body, 2):
        if len(line) > COLUMNS or (len(line) < COLUMNS and number != len(body) + 1):
            raise SecretsError(f"corrupt age armor: line {number} of the block has {len(line)} characters "
                               f"(age writes {COLUMNS} per line, the last one shorter)")
    try:
        data = base64.b64decode("".join(body), validate=True)
    except (binascii.Error, ValueError):
        raise SecretsError("corrupt age armor: the body is not base64") from None
    if not data.startswith(AGE_HEADER):
        raise SecretsError("corrupt age armor: the content is not an age file (no age-encryption.org/v1 header)")
    return data


def decrypt(armored: str, identity: x25519.Identity | Sequence[x25519.Identity]) -> bytes:
    """Decrypt an armored age file with one identity or any of several."""
    identities = [identity] if isinstance(identity, x25519.Identity) else list(identity)
    data = dearmor(armored)
    try:
        return pyrage.decrypt(data, identities)
    except Exception as err:  # noqa: BLE001
        raise SecretsError(f"cannot decrypt (not encrypted to this identity, or corrupt): {err}") from None
