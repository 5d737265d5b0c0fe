"""Apply's handlers of a rollout wave (`gitops.plan.waves`): `start-wave` begins watching the wave's clusters as
their admin, `soak-wave` watches them to the end of the soak and halts the rollout on a breach.

What is watched, per cluster:
- through its ingress, every 0.25 s, a read of the ConfigMap gitops-rollout/sentinel that `start-wave` wrote
  (its commit must read back) or a write of gitops-rollout/probe: the success ratio from the wave's start to the
  end of its soak must reach spec.rollout.slo.minSuccessRatio;
- during the soak, every 2 s: each control-plane node's API server answers /readyz, each etcd member is healthy,
  and no fewer workers are Ready than at the wave's start. One of these failing three checks in a row halts
  the rollout at once (a single blip does not).

The figures and the outcome go to the recorded state (`State.rollout`), saved as they change (the probe's
counts every few seconds, while the wave's clusters roll too: `keep_counts`), so the status branch shows them
and a controller killed during the roll or the soak counts on from there when it rolls or soaks that wave
again.
"""
from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gitops.apply.run import ApplyError, Run, StopRequested
from gitops.errors import GitopsError
from gitops.kubeapi import KubeAPI, node_ready
from gitops.plan.actions import Action
from gitops.plan.payloads import WaveCluster, WaveGate
from gitops.state.records import HALTED, ROLLING, SOAKED, RolloutRecord, WaveRecord

NAMESPACE = "gitops-rollout"
SENTINEL = "sentinel"
PROBE = "probe"
#: seconds between probe requests, and between health checks during the soak
PROBE_EVERY = 0.25
CHECK_EVERY = 2.0
#: consecutive failed health checks that halt the rollout
STRIKES = 3
#: seconds one probe request or health check may take
REQUEST_TIMEOUT = 5.0
#: seconds between saves of the probe's counts while a wave's clusters roll
COUNTS_EVERY = 5.0
_CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


class WaveHalted(ApplyError):
    """A wave breached its SLO: the rollout stops here (`breach` says which cluster, what, against what)."""

    def __init__(self, wave: str, cluster: str, breach: str):
        super().__init__(f"rollout halted at wave {wave}: cluster {cluster}: {breach}")
        self.halted = (wave, cluster, breach)


@dataclass
class Tally:
    requests: int = 0
    failed: int = 0
    #: the first few distinct reasons requests failed
    errors: list[str] = field(default_factory=list)

    def count(self, error: str) -> None:
        self.requests += 1
        if error:
            self.failed += 1
            if error not in self.errors and len(self.errors) < 3:
                self.errors.append(error)


class Probe:
    """Reads of the sentinel and writes through one cluster's ingress, in a thread, until stopped."""

    def __init__(self, api: KubeAPI, commit: str):
        self.api, self.commit = api, commit
        self.tally = Tally()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wave-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        turn = 0
        while not self._stop.is_set():
            began = time.monotonic()
            self.tally.count(self._write(turn) if turn % 2 else self._read())
            turn += 1
            self._stop.wait(max(0.0, PROBE_EVERY - (time.monotonic() - began)))

    def _read(self) -> str:
        try:
            found = self.api.get(f"{_CONFIGMAPS}/{SENTINEL}")
        except GitopsError as err:
            return str(err)
        if found is None:
            return f"ConfigMap {NAMESPACE}/{SENTINEL}, written at the wave's start, is gone"
        if (found.get("data") or {}).get("commit") != self.commit:
            return f"ConfigMap {NAMESPACE}/{SENTINEL} no longer reads as written"
        return ""

    def _write(self, turn: int) -> str:
        try:
            self.api.apply(_CONFIGMAPS, _configmap(PROBE, {"commit": self.commit, "turn": str(turn)}))
        except GitopsError as err:
            return str(err)
        return ""

    def stop(self) -> Tally:
        self._stop.set()
        self._thread.join()
        self.api.close()
        return self.tally


@dataclass
class Watch:
    """One wave's probes, by cluster (closed with the run, whatever happens), and the requests and failures
    recorded before each probe began (a run stopped on the way counted them)."""

    probes: dict[str, Probe] = field(default_factory=dict)
    base: dict[str, tuple[int, int]] = field(default_factory=dict)
    saved: float = field(default_factory=time.monotonic)

    def stop(self) -> dict[str, Tally]:
        return {name: probe.stop() for name, probe in self.probes.items()}


