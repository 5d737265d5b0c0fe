#!/usr/bin/env python3
"""Plan fingerprints: one digest per day-2 scenario, to show a refactor leaves every plan byte-identical.

Builds the converged fleet of `plan_scale.py` (its cached state and observed snapshot, so every
run plans from the same certificates and keys), derives scenarios from it by changing the model,
the observed state or the clock, plans each one, and prints, per scenario, the number of actions
and a digest of the plan (every action with its payload, warnings, unknowns, notes) and of the
planned state. Run it before and after a change that must not change behaviour and compare:

    .venv/bin/python benchmarks/plan_fingerprints.py > /tmp/before.json
    # ... the change ...
    .venv/bin/python benchmarks/plan_fingerprints.py > /tmp/after.json && diff /tmp/before.json /tmp/after.json

The cache entry is keyed by the sources of compile, observe, state and pki among others (`plan_scale.py`'s
HASHED_SOURCES), and a new entry has new keys and certificates: after a change there, plan both runs from
the entry the first one names (`--entry DIR`, printed on stderr) so both read the same state.

A change of the plan or state format itself (a new payload field) changes the digests on
purpose; `--show NAME` prints that scenario's plan as JSON to see what moved.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "benchmarks")]

import plan_scale  # noqa: E402

from gitops.engine import make_plan  # noqa: E402
from gitops.model.resources import RepoModel  # noqa: E402
from gitops.model.validate import validate_repo  # noqa: E402
from gitops.observe.types import ObservedHypervisor, ObservedPod, ObservedState  # noqa: E402
from gitops.plan.render import render_json  # noqa: E402
from gitops.state.records import State  # noqa: E402

Scenario = Callable[[RepoModel, State, ObservedState], tuple[RepoModel, State, ObservedState, dt.datetime]]


def _pods(observed: ObservedState, change: Callable[[ObservedPod], ObservedPod | None],
          which: Callable[[ObservedPod], bool]) -> ObservedState:
    """`observed` with the first pod (by node name) that `which` selects changed (None: removed)."""
    [target] = sorted((p for p in observed.pods() if which(p)), key=lambda p: p.node)[:1]
    hvs = {}
    for name, hv in observed.hypervisors.items():
        pods = tuple(q for q in (change(p) if p is target else p for p in hv.pods) if q is not None)
        hvs[name] = dataclasses.replace(hv, pods=pods)
    return dataclasses.replace(observed, hypervisors=hvs)


def _containers(pod: ObservedPod, change: Callable) -> ObservedPod:
    return dataclasses.replace(pod, containers=tuple(c for c in map(change, pod.containers) if c is not None))


def _cluster(model: RepoModel, **changes) -> RepoModel:
    name = sorted(model.clusters)[len(model.clusters) // 2]
    return dataclasses.replace(model, clusters={**model.clusters, name: dataclasses.replace(model.clusters[name],
                                                                                            **changes)})


def scenarios(model: RepoModel) -> dict[str, Scenario]:
    now = plan_scale.NOW
    middle = sorted(model.clusters)[len(model.clusters) // 2]
    cp = lambda p: p.cluster == middle and p.role == "controlplane"  # noqa: E731
    first_node = sorted(n for n in model.nodes if model.nodes[n].cluster == middle)[0]
    private = sorted(h for h in model.hypervisors if "private" in h)

    def moved(m: RepoModel) -> RepoModel:
        node = m.nodes[first_node]
        other = next(h for h in private if h != node.hypervisor)
        return dataclasses.replace(m, nodes={**m.nodes, first_node: dataclasses.replace(node, hypervisor=other)})

    return {
        "converged": lambda m, s, o: (m, s, o, now),
        "etcd-image": lambda m, s, o: (plan_scale.changed_model(m, middle, "registry.example.com/etcd:next"), s, o,
                                       now),
        "api-server-flag": lambda m, s, o: (_cluster(m, api_server_args=(("event-ttl", "2h0m0s"),)), s, o, now),
        "renewal-window": lambda m, s, o: (m, s, o, now + dt.timedelta(days=340)),
        "container-removed": lambda m, s, o: (m, s, _pods(o, lambda p: _containers(
            p, lambda c: None if c.component == "kube-scheduler" else c), cp), now),
        "container-exited": lambda m, s, o: (m, s, _pods(o, lambda p: _containers(
            p, lambda c: dataclasses.replace(c, state="exited") if c.component == "etcd" else c), cp), now),
        "pod-missing": lambda m, s, o: (m, s, _pods(o, lambda p: None, cp), now),
        "sandbox-not-ready": lambda m, s, o: (m, s, _pods(o, lambda p: dataclasses.replace(p, ready=False), cp), now),
        "files-agent-dead": lambda m, s, o: (m, s, _pods(o, lambda p: _containers(dataclasses.replace(
            p, files=None), lambda c: dataclasses.replace(c, state="exited") if c.component == "files" else c), cp),
            now),
        "file-changed": lambda m, s, o: (m, s, _pods(o, lambda p: dataclasses.replace(p, files=dataclasses.replace(
            p.files, digests={k: "0" * 12 for k in p.files.digests})), cp), now),
        "hypervisor-unreachable": lambda m, s, o: (m, s, dataclasses.replace(o, hypervisors={
            **o.hypervisors, private[0]: ObservedHypervisor(private[0], False, "CRI: unreachable")}), now),
        "node-left": lambda m, s, o: (dataclasses.replace(m, nodes={k: v for k, v in m.nodes.items()
                                                                    if k != first_node}), s, o, now),
        "node-moved": lambda m, s, o: (moved(m), s, o, now),
        "cluster-left": lambda m, s, o: (dataclasses.replace(
            m, clusters={k: v for k, v in m.clusters.items() if k != middle},
            nodes={k: v for k, v in m.nodes.items() if v.cluster != middle}), s, o, now),
    }


def fingerprint(model: RepoModel, config, state: State, observed: ObservedState,
                now: dt.datetime) -> dict[str, object]:
    planned = make_plan(model, config, state, observed, now=now)
    plan = render_json(planned.plan)
    # keys and certificates the plan makes (a renewal's new admin credential) differ from run to run
    planned_state = re.sub(r"-----BEGIN [A-Z ]+-----[^-]+-----END [A-Z ]+-----", "<PEM>",
                           json.dumps(planned.state.to_dict(), sort_keys=True))
    return {"actions": len(planned.plan.actions), "unknowns": len(planned.plan.unknowns),
            "plan": hashlib.sha256(plan.encode()).hexdigest()[:16],
            "state": hashlib.sha256(planned_state.encode()).hexdigest()[:16]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=30)
    ap.add_argument("--hypervisors", type=int, default=10)
    ap.add_argument("--cache-dir", type=Path, default=Path(__file__).resolve().parent / ".cache")
    ap.add_argument("--show", metavar="NAME", help="print that scenario's plan as JSON instead")
    ap.add_argument("--entry", type=Path, metavar="DIR",
                    help="plan from this cache entry (a directory of --cache-dir) instead of the one keyed by the "
                         "current sources: the same state and keys before and after a change of compile")
    args = ap.parse_args(argv)
    p = plan_scale.Params(args.clusters, args.hypervisors)
    with tempfile.TemporaryDirectory(prefix="gitops-fingerprints-") as tmp:
        root = Path(tmp) / "repo"
        plan_scale.write_repo(root, p)
        validation = validate_repo(root)
        assert validation.model is not None, validation.diagnostics[:5]
        model, config = validation.model, validation.repo.config
        entry = args.entry or plan_scale.ensure_cache(model, p, args.cache_dir, False, 2)[0]
        print(f"planning from {entry}", file=sys.stderr)
        state = State.from_dict(json.loads((entry / "state.json").read_text()))
        observed = plan_scale.load_observed(entry)
        out = {}
        for name, scenario in scenarios(model).items():
            m, s, o, now = scenario(model, state.copy(), observed)
            if args.show == name:
                print(render_json(make_plan(m, config, s, o, now=now).plan))
                return 0
            out[name] = fingerprint(m, config, s, o, now)
            print(f"{name}: {out[name]}", file=sys.stderr)
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
