"""TCP ports for tests: free ones now, and waiting until something listens on one."""
from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable


def free_ports(ip: str, count: int) -> list[int]:
    """`count` distinct ports free on `ip` now (all bound at once, then released)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((ip, 0))
        return [sock.getsockname()[1] for sock in socks]


def free_port(ip: str = "127.0.0.1") -> int:
    return free_ports(ip, 1)[0]


def free_port_in(ip: str, low: int, high: int) -> int:
    """The first port of `low`..`high` nothing listens on at `ip` now (a hypervisor's port range: the
    hypervisor is a machine of its own, so its address is not this host's to bind; a refused connection
    says the port is free)."""
    for port in range(low, high + 1):
        try:
            with socket.create_connection((ip, port), timeout=2):
                continue
        except ConnectionRefusedError:
            return port
        except OSError as err:
            raise AssertionError(f"{ip}:{port} does not answer ({err}): is the machine reachable?") from None
    raise AssertionError(f"no free port on {ip} in {low}-{high}")


def wait_listening(ip: str, port: int, timeout: float = 10, gone: Callable[[], str | None] = lambda: None) -> None:
    """Until something accepts a connection on `ip`:`port`; `gone` says why to stop waiting (the
    server exited), or None to go on."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection((ip, port), timeout=1):
                return
        except OSError:
            why = gone()
            if why:
                raise AssertionError(why) from None
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {ip}:{port} after {timeout}s")
