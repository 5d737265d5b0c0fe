"""`gitops plan --detailed-exitcode`: 0 no changes, 2 changes, 3 incomplete (something unobserved), 1 error.

The first test drives the real command (installed console script, real observation) against
hypervisors whose CRI sockets do not exist; the others run the click command with observation
replaced by hand-built observed states, to cover changes with and without unknowns.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from repo_helpers import EXAMPLE_REPO, minimal_repo
from test_plan_diff import private_2_down, settle

from gitops.cli import cli
from gitops.cli import reconcile as plan_cli
from gitops.model.validate import validate_repo
from gitops.state import LocalDirStore, State
from gitops.state.records import NodeRecord

INCOMPLETE = "Incomplete: 2 hypervisors could not be observed."


def test_unreachable_hypervisors_exit_3_in_every_rendering_through_the_installed_command(tmp_path):
    gitops = shutil.which("gitops", path=str(Path(sys.executable).parent))
    assert gitops, "the gitops console script is not installed next to this python"
    repo = minimal_repo(tmp_path / "repo")
    for name in ("hv-1", "edge-1"):  # sockets that do not exist: unreachable without any lab
        hv = (repo / "hypervisors.yaml").read_text().replace(f"/run/{name}.sock", str(tmp_path / f"{name}.sock"))
        (repo / "hypervisors.yaml").write_text(hv)
    state_dir = tmp_path / "state"
    # both nodes were placed by an earlier apply: the plan must name them as not checked
    LocalDirStore(state_dir).save(State(nodes={"c1-cp-1": NodeRecord("c1", "hv-1"),
                                               "c1-ingress": NodeRecord("c1", "edge-1")}))
    base = [gitops, "plan", str(repo), "--state-dir", str(state_dir)]
    variants = {"text": [], "markdown": ["--format", "markdown"], "json": ["-o", "json"]}
    # observation retries for a few seconds: run the renderings side by side
    procs = {k: subprocess.Popen(base + extra + ["--detailed-exitcode"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, extra in variants.items()}
    plain = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {k: p.communicate(timeout=120) for k, p in procs.items()}
    assert {k: p.returncode for k, p in procs.items()} == {"text": 3, "markdown": 3, "json": 3}, out
    plain_out, _ = plain.communicate(timeout=120)
    assert plain.returncode == 0  # without --detailed-exitcode a plan that ran exits 0, as before

    text = out["text"][0]
    assert text.splitlines()[0] == f"No changes in what could be checked. {INCOMPLETE}"
    assert "? Unknown: hypervisor hv-1 is unreachable (CRI ListPodSandbox: unreachable: " in text
    assert "; nothing on it is planned; its 1 node(s) were not checked: c1-cp-1" in text
    assert "? Unknown: hypervisor edge-1 is unreachable (" in text and "were not checked: c1-ingress" in text
    assert "No changes." not in text
    assert plain_out == text

    markdown = out["markdown"][0]
    assert f"**No changes in what could be checked. {INCOMPLETE}**" in markdown
    assert "- :question: hypervisor edge-1 is unreachable (" in markdown

    data = json.loads(out["json"][0])
    assert data["complete"] is False and data["actions"] == []
    assert [(u["kind"], u["name"], u["nodes"]) for u in data["unknown"]] == [
        ("hypervisor", "edge-1", ["c1-ingress"]), ("hypervisor", "hv-1", ["c1-cp-1"])]
    assert all(u["error"].startswith("CRI ListPodSandbox: unreachable: ") for u in data["unknown"])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The example repo without its SIPCluster, with a converged state and observed snapshot."""
    repo = tmp_path_factory.mktemp("example") / "repo"
    shutil.copytree(EXAMPLE_REPO, repo)
    (repo / "sip/tenant-1.yaml").unlink()
    result = validate_repo(repo)
    assert result.model is not None and not result.model.sip_clusters
    # the command plans at the real time: the certificates must be fresh now
    state, observed = settle(result.model, result.repo.config, now=dt.datetime.now(dt.timezone.utc))
    state_dir = repo.parent / "state"
    LocalDirStore(state_dir).save(state)
    hv = observed.hypervisors["hv-public-1"]
    ingress = next(p for p in hv.pods if p.node == "team-a-ingress")
    drifted = dataclasses.replace(ingress, containers=tuple(c for c in ingress.containers
                                                             if c.component != "haproxy"))
    drift = dataclasses.replace(observed, hypervisors={
        **observed.hypervisors, "hv-public-1": dataclasses.replace(
            hv, pods=tuple(drifted if p is ingress else p for p in hv.pods))})
    return repo, state_dir, {"converged": observed, "drift": drift, "down": private_2_down(observed),
                             "drift+down": private_2_down(drift)}


@pytest.mark.parametrize("case, extra, code, first_line", [
    ("converged", [], 0, "No changes. The live state matches the repo."),
    ("drift", [], 2, "Plan: 1 to add, 0 to change, 0 to remove."),
    ("down", [], 3, "No changes in what could be checked. Incomplete: 1 hypervisor could not be observed."),
    ("drift+down", [], 3, "Plan: 1 to add, 0 to change, 0 to remove. Incomplete: 1 hypervisor could not be "
                          "observed."),
    ("drift+down", ["--format", "markdown"], 3, "### gitops plan"),
    ("drift+down", ["-o", "json"], 3, "{"),
])
def test_detailed_exit_codes(world, monkeypatch, case, extra, code, first_line):
    repo, state_dir, observed = world
    monkeypatch.setattr(plan_cli, "observe_all", lambda model, config, state=None: observed[case])
    result = CliRunner().invoke(cli, ["plan", str(repo), "--state-dir", str(state_dir), "--detailed-exitcode",
                                      *extra])
    assert result.exit_code == code, result.output
    assert result.output.splitlines()[0] == first_line
    if extra == ["-o", "json"]:
        data = json.loads(result.output)
        assert data["complete"] is False and data["summary"] == {"add": 1, "change": 0, "remove": 0}
        assert [(u["kind"], u["name"]) for u in data["unknown"]] == [("hypervisor", "hv-private-2")]
    else:
        unknown = "hypervisor hv-private-2 is unreachable (CRI ListPodSandbox: unreachable: "
        assert (unknown in result.output) == ("down" in case)


def test_exit_code_is_0_without_the_flag_even_when_incomplete(world, monkeypatch):
    repo, state_dir, observed = world
    monkeypatch.setattr(plan_cli, "observe_all", lambda model, config, state=None: observed["drift+down"])
    result = CliRunner().invoke(cli, ["plan", str(repo), "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    assert "? Unknown: hypervisor hv-private-2 is unreachable" in result.output


def test_the_exit_codes_are_documented():
    page = (Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "first-pull-request.md").read_text()
    assert "| 3 | incomplete: something could not be observed" in page
    options = {o.name: o for o in plan_cli.plan.params}
    assert "3 when the plan is incomplete" in (options["detailed_exitcode"].help or "")
