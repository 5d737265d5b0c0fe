"""Secret fields: which fields of which kinds may hold an age-encrypted value, and opening them.

A secret field holds either plaintext (refused unless `spec.secrets.allowPlaintext`) or one
ASCII-armored age file (`-----BEGIN AGE ENCRYPTED FILE-----`), encrypted to the repo's
`spec.secrets.recipients`. Loading decrypts it with the identity the command was given and
puts the plaintext in the in-memory document only; the files on disk never change.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyrage import x25519

from gitops.model.config import RepoConfig
from gitops.model.diagnostics import Diagnostic, format_path
from gitops.model.documents import Document, FieldPath
from gitops.secrets import SecretsError, decrypt, dearmor, is_armored

#: Per kind, the fields that may be age-encrypted. Add a path here to declare a new secret field;
#: ANY in a path stands for every key or list index at that place.
ANY = "*"
SECRET_FIELDS: dict[str, tuple[FieldPath, ...]] = {
    "Hypervisor": (("spec", "remoteCRIEndpoint", "clientCertificate", "privateKey"),),
    "GitopsConfig": (("spec", "backup", "targets", ANY, "password"), ("spec", "notifications", "targets", ANY, "url")),
    "SIPCluster": (("spec", "services", "auth", "clients", ANY, "secret"),),
}

#: both PEM keys and armored age files start with it: a cheap test before the others (repos at scale)
PEM_MARK = "-----BEGIN"
#: any PEM private key (PKCS#8, RSA, EC, OPENSSH, ENCRYPTED ...) and an armored PGP private key block
PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
#: an age identity (`age-keygen` output): Bech32, upper case
AGE_SECRET_KEY = re.compile(r"AGE-SECRET-KEY-1[02-9AC-HJ-NP-Z]{20,}")
#: "-----BEGIN" in base64 (at the start of the encoded text): a PEM key written base64-encoded
BASE64_PEM_MARK = "LS0tLS1CRUdJTi"
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/=\s]*")
#: how much of a base64 run is decoded to look for a key header (the header comes first), and how
#: many runs of one value (a value made of the mark repeated costs no more than this)
_BASE64_PEEK = 4096
_BASE64_TRIES = 16

IDENTITY_HINT = "--identity FILE or $GITOPS_IDENTITY"


def declared(kind: str) -> tuple[FieldPath, ...]:
    return SECRET_FIELDS.get(kind, ())


def is_secret(kind: str, path: FieldPath) -> bool:
    """Whether `path` of a `kind` document is a declared secret field."""
    return any(len(p) == len(path) and all(a == ANY or a == b for a, b in zip(p, path)) for p in declared(kind))


def _expand(value: Any, pattern: FieldPath, path: FieldPath = ()) -> Iterator[tuple[FieldPath, Any]]:
    """The values at `pattern` under `value` (ANY: every key or index there), with their paths."""
    if not pattern:
        yield path, value
        return
    head, rest = pattern[0], pattern[1:]
    if head == ANY:
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            yield from _expand(item, rest, path + (key,))
    elif isinstance(value, dict) and head in value:
        yield from _expand(value[head], rest, path + (head,))


def describe_declared() -> str:
    return "; ".join(f"{kind}: {', '.join(format_path(p).replace('.' + ANY, '[*]') for p in paths)}"
                     for kind, paths in SECRET_FIELDS.items())


def strings(value: Any, path: FieldPath = (), *, keys: bool = False) -> Iterator[tuple[FieldPath, str]]:
    """Every string value under `value`, with its path; with `keys`, every mapping key too (at the
    path of its value). Bounded: the loader refused documents whose expansion is large."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if keys and isinstance(key, str):
                yield path + (key,), key
            yield from strings(item, path + (key,), keys=keys)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from strings(item, path + (index,), keys=keys)


def private_key_in(text: str) -> str:
    """What private key `text` holds in the clear ("" when none): a PEM or PGP block, an age
    identity, or a PEM key encoded in base64 (as a Kubernetes Secret's `data` holds it)."""
    if PEM_MARK in text and PRIVATE_KEY.search(text):
        return "PGP private key" if "PGP PRIVATE KEY BLOCK" in text else "private key"
    if "AGE-SECRET-KEY-1" in text and AGE_SECRET_KEY.search(text):
        return "age identity (AGE-SECRET-KEY-1...)"
    start = text.find(BASE64_PEM_MARK)
    for _ in range(_BASE64_TRIES):
        if start == -1:
            break
        run = _BASE64_RUN.match(text, start, start + _BASE64_PEEK).group()
        encoded = "".join(run.split())
        encoded = encoded[: len(encoded) - len(encoded) % 4]
        try:
            decoded = base64.b64decode(encoded, validate=False).decode("latin-1")
        except (binascii.Error, ValueError):
            decoded = ""
        if PRIVATE_KEY.search(decoded):
            return "base64-encoded private key"
        start = text.find(BASE64_PEM_MARK, start + len(BASE64_PEM_MARK))
    return ""


