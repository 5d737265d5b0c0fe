"""Execution of a plan: exactly its actions, in its order, and nothing else.

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

Actions run one after another, except a rollout wave's batch of several clusters (`maxConcurrent`), whose
clusters the plan applies at once (`gitops.plan.waves.steps`): a thread per cluster, each running that
cluster's actions in their order. A failure, a stop or a fence in one stops the others after the action each
has in flight.

Each kind of action has one handler, found in `HANDLERS` (`gitops.apply.handlers`), grouped by family in
this package's modules; what they share is a `Run` (`gitops.apply.run`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gitops.apply.handlers import HANDLERS
from gitops.apply.run import ApplyError, Connections, Execution, Fence, Progress, Run, StopRequested, Timing
from gitops.apply.waves import keep_counts
from gitops.errors import GitopsError
from gitops.plan.actions import KINDS, Action, Plan
from gitops.plan.waves import steps
from gitops.state.records import State
from gitops.state.store import StateStore

__all__ = ["ApplyError", "Connections", "Execution", "Fence", "Progress", "Timing", "execute"]

log = logging.getLogger(__name__)


def execute(plan: Plan, state: State, connections: Connections, store: StateStore, *,
            progress: Progress | None = None, should_stop: Callable[[], bool] = lambda: False,
            fence: Fence | None = None) -> Execution:
    """Run `plan`'s actions in order against `state` (the plan's recorded state, saved as it changes).
    `fence`: checked before each action; a refusal stops the run there (the call in flight finished)."""
    run = Run(state.copy(), connections, store)
    run.fence, run.should_stop = fence, should_stop
    try:
        return _Steps(run, plan.actions, progress, plan.source).all()
    finally:
        if run.unsaved:
            run.save()
        run.close()


class _Steps:
    """The plan's steps, one after another; the lanes of a step at the same time (`gitops.plan.waves.steps`)."""

    def __init__(self, run: Run, actions: tuple[Action, ...], progress: Progress | None, source: str):
        self.run, self.actions, self.progress, self.source = run, actions, progress, source
        self.began = time.monotonic()
        self.lock = threading.Lock()
        #: set when a lane ends early (failed, stopped, fenced): the others end after the action in flight
        self.ended = threading.Event()
        #: the first failure: (plan index, error)
        self.failure: tuple[int, BaseException] | None = None
        #: what a lane's thread raised that is no action's failure (a bug): raised again once the lanes ended
        self.crashed: BaseException | None = None
        self.failed: dict[int, Timing] = {}

    def all(self) -> Execution:
        """Every step, until the plan's end or a lane ended early; ApplyError for the first action that failed."""
        outcome = self.run.outcome
        for step in steps(self.actions):
            if len(step) == 1:
                self._lane(step[0])
            else:
                lanes = [threading.Thread(target=self._thread, args=(lane,), daemon=True,
                                          name=f"apply-{self.actions[lane[0]].cluster}") for lane in step]
                for lane in lanes:
                    lane.start()
                for lane in lanes:
                    lane.join()
                if self.crashed is not None:
                    raise self.crashed
            if self.ended.is_set():
                break
        if self.failure is not None:
            index, err = self.failure
            action = self.actions[index]
            failed = ApplyError(f"action {index + 1}/{len(self.actions)} failed: {action.symbol} {action.subject} "
                                f"{action.kind.value}: {err}", outcome.executed)
            failed.done, failed.failed = dict(outcome.done), dict(self.failed)
            failed.halted = getattr(err, "halted", None)
            raise failed from None
        return outcome

    def _thread(self, lane: tuple[int, ...]) -> None:
        try:
            self._lane(lane)
        except BaseException as err:  # noqa: BLE001 (raised again in the run's own thread)
            self.crashed = self.crashed or err
            self.ended.set()

    def _lane(self, lane: tuple[int, ...]) -> None:
        for index in lane:
            if self.ended.is_set() or not self._one(index):
                self.ended.set()
                return

    def _one(self, index: int) -> bool:
        """Run the action at `index`: False when the run ends there (stopped, fenced or failed)."""
        run, action, outcome, total = self.run, self.actions[index], self.run.outcome, len(self.actions)
        if run.should_stop():
            log.info("stop requested; %d of %d actions done", len(outcome.done), total)
            outcome.stopped = True
            return False
        refused = run.refused(action)
        if refused:
            log.warning("fenced: %s; %d of %d actions done", refused, len(outcome.done), total)
            outcome.stopped, outcome.fenced = True, refused
            return False
        self._report(index, action, "start")
        self._runs(action)
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
            log.info("%s; %d of %d actions done", err, len(outcome.done), total)
            outcome.stopped = True
            return False
        except (GitopsError, OSError) as err:
            self._report(index, action, "failed")
            with self.lock:
                self.failed[index] = self._timing(began)
                if self.failure is None:
                    self.failure = (index, err)
            return False
        with self.lock:
            outcome.done[index] = self._timing(began)
            outcome.executed.append(action)
        self._report(index, action, "done")
        if run.watches:  # a wave's clusters rolling: what its probe counted so far is kept
            keep_counts(run)
        return True

    def _timing(self, began: float) -> Timing:
        return Timing(round(began - self.began, 3), round(time.monotonic() - began, 3))

    def _runs(self, action: Action) -> None:
        """Record that `action`'s cluster now runs the plan's commit (saved with the run's next save)."""
        record = self.run.state.clusters.get(action.cluster) if self.source else None
        if record is not None and record.commit != self.source:
            with self.run.recording(save=False):
                record.commit = self.source

    def _report(self, index: int, action: Action, status: str) -> None:
        log.info("action %s", status, extra={"index": index + 1, "total": len(self.actions),
                                            "kind": action.kind.value, "subject": action.subject})
        if self.progress is not None:
            with self.lock:
                self.progress(index, len(self.actions), action, status)
