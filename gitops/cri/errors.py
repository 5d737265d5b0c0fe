"""CRI errors: which endpoint (named after its hypervisor), which call, and why."""
from __future__ import annotations

from enum import Enum

from gitops.errors import GitopsError


class Reason(str, Enum):
    """Why a CRI call failed."""

    UNREACHABLE = "unreachable"        # no connection (refused, no such socket, timeout connecting)
    TLS = "TLS refused"                # handshake failed: certificates, CA or ALPN
    DEADLINE = "deadline exceeded"     # connected, but the runtime did not answer in time
    NOT_FOUND = "not found"            # the runtime does not know the object
    RUNTIME = "runtime error"          # the runtime answered with any other error
    CONFIG = "bad endpoint configuration"  # e.g. unparseable certificates


class CRIError(GitopsError):
    """A failed CRI call on one endpoint; `hypervisor` is the endpoint's name."""

    def __init__(self, hypervisor: str, call: str, reason: Reason, detail: str) -> None:
        self.hypervisor = hypervisor
        self.call = call
        self.reason = reason
        self.detail = detail
        super().__init__(f"hypervisor {hypervisor}: CRI {call}: {reason.value}: {detail}")