def start_wave(run: Run, action: Action, p: WaveGate) -> None:
    """Record the wave as rolling, write each answering cluster's sentinel, count its Ready workers and start
    probing it."""
    found = _rollout(run, p.commit).wave(p.wave)
    # started again after a stop on the way: what it measured of the clusters it reached is kept
    wave = found if found is not None and found.phase == ROLLING else WaveRecord(p.wave, ROLLING, started=_now())
    watch = run.watches.setdefault(p.wave, Watch())
    for c in p.clusters:
        if c.serving:
            try:
                wave.figures.setdefault(c.cluster, {})["workers_ready_before"] = _begin(run, watch, c, p, wave)
            except ApplyError as err:  # nothing of the wave changed yet: a failure to retry, not a breach
                raise ApplyError(f"wave {p.wave}: cluster {c.cluster}: {err}") from None
    _put(run, p.commit, wave)


def soak_wave(run: Run, action: Action, p: WaveGate) -> None:
    """Watch the wave's clusters `soak_seconds` (a cluster not probed yet from now), then judge: WaveHalted on a
    breach, else the wave is recorded as soaked."""
    record = _rollout(run, p.commit)
    wave = record.wave(p.wave) or WaveRecord(p.wave, ROLLING, started=_now())
    watch = run.watches.setdefault(p.wave, Watch())
    breach: tuple[str, str] | None = None
    for c in p.clusters:
        if c.cluster not in watch.probes:
            try:
                before = _begin(run, watch, c, p, wave)
            except ApplyError as err:  # the wave's changes are made: a cluster that cannot be watched breaches
                breach = (c.cluster, str(err))
                before = 0
            wave.figures.setdefault(c.cluster, {}).setdefault("workers_ready_before", before)
    _put(run, p.commit, wave)
    # requests counted before a stop on the way (a resumed soak adds to them: the ratio is from the wave's start)
    base = {c.cluster: watch.base.get(c.cluster) or _counted(wave.figures[c.cluster]) for c in p.clusters}
    checks: dict[str, _Checks] = {}
    began = time.monotonic()
    deadline = began + p.soak_seconds
    rounds = 0
    try:
        checks.update((c.cluster, _Checks(run, action, c, p)) for c in p.clusters)
        while breach is None:
            for c in p.clusters:
                before = int(wave.figures[c.cluster]["workers_ready_before"])
                why = checks[c.cluster].check(before)
                if why:
                    breach = (c.cluster, why)
                    break
            rounds += 1
            if rounds % 5 == 0:  # a controller killed in the soak keeps what was counted
                _count(wave, base, watch)
                _put(run, p.commit, wave, progress=True)
            left = deadline - time.monotonic()
            # a check failing at the deadline is watched on until it clears or breaches (a short soak too)
            if breach is not None or (left <= 0 and not any(one.strikes for one in checks.values())):
                break
            refused = run.refused(action)
            if refused:
                raise ApplyError(f"fenced while soaking wave {p.wave}: {refused}")
            if run.should_stop():
                raise StopRequested(f"stop requested while soaking wave {p.wave}")
            time.sleep(min(CHECK_EVERY, left) if left > 0 else CHECK_EVERY)
    finally:
        tallies = run.watches.pop(p.wave, watch).stop()
        for one in checks.values():
            one.close()
    _count(wave, base, watch, tallies)
    for c in p.clusters:
        figures = wave.figures[c.cluster]
        tally = tallies.get(c.cluster, Tally())
        requests, failed = int(figures["requests"]), int(figures["failed"])
        ratio = (requests - failed) / requests if requests else None
        figures.update({"success_ratio": round(ratio, 6) if ratio is not None else "none",
                        "workers_ready_min": checks[c.cluster].workers_min if c.cluster in checks else "none",
                        "soak_seconds": round(time.monotonic() - began, 1)})
        if tally.errors:
            figures["first_errors"] = " | ".join(tally.errors)[:500]
        if breach is None and ratio is None and c.server:
            breach = (c.cluster, f"no probe request reached {c.server}")
        if breach is None and ratio is not None and ratio < p.min_success_ratio:
            breach = (c.cluster, f"success ratio {ratio:.4f} < {p.min_success_ratio:g}: {failed} of "
                                 f"{requests} probe requests through its ingress failed ("
                                 f"{tally.errors[0] if tally.errors else 'no reason given'})")
    wave.ended = _now()
    if breach is not None:
        wave.phase, wave.breached_cluster, wave.breach = HALTED, breach[0], breach[1]
        _put(run, p.commit, wave)
        raise WaveHalted(p.wave, *breach)
    wave.phase = SOAKED
    _put(run, p.commit, wave)


def keep_counts(run: Run) -> None:
    """While a wave's clusters roll (between its start and its soak): the probe's counts so far into the
    recorded wave, saved every COUNTS_EVERY seconds as progress (`Run.save_progress`: a controller killed on
    the way counts on from them)."""
    record = run.state.rollout
    for name, watch in list(run.watches.items()):
        wave = record.wave(name) if record is not None else None
        if wave is None or time.monotonic() - watch.saved < COUNTS_EVERY:
            continue
        with run.recording(save=False):
            _count(wave, watch.base, watch)
        run.save_progress()
        watch.saved = time.monotonic()


