"""Where a CRI runtime listens and how to reach it: all the CRI client needs to know."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CRIEndpoint:
    """One container runtime: a unix socket on this machine, or TCP with mutual TLS.

    `name` only labels errors and logs (gitops passes the hypervisor's name). Exactly one
    of `socket` and `address` is set; the PEM strings only matter for `address`.
    """

    name: str
    socket: str = ""   # unix socket path; no authentication
    address: str = ""  # host:port, over TLS verified against ca_pem
    ca_pem: str = field(default="", repr=False)
    cert_pem: str = field(default="", repr=False)  # client certificate (mutual TLS)
    key_pem: str = field(default="", repr=False)   # its private key

    def __post_init__(self) -> None:
        if bool(self.socket) == bool(self.address):
            raise ValueError(f"CRI endpoint {self.name!r}: set exactly one of socket and address")

    @classmethod
    def unix(cls, name: str, path: str) -> CRIEndpoint:
        return cls(name, socket=path)

    @classmethod
    def tls(cls, name: str, address: str, ca_pem: str, cert_pem: str = "", key_pem: str = "") -> CRIEndpoint:
        return cls(name, address=address, ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem)

    @property
    def target(self) -> str:
        """The gRPC target: `unix:///path` or `host:port`."""
        return f"unix://{self.socket}" if self.socket else self.address
