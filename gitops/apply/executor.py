"""Serial execution of a plan: exactly its actions, in its order, and nothing else.

Apply decides nothing. Each action carries its payload (`gitops.plan.payloads`):
the sandbox and container specs, the certificates to issue, the etcd URLs, the
labels, the approval condition. The only values apply produces are the ones a
plan shows as `(known after apply)`: ids of the pods it creates, public keys
generated on a node (and the service-account bundle made of them), certificates
signed from a node's request, and those files' digests in the spec hash and
annotations of the containers reading them (`CreateContainer.resolved`). The
first failure stops the run with a message naming the action; every action is
safe to repeat, so a re-run after a crash (even SIGKILL) observes what exists
and plans only what is missing.

Each kind of action has one handler, found in `HANDLERS` (`gitops.apply.handlers`), grouped by family in
this package's modules; what they share is a `Run` (`gitops.apply.run`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gitops.apply.handlers import HANDLERS
from gitops.apply.run import ApplyError, Connections, Execution, Fence, Progress, Run, StopRequested
from gitops.errors import GitopsError
from gitops.plan.actions import KINDS, Action, Plan
from gitops.state.records import State
from gitops.state.store import StateStore

__all__ = ["ApplyError", "Connections", "Execution", "Fence", "Progress", "execute"]

log = logging.getLogger(__name__)


def execute(plan: Plan, state: State, connections: Connections, store: StateStore, *,
            progress: Progress | None = None, should_stop: Callable[[], bool] = lambda: False,
            fence: Fence | None = None) -> Execution:
    """Run `plan`'s actions in order against `state` (the plan's recorded state, saved as it changes).
    `fence`: checked before each action; a refusal stops the run there (the call in flight finished)."""
    run = Run(state.copy(), connections, store)
    run.fence, run.should_stop = fence, should_stop
    try:
        return _run(run, plan.actions, should_stop, progress, plan.source)
    finally:
        if run.unsaved:
            run.save()
        run.close()


def _run(run: Run, actions: tuple[Action, ...], should_stop: Callable[[], bool],
         progress: Progress | None, source: str = "") -> Execution:
    outcome = run.outcome
    for index, action in enumerate(actions):
        if should_stop():
            log.info("stop requested; %d of %d actions done", index, len(actions))
            outcome.stopped = True
            return outcome
        refused = run.refused(action)
        if refused:
            log.warning("fenced: %s; %d of %d actions done", refused, index, len(actions))
            outcome.stopped, outcome.fenced = True, refused
            return outcome
        _report(progress, index, len(actions), action, "start")
        _runs(run, action, source)
        began = time.monotonic()
        try:
            expected = KINDS[action.kind].payload
            if action.payload is None:
                raise ApplyError("the action carries no payload (a plan from an older gitops?)")
            if not isinstance(action.payload, expected):  # a saved plan is someone else's file
                raise ApplyError(f"the action carries a {type(action.payload).__name__}, not the "
                                 f"{expected.__name__} a {action.kind.value} action takes")
            HANDLERS[action.kind](run, action, action.payload)
        except StopRequested as err:
            log.info("%s; %d of %d actions done", err, index, len(actions))
            outcome.stopped = True
            return outcome
        except (GitopsError, OSError) as err:
            _report(progress, index, len(actions), action, "failed")
            failed = ApplyError(f"action {index + 1}/{len(actions)} failed: {action.symbol} {action.subject} "
                                f"{action.kind.value}: {err}", outcome.executed)
            failed.seconds = [*outcome.seconds, round(time.monotonic() - began, 3)]
            failed.halted = getattr(err, "halted", None)
            raise failed from None
        outcome.seconds.append(round(time.monotonic() - began, 3))
        outcome.executed.append(action)
        _report(progress, index, len(actions), action, "done")
    return outcome


def _runs(run: Run, action: Action, source: str) -> None:
    """Record that `action`'s cluster now runs commit `source` (saved with the run's next save)."""
    record = run.state.clusters.get(action.cluster) if source else None
    if record is not None and record.commit != source:
        record.commit = source
        run.unsaved = True


def _report(progress: Progress | None, index: int, total: int, action: Action, status: str) -> None:
    log.info("action %s", status, extra={"index": index + 1, "total": total, "kind": action.kind.value,
                                        "subject": action.subject})
    if progress is not None:
        progress(index, total, action, status)
