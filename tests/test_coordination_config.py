"""spec.coordination in gitops.yaml: defaults, the timing rules with file, line and field, the model."""
from __future__ import annotations

import textwrap

from gitops.model.config import Coordination, RepoConfig
from gitops.model.validate import validate_repo


def config(tmp_path, body: str):
    (tmp_path / "gitops.yaml").write_text("apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n"
                                          + textwrap.indent(textwrap.dedent(body), "  "))
    validation = validate_repo(tmp_path)
    return [str(d) for d in validation.diagnostics], validation.repo.config


def test_without_coordination_the_git_lock_stays():
    assert RepoConfig().coordination == Coordination() and not RepoConfig().coordination.mode


def test_shards_with_defaults(tmp_path):
    errors, cfg = config(tmp_path, """
        coordination:
          mode: shards
          kubeconfig: /etc/gitops/management.kubeconfig
          shards: 10
        """)
    assert errors == []
    assert cfg.coordination == Coordination("shards", "/etc/gitops/management.kubeconfig", "default", 10, 15, 10, 2)


def test_timing_rules_name_file_line_and_field(tmp_path):
    errors, _ = config(tmp_path, """
        coordination:
          mode: leader
          namespace: gitops
          leaseDurationSeconds: 10
          renewDeadlineSeconds: 10
          retryPeriodSeconds: 9
        """)
    assert errors == [
        "gitops.yaml:9: GitopsConfig: spec.coordination.renewDeadlineSeconds: 10 must be less than "
        "leaseDurationSeconds (10)",
        "gitops.yaml:10: GitopsConfig: spec.coordination.retryPeriodSeconds: 1.2 x 9 must be less than "
        "renewDeadlineSeconds (10)"]


def test_schema_errors(tmp_path):
    errors, _ = config(tmp_path, """
        coordination:
          mode: both
          shards: 0
          namespace: Not_A_Name
        """)
    assert len(errors) == 3 and all("spec.coordination." in e for e in errors), errors
    errors, _ = config(tmp_path, """
        coordination: {shards: 2}
        """)
    assert errors == ["gitops.yaml:5: GitopsConfig: spec.coordination: missing required field 'mode'"], errors
