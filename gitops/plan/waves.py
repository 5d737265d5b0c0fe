"""A plan's rollout in waves (`spec.rollout.waves`): each cluster's actions placed in its wave and batch, and
each wave the plan changes watched from its start to the end of its soak (pure).

A wave's `start-wave` action comes before its first action: it writes an object the probe reads back and
starts watching the wave's clusters through their ingress. Its `soak-wave` action comes after its last one:
it watches them `soakSeconds` more and halts the rollout unless each kept the SLO (`gitops.apply.waves`).
The next wave starts only after. Actions of no Cluster of the repo (SIP host labels, a cluster that left
the repo) come before every wave.

A wave the recorded rollout of this very commit shows started and not soaked, and that has nothing left to
do, is soaked again (a controller killed during the soak resumes there: the waves before it stay done).

A batch of several clusters (`maxConcurrent` > 1) is applied at once: each cluster's actions in their order, in
a lane of its own beside the others' (`steps`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gitops.compile.desired import DesiredState
from gitops.model.components import CONTROLPLANE
from gitops.model.config import Rollout, Wave
from gitops.model.resources import RepoModel
from gitops.model.waves import wave_of
from gitops.observe.types import ObservedState
from gitops.plan.actions import Action, Kind
from gitops.plan.payloads import WaveCluster, WaveGate
from gitops.state.records import ROLLING, State


def in_waves(actions: list[Action], model: RepoModel, rollout: Rollout, desired: DesiredState,
             observed: ObservedState, state: State, source: str, timeout: int) -> tuple[list[Action], list[str]]:
    """`actions` with each Cluster's in its wave and batch, and the start and soak of each wave the commit
    `source` reaches clusters in; and the warnings: a rollout of this commit that halted plans nothing of the
    waves after the one that halted.

    A cluster already running `source` (its record says so) is not rolled out again: a repair of the commit in
    force (a component restarted) is ordered by wave but not soaked, and can never halt that commit. A wave the
    record of this rollout shows still rolling gates every cluster of it that runs `source` or changes. A plan
    without a source (a directory, not a commit) soaks every changed cluster and keeps no record."""
    if not rollout.waves:
        return actions, []
    wave = {name: wave_of(cluster.labels, rollout) for name, cluster in model.clusters.items()}
    changed: dict[int, list[str]] = {}
    for action in actions:
        index = wave.get(action.cluster)
        if index is not None and action.cluster not in changed.setdefault(index, []):
            changed[index].append(action.cluster)
    position = {name: i for names in changed.values() for i, name in enumerate(sorted(names))}
    servers: dict[str, list[str]] = {}  # each cluster's own API servers, once a wave is gated
    running = {name: record.commit for name, record in state.clusters.items()}

    def reached(name: str) -> bool:
        return bool(source) and running.get(name) == source

    record = state.rollout if source and state.rollout is not None and state.rollout.commit == source else None
    halted = record.halted if record is not None else None
    recorded = {w.name: w for w in record.waves} if record is not None else {}
    stop = next((i for i, w in enumerate(rollout.waves) if halted and w.name == halted.name), len(rollout.waves))
    warnings = []
    if halted is not None:
        held = sorted({a.cluster for a in actions if (wave.get(a.cluster) or 0) > stop})
        warnings.append(f"the rollout of this commit halted at wave {halted.name} (cluster {halted.breached_cluster}: "
                        f"{halted.breach}): nothing of the waves after it is planned"
                        + (f" ({', '.join(held)} left as they are)" if held else ""))
    out = []
    for action in actions:
        index = wave.get(action.cluster)
        if index is None:
            out.append(action)
            continue
        if index > stop:
            continue
        batch = position[action.cluster] // rollout.waves[index].max_concurrent
        out.append(dataclasses.replace(action, wave=index + 1, batch=batch))
    for index, spec in enumerate(rollout.waves[:stop + 1]):
        names = sorted(changed.get(index, []))
        started = recorded.get(spec.name)
        if started is not None and started.phase == ROLLING:  # stopped on the way: every cluster it reached
            gated = sorted(n for n, i in wave.items() if i == index and n in desired.clusters
                           and (n in names or reached(n)))
        else:
            gated = [n for n in names if not reached(n)]
        if not gated:
            continue
        resumed = not names
        if not servers:
            for pod in desired.pods.values():
                if pod.role == CONTROLPLANE and pod.api_url:
                    servers.setdefault(pod.cluster, []).append(pod.api_url)
        watched = tuple(_watched(n, desired, observed, servers) for n in gated)
        gate = WaveGate(spec.name, source, watched, spec.soak_seconds, rollout.min_success_ratio, timeout)
        last = (len(names) - 1) // spec.max_concurrent if names else 0
        if not resumed:
            out.append(Action(Kind.START_WAVE, "", "", "", spec.name,
                              reason=_members(spec, gated, names, len(rollout.waves), index),
                              details=_start_details(gate, observed), wave=index + 1, payload=gate))
        out.append(Action(Kind.SOAK_WAVE, "", "", "", spec.name,
                          reason=("resumed: this commit's rollout reached this wave and was stopped before its soak "
                                  "ended; " if resumed else "") + f"{spec.soak_seconds}s, then the next wave",
                          details=_soak_details(gate), wave=index + 1, batch=last, payload=gate))
    return out, warnings


def _watched(name: str, desired: DesiredState, observed: ObservedState, servers: dict[str, list[str]]) -> WaveCluster:
    cluster = desired.clusters.get(name)
    seen = observed.clusters.get(name)
    api_servers = tuple(sorted(servers.get(name, ())))
    # no ingress node: the probe goes to a control-plane node's own API server
    server = (cluster.api_endpoint if cluster and cluster.api_endpoint else api_servers[0] if api_servers else "")
    return WaveCluster(name, server, api_servers,
                       tuple(m.client_url for m in cluster.etcd_members) if cluster else (),
                       serving=seen is not None and seen.reachable)


def _members(spec: Wave, gated: list[str], changed: list[str], waves: int, index: int) -> str:
    """The wave's clusters, and the batches applied at once (`steps`) when the plan changes several together."""
    text = f"wave {index + 1} of {waves}: {', '.join(gated)}"
    batches = [changed[i:i + spec.max_concurrent] for i in range(0, len(changed), spec.max_concurrent)]
    if any(len(batch) > 1 for batch in batches):
        text += (f"; applied {spec.max_concurrent} at a time, the clusters of a batch at once: "
                 + ", then ".join(" + ".join(batch) for batch in batches))
    return text


