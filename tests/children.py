"""Processes a test starts: stopped for sure, politely first."""
from __future__ import annotations

import subprocess


def stop_all(procs: list[subprocess.Popen], timeout: float = 15) -> None:
    """SIGTERM each, wait up to `timeout` seconds each, SIGKILL what is left; every one reaped."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
