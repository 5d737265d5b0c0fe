"""Work the UI hands to a process of its own: a branch's plan, the parsing of status records. Each runs in a
child of multiprocessing's forkserver, which imported the UI's planning and views once (`PRELOAD`), so a child
starts in milliseconds: its CPU never holds the UI's interpreter lock (/healthz answers however long it runs),
it runs niced (the serving process gets the CPU first), its memory goes back when it ends, and one that
crashes or runs past its time takes only itself."""
from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from gitops.errors import GitopsError

#: what the forkserver imports once, before it forks any child
PRELOAD = ["gitops.ui.app", "gitops.ui.plans"]


def run_isolated(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
    """`fn(*args)` in a child of the forkserver (`fn` and its arguments must pickle; `fn` importable by name):
    its value, or its `GitopsError` (as a `GitopsError` with the same message); any other failure of the
    child is a `RuntimeError` with its traceback. Past `timeout` seconds the child is killed."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # (read when the forkserver starts, the first time)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, fn, args), name="gitops-ui-work", daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise GitopsError(f"{_name(fn)} took more than {timeout:.0f} s; stopped it")
        kind, value = receive.recv()
    except EOFError:
        child.join(5)
        raise GitopsError(f"the process of {_name(fn)} ended without an answer (exit {child.exitcode}: out of "
                          "memory?)") from None
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()
    if kind == "ok":
        return value
    if kind == "error":
        raise GitopsError(value)
    raise RuntimeError(f"the process of {_name(fn)} failed:\n{value}")


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


#: the children's niceness: a plan yields the CPU to the process serving /healthz (the UI, the controller)
NICENESS = 10


def _child(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.nice(NICENESS)
    try:
        answer: tuple[str, Any] = ("ok", fn(*args))
    except GitopsError as err:
        answer = ("error", str(err))
    except BaseException:  # noqa: BLE001 - reported to the parent, which logs it
        answer = ("crash", traceback.format_exc())
    try:
        send.send(answer)
    except Exception:  # noqa: BLE001 - a value that does not pickle
        send.send(("crash", traceback.format_exc()))
    send.close()
