"""The crash-point harness's pure parts (tests/crashpoints.py, benchmarks/crash_points.py): where it
kills, and how an exploration resumed from an earlier run's rows knows a point it already explored."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from crashpoints import KillPoint, action_text, kill_points, point_key

ROOT = Path(__file__).resolve().parent.parent


def _benchmark():
    spec = importlib.util.spec_from_file_location("crash_points_bench", ROOT / "benchmarks/crash_points.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_point_is_the_same_point_in_another_run_whatever_its_measured_delay() -> None:
    assert KillPoint(inside=4, delay=5.0).key == KillPoint(inside=4, delay=0.3).key == "in 4"
    assert KillPoint(after=12).key == point_key("after 12") == "after 12"
    waited = KillPoint(inside=5, what="its new etcd runs")
    assert waited.key == point_key("in 5 (its new etcd runs)") != KillPoint(inside=5).key


def test_an_action_of_a_cluster_made_anew_each_cycle_is_the_same_action_in_every_cycle() -> None:
    first = {"kind": "recreate-container", "cluster": "upgrade-cycle1", "node": "upgrade-cycle1-cp-2",
             "component": "etcd"}
    later = {**first, "cluster": "upgrade-cycle12", "node": "upgrade-cycle12-cp-2"}
    assert action_text(first) == action_text(later) == "recreate-container upgrade-cycle*/upgrade-cycle*-cp-2/etcd"
    assert action_text({**first, "node": "upgrade-cycle1-cp-3"}) != action_text(first)
    assert action_text({"kind": "write-files", "cluster": "team-a", "node": "team-a-cp-1"}) == \
        "write-files team-a/team-a-cp-1"


def test_kill_points_are_after_each_action_then_inside_each_gated_one() -> None:
    actions = [{"kind": "write-files", "details": []},
               {"kind": "recreate-container", "component": "etcd", "details": ["waits until it is healthy"]},
               {"kind": "sign-certificate-request", "details": []}]
    points = kill_points(actions, {2: 3.0})
    labels = [p.label for p in points]
    assert labels[:3] == ["after 1", "after 2", "after 3"]
    inside = [p for p in points if p.inside]
    assert [(p.inside, p.what) for p in inside] == [(2, ""), (2, "its new etcd runs"), (3, "")]
    assert inside[0].delay == 1.5 and inside[2].delay == 1.0  # half the measured time; 2 s when not measured


def test_resume_skips_only_points_that_converged(tmp_path: Path) -> None:
    rows = [{"scenario": "scale-3-1-3", "variant": "3->1", "point": "in 4 +5.0s", "outcome": "converged",
             "action": "etcd-member-remove team-a/team-a-cp-3"},
            {"scenario": "scale-3-1-3", "variant": "1->3", "point": "after 2", "outcome": "converged",
             "action": "create-pod team-a/team-a-cp-3"},
            {"scenario": "scale-3-1-3", "variant": "1->3", "point": "after 3", "outcome": "FAILED: not converged",
             "action": "generate-keys team-a/team-a-cp-2"}]
    log = tmp_path / "run.log"
    log.write_text("lab up ...\nscale-3-1-3 round 1 ...\n" + json.dumps({"rows": rows}) + "\n")
    done = _benchmark().explored([log])
    assert done == {"scale-3-1-3": {("3->1", "in 4", "etcd-member-remove team-a/team-a-cp-3"),
                                    ("1->3", "after 2", "create-pod team-a/team-a-cp-3")}}
    log.write_text(json.dumps({"rows": [{"scenario": "scale-3-1-3", "outcome": "converged"}]}) + "\n")
    with pytest.raises(SystemExit, match="a row without"):
        _benchmark().explored([log])
    cut = tmp_path / "cut.log"
    cut.write_text("lab up ...\ninterrupted before the JSON line\n")
    with pytest.raises(SystemExit, match="not the JSON object"):
        _benchmark().explored([cut])


def _line(at: float, index: int, sign: str, subject: str, verb: str, took: float):
    from crashpoints import Line
    return Line(at, f"[{index}/9] {sign} {subject} {verb} ... done ({took:.1f}s)", index, took)


def test_a_leaving_api_servers_window_ends_when_the_ingress_is_replaced_without_it() -> None:
    """A probe failure is excused only while an API server is stopped: one stopped and started again, from
    the stop's start to the start's end; one that leaves, until the ingress's haproxy is replaced without
    it (not to the end of the run, which excused real failures in a resumed node replacement)."""
    from crashpoints import Line, _stopped_windows
    killed = [_line(10, 1, "-", "team-a/team-a-cp-3/kube-apiserver", "remove container: its member leaves", 1.0),
              _line(15, 2, "-", "team-a/team-a-cp-1/kube-apiserver", "remove container: its member changes", 2.0),
              Line(16, "(killed)")]
    rerun = [_line(30, 1, "+", "team-a/team-a-cp-1/kube-apiserver", "create container: starts again", 4.0),
             _line(40, 2, "~", "team-a/team-a-ingress/haproxy", "recreate container: spec changed", 3.0),
             _line(50, 3, "~", "team-a/team-a-cp-2/kube-controller-manager", "recreate container: x", 1.0)]
    windows = sorted(_stopped_windows([killed, rerun], None, until=60.0))
    assert windows == [(9.0, 40, "team-a-cp-3"), (13.0, 30, "team-a-cp-1")]
    without_ingress = sorted(_stopped_windows([killed, rerun[:1]], None, until=60.0))
    assert without_ingress == [(9.0, 60.0, "team-a-cp-3"), (13.0, 30, "team-a-cp-1")]
