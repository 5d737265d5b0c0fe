"""Typed views of validated repo documents.

The loader keeps raw documents (with file/line positions); once a repo has
validated, the rest of the pipeline works only with these frozen dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LocalCRIEndpoint:
    """A CRI unix socket on this machine (development, labs)."""

    path: str

    @property
    def target(self) -> str:
        return f"unix://{self.path}"


@dataclass(frozen=True)
class RemoteCRIEndpoint:
    """A CRI endpoint over TCP with mutual TLS (PEM strings)."""

    uri: str
    ca_certificate: str
    client_certificate: str
    client_private_key: str

    @property
    def target(self) -> str:
        """`host:port` as gRPC wants it (a leading `tcp://` is accepted in the repo)."""
        return self.uri.removeprefix("tcp://").rstrip("/")


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __len__(self) -> int:
        return self.high - self.low + 1


@dataclass(frozen=True)
class Hypervisor:
    name: str
    public: bool
    ip_address: str
    port_range: PortRange
    endpoint: LocalCRIEndpoint | RemoteCRIEndpoint
    labels: dict[str, str] = field(default_factory=dict, compare=False)
