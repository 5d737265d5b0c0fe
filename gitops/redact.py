"""Credentials out of text: the userinfo of every URL in it goes (`https://user:token@host/x` becomes
`https://host/x`). Apply it to whatever is printed, logged or rendered that may hold a repo URL: the URL itself,
an error quoting it (git's command lines and messages), a traceback."""
from __future__ import annotations

import re

#: `scheme://`, then the userinfo: everything up to the authority's last `@` (greedy, so a password holding an
#: unescaped `@` goes whole), never past the authority's end (`/`, `?`, `#`) or a space
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#]*@")


def redact(text: str) -> str:
    """`text` with the userinfo of every `scheme://user:password@host` URL in it removed."""
    return _USERINFO.sub(r"\1", text)