def _counted(figures: dict[str, Any]) -> tuple[int, int]:
    return int(figures.get("requests", 0)), int(figures.get("failed", 0))


def _count(wave: WaveRecord, base: dict[str, tuple[int, int]], watch: Watch,
           tallies: dict[str, Tally] | None = None) -> None:
    """Each cluster's requests and failures so far into the wave's figures: those before a stop on the way
    (`base`) and the probes' (`tallies` once stopped, else as they run)."""
    for name, (requests, failed) in base.items():
        tally = (tallies or {}).get(name) or (watch.probes[name].tally if name in watch.probes else Tally())
        wave.figures[name].update({"requests": requests + tally.requests, "failed": failed + tally.failed})


class _Checks:
    """One cluster's health checks during a soak, with the failures in a row of each."""

    def __init__(self, run: Run, action: Action, c: WaveCluster, p: WaveGate):
        self.api = run.api(c.cluster, c.server) if c.server else None
        self.servers = {url: run.api(c.cluster, url, REQUEST_TIMEOUT) for url in c.api_servers}
        self.etcd = run.etcd(action, c.etcd_members, c.cluster) if c.etcd_members else None
        self.members = c.etcd_members
        self.strikes: dict[str, int] = {}
        self.workers_min: int | str = "none"

    def check(self, before: int) -> str:
        """Why the cluster breaches now ("" when it does not), once a check failed STRIKES times in a row."""
        problems: dict[str, str] = {}
        for url, api in self.servers.items():
            why = api.not_ready("/readyz")
            if why:
                problems[f"api {url}"] = f"the API server at {url} is not ready ({why})"
        for url in self.members:
            why = self.etcd.unhealthy(url) if self.etcd is not None else ""
            if why:
                problems[f"etcd {url}"] = f"etcd member {url} is not healthy ({why})"
        ready = self._ready_workers()
        if ready is not None:
            self.workers_min = ready if isinstance(self.workers_min, str) else min(self.workers_min, ready)
            if ready < before:
                problems["workers"] = f"{ready} Ready workers, fewer than the {before} at the wave's start"
        self.strikes = {key: self.strikes.get(key, 0) + 1 for key in problems}
        worst = [key for key, n in self.strikes.items() if n >= STRIKES]
        return f"{problems[worst[0]]}, {STRIKES} checks in a row" if worst else ""

    def _ready_workers(self) -> int | None:
        if self.api is None:
            return None
        try:
            nodes = self.api.list("/api/v1/nodes")
        except GitopsError:
            return None  # (the probe counts the API's failures)
        return _ready(nodes)

    def close(self) -> None:
        for api in [*self.servers.values(), *([self.api] if self.api else [])]:
            api.close()


def _begin(run: Run, watch: Watch, c: WaveCluster, p: WaveGate, wave: WaveRecord) -> int:
    """Write the cluster's sentinel, start its probe (counting on from what `wave` recorded); its Ready workers
    now."""
    api = run.api(c.cluster, c.server)
    try:
        api.apply("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        api.apply(_CONFIGMAPS, _configmap(SENTINEL, {"commit": p.commit, "wave": p.wave}))
        nodes = api.list("/api/v1/nodes")
    except GitopsError as err:
        api.close()
        raise ApplyError(f"its API cannot be watched through {c.server}: {err}") from None
    api.close()
    watch.base[c.cluster] = _counted(wave.figures.get(c.cluster, {}))
    watch.probes[c.cluster] = Probe(run.api(c.cluster, c.server, fresh_connections=True), p.commit)
    return _ready(nodes)


def _ready(nodes: list[dict[str, Any]]) -> int:
    """How many of the API's Nodes (workers: control planes run as pods) are Ready."""
    return sum(1 for n in nodes if node_ready(n))


def _configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE,
                                                                  "labels": {"app.kubernetes.io/managed-by": "gitops"}},
            "data": data}


def _rollout(run: Run, commit: str) -> RolloutRecord:
    """The recorded rollout of `commit` (a new one replaces another commit's)."""
    if run.state.rollout is None or run.state.rollout.commit != commit:
        run.state.rollout = RolloutRecord(commit)
    return run.state.rollout


def _put(run: Run, commit: str, wave: WaveRecord, progress: bool = False) -> None:
    """`wave` into the recorded rollout of `commit`, saved (`progress`: only its counts changed)."""
    record = _rollout(run, commit)
    names = [w.name for w in record.waves]
    if wave.name in names:
        record.waves[names.index(wave.name)] = wave
    else:
        record.waves.append(wave)
    if progress:
        run.save_progress()
    else:
        run.save()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