def _start_details(gate: WaveGate, observed: ObservedState) -> tuple[str, ...]:
    out = []
    for c in gate.clusters:
        seen = observed.clusters.get(c.cluster)
        ready = sum(1 for w in seen.workers if w.ready) if seen is not None else 0
        if c.serving:
            out.append(f"{c.cluster}: writes ConfigMap gitops-rollout/sentinel, then reads it and writes through "
                       f"{c.server or '(no ingress)'} until the soak ends; Ready workers now {ready}")
        else:
            out.append(f"{c.cluster}: its API does not answer yet: watched from the soak's start")
    return tuple(out)


def _soak_details(gate: WaveGate) -> tuple[str, ...]:
    return (f"watches {', '.join(c.cluster for c in gate.clusters)} for {gate.soak_seconds}s: through each ingress "
            f"at least {gate.min_success_ratio:g} of the probe's reads and writes succeed (from the wave's start), "
            "every control-plane node answers /readyz, every etcd member is healthy, and no fewer workers are Ready "
            "than at the wave's start",
            "a breach halts the rollout here: no later wave starts, the commit is held like a refused one and the "
            "clusters it reached are put back to the commit in force before (a plan recorded on the status branch)")


def steps(actions: Sequence[Action]) -> list[list[tuple[int, ...]]]:
    """How apply runs the plan `actions`, step after step: each step its lanes, run at the same time, each lane
    plan indices in plan order. A wave's batch that holds several clusters is one step with a lane per cluster;
    every other action is a step of its own, with one lane."""
    out: list[list[tuple[int, ...]]] = []
    batch: dict[str, list[int]] = {}
    at: tuple[int, int] | None = None

    def close() -> None:
        if len(batch) > 1:
            out.append([tuple(lane) for lane in batch.values()])
        else:  # a batch of one cluster: its actions one after another, as before waves
            out.extend([(i,)] for lane in batch.values() for i in lane)
        batch.clear()

    for index, action in enumerate(actions):
        here = (action.wave, action.batch) if action.wave and action.cluster else None
        if here is None or here != at:
            close()
        at = here
        if here is None:
            out.append([(index,)])
        else:
            batch.setdefault(action.cluster, []).append(index)
    close()
    return out
