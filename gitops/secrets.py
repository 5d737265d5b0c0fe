"""age encryption for what goes to git: ASCII-armored, readable by the standard `age -d`."""
from __future__ import annotations

import base64
from collections.abc import Iterable

import pyrage
from pyrage import x25519

from gitops.errors import GitopsError

BEGIN = "-----BEGIN AGE ENCRYPTED FILE-----"
END = "-----END AGE ENCRYPTED FILE-----"


class SecretsError(GitopsError):
    pass


def recipient(text: str) -> x25519.Recipient:
    try:
        return x25519.Recipient.from_str(text.strip())
    except Exception as err:  # noqa: BLE001 - pyrage raises its own types
        raise SecretsError(f"not an age recipient (age1...): {text.strip()[:20]!r}: {err}") from None


def load_identity(text: str) -> x25519.Identity:
    """An age identity from the text of an `age-keygen` file (comments allowed)."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("AGE-SECRET-KEY-"):
            try:
                return x25519.Identity.from_str(line)
            except Exception as err:  # noqa: BLE001
                raise SecretsError(f"invalid age identity: {err}") from None
    raise SecretsError("no AGE-SECRET-KEY-... line in the identity file")


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


def decrypt(armored: str, identity: x25519.Identity) -> bytes:
    text = armored.strip()
    if not (text.startswith(BEGIN) and text.endswith(END)):
        raise SecretsError("not an armored age file")
    body = "".join(text[len(BEGIN):-len(END)].split())
    try:
        return pyrage.decrypt(base64.b64decode(body), [identity])
    except Exception as err:  # noqa: BLE001
        raise SecretsError(f"cannot decrypt (wrong identity?): {err}") from None
