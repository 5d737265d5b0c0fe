"""Rewrite one scalar value of a YAML file in place, leaving every other byte as it was.

No YAML dumper is involved: the loader records where each mapping value is written
(`Span`), and the new value replaces that text as a literal block scalar (`|`). Comments,
key order, quoting and blank lines elsewhere stay byte-identical, so a pull request shows
only the lines of the value that changed.
"""
from __future__ import annotations

import re

from gitops.errors import GitopsError
from gitops.model.yamlload import Span

_BLOCK_HEADER = re.compile(r"[|>][-+0-9]*")


class EditError(GitopsError):
    """A value that cannot be rewritten in place (the message says why and what to do)."""


def literal_block(text: str, span: Span, value: str) -> str:
    """`text` with the value at `span` replaced by `value` written as a `|` block scalar.

    `value` must end with exactly one newline and have no trailing spaces on its lines
    (an armored age block does); its lines are indented two columns past the key.
    """
    if span.flow:
        raise EditError("the value is inside a flow mapping ({...}), where a block scalar cannot be written: "
                        "write that mapping in block style first")
    if not value.endswith("\n") or value.endswith("\n\n") or any(line != line.rstrip() for line in value.split("\n")):
        raise EditError("internal: a literal block value must end with one newline and have no trailing spaces")
    newline = "\r\n" if "\r\n" in text else "\n"
    indent = " " * (span.key_column + 2)
    body = "".join(indent + line + newline if line else newline for line in value[:-1].split("\n"))
    if span.style in ("|", ">"):
        header_end = _line_end(text, span.start)
        header = text[span.start:header_end]
        rest = header[_BLOCK_HEADER.match(header).end():].rstrip("\r")  # type: ignore[union-attr]
        end = _content_end(text, header_end + 1, span.end)
        return text[:span.start] + "|" + rest + newline + body + text[end:]
    line_end = _line_end(text, span.end)
    rest = text[span.end:line_end].rstrip("\r")  # a trailing comment stays on the header line
    return text[:span.start] + "|" + rest + newline + body + text[line_end + 1:]


def _line_end(text: str, index: int) -> int:
    """Index of the newline ending the line that holds `index` (len(text) on the last line)."""
    found = text.find("\n", index)
    return len(text) if found < 0 else found


def _content_end(text: str, start: int, end: int) -> int:
    """End of a block scalar's last non-blank line (after its newline): blank lines after it stay."""
    last = start
    position = start
    while position < end:
        line_end = min(_line_end(text, position), end)
        if text[position:line_end].strip():
            last = min(line_end + 1, len(text))
        position = line_end + 1
    return last
