"""Encrypt a repo's secret fields in place, and re-encrypt them for new recipients.

Every change is computed for every file first and checked (the rewritten file must load to
the same documents but for the changed fields); only then are files written, each
atomically, so an error leaves the repo as it was.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrage import x25519

from gitops.model.diagnostics import format_path
from gitops.model.documents import Document, FieldPath
from gitops.model.secretfields import describe_declared, secret_values
from gitops.model.yamledit import EditError, literal_block
from gitops.model.yamlload import MAX_FILE_BYTES, RawDocument, YamlError, load_yaml_documents
from gitops.safeio import FileRefused, read_text, write_atomic
from gitops.secrets import SecretsError, decrypt, encrypt, is_armored

#: (index of the YAML document in its file, path prefix of a `kind: List` item)
Location = tuple[int, FieldPath]


@dataclass(frozen=True)
class SecretField:
    """One declared secret field as written in a file."""

    file: str
    line: int
    subject: str  # Kind/name
    path: FieldPath  # within its document
    value: str
    location: Location

    @property
    def encrypted(self) -> bool:
        return is_armored(self.value)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.subject}: {format_path(self.path)}"


@dataclass
class FileChange:
    """What an operation does to one file: the new text (None: unchanged) and a line per field."""

    rel: str
    path: Path
    new_text: str | None = None
    report: list[str] = field(default_factory=list)


def parse_field(text: str) -> FieldPath:
    """`spec.a.b[0].c` -> ("spec", "a", "b", 0, "c")."""
    out: list[str | int] = []
    for part in text.strip().split("."):
        match = re.fullmatch(r"([^\[\]]+)((?:\[\d+\])*)", part)
        if not match:
            raise EditError(f"--field {text!r}: expected a dotted path such as "
                            "spec.remoteCRIEndpoint.clientCertificate.privateKey")
        out.append(match.group(1))
        out.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return tuple(out)


def _load(rel: str, text: str) -> list[RawDocument]:
    try:
        return load_yaml_documents(text, spans=True)
    except YamlError as err:
        raise EditError(f"{rel}:{err.line}: {err.message}") from None


def _documents(rel: str, raws: list[RawDocument]) -> Iterator[tuple[Location, Document]]:
    for index, raw in enumerate(raws):
        if not isinstance(raw.data, dict):
            continue
        if raw.data.get("kind") == "List" and isinstance(raw.data.get("items"), list):
            for i, item in enumerate(raw.data["items"]):
                prefix: FieldPath = ("items", i)
                if isinstance(item, dict):
                    positions = {p[2:]: ln for p, ln in raw.positions.items() if p[:2] == prefix}
                    yield (index, prefix), Document(rel, raw.positions.get(prefix, raw.line), item, positions)
        else:
            yield (index, ()), Document(rel, raw.line, raw.data, raw.positions)


def find_fields(rel: str, text: str) -> list[SecretField]:
    """The declared secret fields written in one file's text, plaintext or encrypted."""
    return [SecretField(rel, doc.line_of(path), doc.subject, path, value, location)
            for location, doc in _documents(rel, _load(rel, text)) for path, value in secret_values(doc)]


def rewrite(rel: str, text: str, changes: dict[SecretField, str]) -> str:
    """`text` with each field's value replaced (as a `|` block), every other byte unchanged."""
    raws = _load(rel, text)
    edits = []
    for secret, value in changes.items():
        index, prefix = secret.location
        span = raws[index].spans.get(prefix + secret.path)
        if span is None:
            raise EditError(f"{secret.where}: the value is not written in place (a YAML merge key?); edit it by hand")
        edits.append((span, secret, value))
    edits.sort(key=lambda e: e[0].start, reverse=True)
    for (span, secret, _), (later, _, _) in zip(edits[1:], edits):
        if span.end > later.start:
            raise EditError(f"{secret.where}: shares its text with another field (a YAML alias); edit it by hand")
    for span, secret, value in edits:
        try:
            text = literal_block(text, span, value)
        except EditError as err:
            raise EditError(f"{secret.where}: {err}") from None
    _verify(rel, raws, text, changes)
    return text


