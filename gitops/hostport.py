"""An address as URLs and `host:port` write it: an IPv6 address in brackets (RFC 3986), any other as it is."""
from __future__ import annotations


def url_host(address: str) -> str:
    """`address` as the host of a URL or of `host:port`."""
    return f"[{address}]" if ":" in address else address


def host_port(address: str, port: int | str) -> str:
    """`address:port`, `[address]:port` for IPv6."""
    return f"{url_host(address)}:{port}"
