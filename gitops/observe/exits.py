"""Exited control-plane components, seen within a second, as a kubelet sees them (issue #44.4).

A controller-manager or scheduler exits when it loses its Lease (its API server away longer than its
renewal deadline, during a roll or a partition); an API server or the ingress's haproxy or keepalived may
crash. Waiting for the next poll leaves them down for up to an interval. `ExitWatch` lists each
hypervisor's exited gitops containers every `interval` seconds (one `ListContainers` per hypervisor,
filtered by the runtime to exited ones of gitops) and calls `wake` when one of the components below has
exited: the controller then reconciles at once, and its plan recreates the container ("recreate container:
container is exited"), recorded on the status branch like every apply. So the restart is a plan, not a
decision of this watch.

Bounded and backed off like a kubelet's CrashLoopBackOff: the first exit of a component wakes the
controller at once; each further exit of the same component waits twice as long as the one before
(10 s, 20 s, ... at most `MAX_BACKOFF`) until it has stayed up `RESET_AFTER` seconds; the regular poll
still runs on its own interval. Each exit seen is counted (`gitops_component_exits_total`) and the wait before the next wake is
exported (`gitops_component_restart_backoff_seconds`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from gitops.cri.client import CRIClient
from gitops.cri.errors import CRIError
from gitops.cri.types import ContainerState
from gitops.logs import event
from gitops.model.components import APISERVER, CONTROLLER_MANAGER, HAPROXY, KEEPALIVED, SCHEDULER
from gitops.model.resources import Hypervisor
from gitops.pods import CLUSTER, COMPONENT, MANAGED, MANAGER, NODE

log = logging.getLogger(__name__)

#: the components restarted as a kubelet would (restartPolicy: Always); etcd's restarts stay the plan's,
#: gated one member at a time
WATCHED = frozenset({APISERVER, CONTROLLER_MANAGER, SCHEDULER, HAPROXY, KEEPALIVED})
FIRST_BACKOFF, MAX_BACKOFF, RESET_AFTER = 10.0, 300.0, 600.0


@dataclass
class Backoff:
    """When one component (hypervisor, node, component) may wake the controller next."""

    exits: list[float] = field(default_factory=list)

    def wait(self, now: float) -> float:
        """Seconds to wait from `now` before the next wake (0: at once)."""
        if self.exits and now - self.exits[-1] >= RESET_AFTER:
            self.exits = []  # quiet for long enough: start over
        if not self.exits:
            return 0.0
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** min(len(self.exits) - 1, 16))
        return max(0.0, self.exits[-1] + delay - now)


class ExitWatch(threading.Thread):
    """Every `interval` s: the exited WATCHED containers of `hypervisors()`; `wake(reason)` for new ones."""

    def __init__(self, hypervisors: Callable[[], list[Hypervisor]], wake: Callable[[str], None],
                 interval: float = 1.0, registry: CollectorRegistry | None = None):
        super().__init__(daemon=True, name="exit-watch")
        self.hypervisors, self.wake, self.interval = hypervisors, wake, interval
        self.stopping = threading.Event()
        self._seen: set[str] = set()  # exited container ids already counted
        self._backoff: dict[tuple[str, str, str], Backoff] = {}
        self._pending: dict[tuple[str, str, str], float] = {}  # key -> when its wake is due
        registry = registry or CollectorRegistry()
        self.exits = Counter("gitops_component_exits_total", "Control-plane containers seen exited (each once).",
                             ["cluster", "node", "component"], registry=registry)
        self.backoff = Gauge("gitops_component_restart_backoff_seconds",
                             "Seconds before an exited component wakes the controller again (0: at once).",
                             ["cluster", "node", "component"], registry=registry)

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad round; the poll still runs
                log.exception("exit watch round failed")

    def stop(self) -> None:
        self.stopping.set()

    def exited(self, hv: Hypervisor) -> list:  # type: ignore[type-arg]
        try:
            with CRIClient(hv.cri_endpoint(), timeout=2) as client:
                return [c for c in client.list_containers({MANAGED: MANAGER}, state=ContainerState.EXITED)
                        if c.labels.get(COMPONENT) in WATCHED]
        except (CRIError, ValueError, OSError):
            return []  # unreachable: the poll reports it

    def check(self, now: float | None = None) -> list[str]:
        """One round; the reasons it woke the controller with (tests call it directly)."""
        woke: list[str] = []
        exited_now: set[str] = set()
        keys_now: set[tuple[str, str, str]] = set()
        for hv in self.hypervisors():
            for c in self.exited(hv):
                exited_now.add(c.id)
                key = (hv.name, c.labels.get(NODE, ""), c.labels.get(COMPONENT, ""))
                keys_now.add(key)
                labels = {"cluster": c.labels.get(CLUSTER, ""), "node": key[1], "component": key[2]}
                now = time.monotonic() if now is None else now
                if c.id not in self._seen:
                    self._seen.add(c.id)
                    self.exits.labels(**labels).inc()
                    backoff = self._backoff.setdefault(key, Backoff())
                    due = now + backoff.wait(now)
                    backoff.exits = backoff.exits[-16:] + [now]
                    self._pending[key] = min(self._pending.get(key, due), due)
                    event(log, logging.WARNING, "component exited", hypervisor=hv.name, node=key[1],
                          component=key[2], exit_code=c.exit_code, wake_in=round(due - now, 1))
                due = self._pending.get(key)
                self.backoff.labels(**labels).set(max(0.0, (due or now) - now))
                if due is not None and due <= now:
                    del self._pending[key]
                    woke.append(f"{key[2]} of {key[1]} on {hv.name} exited")
        self._seen &= exited_now  # a recreated one is gone from the list; forget it
        for key in set(self._pending) - keys_now:
            del self._pending[key]  # restarted meanwhile (by a poll): nothing to wake for
        for reason in woke:
            self.wake(reason)
        return woke