def _verify(rel: str, before: list[RawDocument], text: str, changes: dict[SecretField, str]) -> None:
    """The rewritten text must load to the same documents, but for the changed values."""
    expected = [copy.deepcopy(raw.data) for raw in before]
    for secret, value in changes.items():
        index, prefix = secret.location
        node: Any = expected[index]
        full = prefix + secret.path
        for part in full[:-1]:
            node = node[part]
        node[full[-1]] = value
    try:
        after = [raw.data for raw in load_yaml_documents(text)]
    except YamlError as err:
        raise EditError(f"{rel}: rewriting would break the file (line {err.line}: {err.message}); nothing written")
    if after != expected:
        raise EditError(f"{rel}: rewriting the secret fields would change other values too (a YAML anchor or "
                        "alias shared with them?); nothing written: edit the file by hand")


def _select(fields: list[SecretField], field_path: FieldPath | None, document: str | None) -> list[SecretField]:
    return [f for f in fields
            if (field_path is None or f.path == field_path)
            and (document is None or document in (f.subject, f.subject.split("/", 1)[1]))]


def _transform(files: Sequence[tuple[str, Path]], pick: Callable[[list[SecretField]], list[SecretField]],
               change: Callable[[SecretField], tuple[str | None, str]]) -> list[FileChange]:
    out = []
    for rel, path in files:
        text = read_yaml(rel, path)
        result = FileChange(rel, path)
        changes: dict[SecretField, str] = {}
        for secret in pick(find_fields(rel, text)):
            value, what = change(secret)
            result.report.append(f"{secret.where}: {what}")
            if value is not None:
                changes[secret] = value
        if changes:
            result.new_text = rewrite(rel, text, changes)
        out.append(result)
    return out


def encrypt_fields(files: Sequence[tuple[str, Path]], recipients: Sequence[str], *,
                   field_path: FieldPath | None = None, document: str | None = None) -> list[FileChange]:
    """Encrypt the plaintext secret fields of `files` (those named, or every one) to `recipients`.

    Values already encrypted are left alone (re-encrypting would churn the diff: see `rekey`).
    """
    if not recipients:
        raise EditError("no age recipient: list them in gitops.yaml (spec.secrets.recipients) or pass --recipient")
    encrypt(b"", recipients)  # every recipient parses, before any file is read

    def pick(fields: list[SecretField]) -> list[SecretField]:
        return _select(fields, field_path, document)

    def change(secret: SecretField) -> tuple[str | None, str]:
        if secret.encrypted:
            return None, "already encrypted (left as is; `gitops secrets rekey` re-encrypts)"
        return encrypt(secret.value.encode(), recipients), f"encrypted for {len(recipients)} recipient(s)"

    changes = _transform(files, pick, change)
    if (field_path is not None or document is not None) and not any(c.report for c in changes):
        what = " ".join(x for x in (document and f"document {document}",
                                    field_path and f"field {format_path(field_path)}") if x)
        raise EditError(f"no secret field matches {what} in {', '.join(rel for rel, _ in files)} "
                        f"(secret fields: {describe_declared()})")
    return changes


def rekey_fields(files: Sequence[tuple[str, Path]], identities: list[x25519.Identity],
                 recipients: Sequence[str]) -> list[FileChange]:
    """Decrypt every encrypted secret field with `identities` and encrypt it again to `recipients`.

    Every value is decrypted before anything is written: one that does not decrypt stops it all.
    """
    if not recipients:
        raise EditError("no age recipient: list them in gitops.yaml (spec.secrets.recipients) or pass --recipient")
    encrypt(b"", recipients)
    failures: list[str] = []

    def change(secret: SecretField) -> tuple[str | None, str]:
        if not secret.encrypted:
            return None, "plaintext, not touched (`gitops secrets encrypt` encrypts it)"
        try:
            plain = decrypt(secret.value, identities)
        except SecretsError as err:
            failures.append(f"{secret.where}: {err}")
            return None, "cannot decrypt"
        return encrypt(plain, recipients), f"re-encrypted for {len(recipients)} recipient(s)"

    changes = _transform(files, lambda fields: fields, change)
    if failures:
        raise EditError("nothing was re-encrypted: these values do not decrypt with the identity given:\n"
                        + "\n".join(failures))
    return changes


def write_changes(changes: Sequence[FileChange]) -> int:
    """Write each changed file atomically (same mode); returns how many were written."""
    written = 0
    for change in changes:
        if change.new_text is None:
            continue
        write_atomic(change.path, change.new_text, mode=change.path.stat().st_mode & 0o7777)
        written += 1
    return written


def read_yaml(rel: str, path: Path) -> str:
    """The text of a YAML file to edit or list (through `gitops.safeio`: regular, at most 8 MiB, UTF-8)."""
    try:
        return read_text(path, MAX_FILE_BYTES, name=rel)
    except FileRefused as err:
        raise EditError(str(err)) from None