def secret_values(doc: Document) -> Iterator[tuple[FieldPath, str]]:
    """The declared secret fields of `doc` that are present, with their (string) values."""
    for pattern in declared(doc.kind):
        for path, value in _expand(doc.data, pattern):
            if isinstance(value, str):
                yield path, value


@dataclass
class Opened:
    """What opening a repo's secrets found: errors, warnings, and values left sealed."""

    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)
    #: encrypted values not decrypted because no identity was given (armor checked)
    sealed: list[Diagnostic] = field(default_factory=list)
    decrypted: int = 0


#: what `private_key_in` needs to find in a string before it looks any further
_KEY_MARKS = (PEM_MARK, "AGE-SECRET-KEY-1", BASE64_PEM_MARK)


def _may_hold_key(data: Any) -> bool:
    """Whether some string of `data` (key or value) holds a mark `private_key_in` looks for: searched in
    its JSON text at once (a mark inside one string shows there as is; the text between two strings
    is punctuation, so no mark is made across them)."""
    try:
        text = json.dumps(data, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return True
    return any(mark in text for mark in _KEY_MARKS)


def plaintext_findings(docs: list[Document], allow: bool) -> Iterator[Diagnostic]:
    """A plaintext private key anywhere in the documents' values (error, or warning when allowed)."""
    for doc in docs:
        yield from _plaintext_secrets(doc, allow)
        if not _may_hold_key(doc.data):
            continue
        for path, value in strings(doc.data, keys=True):
            what = private_key_in(value)
            if not what:
                continue
            if is_secret(doc.kind, path):
                how = f"encrypt it: gitops secrets encrypt {doc.file} --field {format_path(path)}"
            else:
                how = ("this field is not a secret field gitops decrypts, so keep the key out of the repo "
                       f"(secret fields: {describe_declared()})")
            if allow:
                yield doc.error(path, f"plaintext {what} (allowed by spec.secrets.allowPlaintext in gitops.yaml)")
            else:
                yield doc.error(path, f"plaintext {what} in the repo; {how}, or set "
                                      "spec.secrets.allowPlaintext: true in gitops.yaml (labs only)")


def _plaintext_secrets(doc: Document, allow: bool) -> Iterator[Diagnostic]:
    """A declared secret field holding plaintext that is no private key (a password): the key check
    above reports the others."""
    for path, value in secret_values(doc):
        if (PEM_MARK in value and is_armored(value)) or private_key_in(value):
            continue
        if allow:
            yield doc.error(path, "plaintext secret (allowed by spec.secrets.allowPlaintext in gitops.yaml)")
        else:
            yield doc.error(path, f"plaintext secret in the repo; encrypt it: gitops secrets encrypt {doc.file} "
                                  f"--field {format_path(path)}, or set spec.secrets.allowPlaintext: true in "
                                  "gitops.yaml (labs only)")


def open_secrets(docs: list[Document], config: RepoConfig,
                 identities: list[x25519.Identity] | None) -> Opened:
    """Check every secret field; with identities, decrypt the encrypted ones in place (in memory).

    Without identities, encrypted values are checked for structure (the armor parses) and
    listed in `sealed`. An encrypted value in a field that is not declared secret is an error.
    """
    out = Opened()
    findings = list(plaintext_findings(docs, config.allow_plaintext))
    (out.warnings if config.allow_plaintext else out.errors).extend(findings)
    for doc in docs:
        for path, value in strings(doc.data):
            if PEM_MARK not in value or not is_armored(value):
                continue
            if not is_secret(doc.kind, path):
                out.errors.append(doc.error(path, "age-encrypted value in a field gitops does not decrypt "
                                                  f"(secret fields: {describe_declared()})"))
                continue
            try:
                if identities is None:
                    dearmor(value)
                    out.sealed.append(doc.error(path, "age-encrypted; not decrypted (no identity given): "
                                                      "armor checked only"))
                    continue
                plain = decrypt(value, identities).decode("utf-8")
            except SecretsError as err:
                out.errors.append(doc.error(path, str(err)))
                continue
            except UnicodeDecodeError:
                out.errors.append(doc.error(path, "decrypted value is not UTF-8 text"))
                continue
            _set(doc.data, path, plain)
            out.decrypted += 1
    return out


def _set(data: dict[str, Any], path: FieldPath, value: str) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
