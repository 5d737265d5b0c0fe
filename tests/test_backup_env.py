"""Issue #42.6: restic, and the ssh it runs for an sftp target, get only the environment they need, and the
password through a pipe (`--password-file`), never RESTIC_PASSWORD: checked on Debian's restic against a real
sshd, whose sshCommand dumps what ssh and restic were given; local and REST targets still back up and restore."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from children import stop_all
from test_backup import PASSWORD, rest_server, sftp_server, work  # noqa: F401 - `work` is a fixture

from gitops.backup.restic import ENVIRONMENT, MAX_PASSWORD, BackupError, Restic, environment
from gitops.model.config import BackupTarget

pytestmark = pytest.mark.lab("etcd")  # test_backup's servers and address

#: what the controller's environment holds that restic and ssh must never see
CONTROLLER_SECRETS = {"RESTIC_PASSWORD": "password-in-the-environment", "RESTIC_PASSWORD_FILE": "/etc/shadow",
                      "RESTIC_PASSWORD_COMMAND": "cat /etc/shadow", "RESTIC_REPOSITORY": "/elsewhere",
                      "AWS_SECRET_ACCESS_KEY": "aws-secret", "GITOPS_TEST_SECRET": "controller-secret"}

#: sshCommand's first word: writes the environment it got, and its parent's (restic's) with its command line,
#: and what is left to read of the password pipe it inherits from restic; then runs the real ssh
DUMP = """#!/bin/sh
fds=$(tr '\\0' '\\n' < /proc/$PPID/cmdline | sed -n 's#^/proc/self/fd/##p')
{{ echo "== ssh"; env; echo "== restic $PPID"; tr '\\0' '\\n' < /proc/$PPID/environ
   echo "== restic cmdline"; tr '\\0' ' ' < /proc/$PPID/cmdline; echo
   for fd in $fds; do echo "== inherited fd $fd"; timeout 1 cat /proc/$$/fd/$fd 2>/dev/null; echo; done; }} >> {out}
exec "$@"
"""


def dumped_environments(dump: str) -> list[tuple[dict[str, str], dict[str, str], str, list[str]]]:
    """Each run's (ssh's environment, restic's environment, restic's command line, what ssh could read of each
    pipe restic was given: its repository's and its password's, as `N\nwhat was left`)."""
    runs = []
    for run in dump.split("== ssh\n")[1:]:
        ssh, rest = run.split("== restic ", 1)
        restic, rest = rest.split("== restic cmdline\n", 1)
        cmdline, *inherited = rest.split("== inherited fd ")
        runs.append(({k: v for k, _, v in (ln.partition("=") for ln in ssh.splitlines() if "=" in ln)},
                     {k: v for k, _, v in (ln.partition("=") for ln in restic.splitlines()[1:] if "=" in ln)},
                     cmdline.strip(), inherited))
    return runs


def round_trip(target: BackupTarget, work: Path, name: str) -> None:
    """Back up a file into `target`, list it, dump it back: the same bytes."""
    data = work / f"{name}.db"
    data.write_bytes(os.urandom(4096) + name.encode())
    restic = Restic(target)
    restic.ensure_repository()
    snap = restic.backup(data, "team-a", 7, "m1")
    assert [s.id for s in restic.snapshots("team-a")] == [snap.id] and snap.bytes == 4096 + len(name)
    with (work / f"{name}.restored").open("wb") as out:
        restic.dump(snap.id, "team-a", out)
    assert (work / f"{name}.restored").read_bytes() == data.read_bytes()


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_ssh_gets_no_password_and_restic_only_its_own_environment(work: Path, monkeypatch) -> None:
    for name, value in CONTROLLER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_TIME", "C.UTF-8")  # one of ENVIRONMENT's: passed on
    out, script = work / "env.dump", work / "dump-env-then-ssh"
    script.write_text(DUMP.format(out=out))
    script.chmod(stat.S_IRWXU)
    sshd, ssh_command, repository = sftp_server(work)
    try:
        before = open_fds()
        round_trip(BackupTarget("sftp", repository, PASSWORD, (str(script), *ssh_command)), work, "sftp")
        assert open_fds() == before  # each run's password pipe closed
    finally:
        stop_all([sshd])
    assert (work / "sftp-repo" / "config").is_file()  # really written over sftp
    runs = dumped_environments(out.read_text())
    assert len(runs) >= 4, out.read_text()  # cat config, init, backup, snapshots (twice), dump
    allowed = {name for name in os.environ if any(
        name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in (*ENVIRONMENT, "SSH_AUTH_SOCK"))}
    for ssh_env, restic_env, cmdline, inherited in runs:
        assert "restic" in cmdline and "--password-file /proc/self/fd/" in cmdline, cmdline
        assert "--repository-file /proc/self/fd/" in cmdline and repository not in cmdline, cmdline
        assert PASSWORD not in cmdline and len(inherited) == 2, (cmdline, inherited)
        for pipe in inherited:
            number, _, left = pipe.partition("\n")
            assert number.isdigit() and left.strip() == "", inherited  # restic read it all before ssh started
        for env in (ssh_env, restic_env):
            assert PASSWORD not in "\n".join(f"{k}={v}" for k, v in env.items())
            assert not set(env) & set(CONTROLLER_SECRETS), sorted(env)
            assert not any(v in env.values() for v in CONTROLLER_SECRETS.values())
        assert set(restic_env) <= allowed, sorted(set(restic_env) - allowed)
        assert restic_env["LC_TIME"] == "C.UTF-8" and restic_env["PATH"] == os.environ["PATH"]
        # ssh gets restic's environment and what a shell adds (PWD, SHLVL, _), nothing else
        assert set(ssh_env) - set(restic_env) <= {"PWD", "SHLVL", "_", "OLDPWD"}, sorted(ssh_env)


def test_local_and_rest_targets_still_back_up_and_restore(work: Path, monkeypatch) -> None:
    monkeypatch.setenv("RESTIC_PASSWORD", "not-the-password")  # the controller's: never used
    monkeypatch.setenv("RESTIC_PASSWORD_FILE", str(work / "missing"))
    rest, rest_repo = rest_server(work)
    try:
        round_trip(BackupTarget("local", str(work / "local-repo"), PASSWORD), work, "local")
        round_trip(BackupTarget("rest", rest_repo, PASSWORD), work, "rest")
    finally:
        stop_all([rest])
    with pytest.raises(BackupError, match="backup target local: cannot open its restic repository"):
        Restic(BackupTarget("local", str(work / "local-repo"), "wrong")).ensure_repository()


def test_each_kind_adds_only_its_own_variables_to_a_minimal_environment() -> None:
    controller = {"PATH": "/usr/bin:/bin", "HOME": "/var/lib/gitops", "LANG": "C.UTF-8", "LC_ALL": "C",
                  "TMPDIR": "/tmp/x", "SSH_AUTH_SOCK": "/run/agent", "RESTIC_REST_USERNAME": "u",
                  "RESTIC_REST_PASSWORD": "p", "HTTPS_PROXY": "http://proxy:3128", "RESTIC_COMPRESSION": "max",
                  "KUBECONFIG": "/k", "GITOPS_IDENTITY": "AGE-SECRET-KEY-1", **CONTROLLER_SECRETS}
    base = {k: controller[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "RESTIC_COMPRESSION")}
    assert environment(BackupTarget("l", "/srv/b", PASSWORD), controller) == base
    assert environment(BackupTarget("s", "sftp:b@h:/b", PASSWORD), controller) == {
        **base, "SSH_AUTH_SOCK": "/run/agent"}
    assert environment(BackupTarget("r", "rest:https://h/", PASSWORD), controller) == {
        **base, "RESTIC_REST_USERNAME": "u", "RESTIC_REST_PASSWORD": "p", "HTTPS_PROXY": "http://proxy:3128"}
    assert environment(BackupTarget("l", "/srv/b", PASSWORD), {})["PATH"] == os.defpath


def test_a_password_restic_would_cut_or_cannot_take_is_an_error_before_restic_runs(work: Path) -> None:
    for password, why in ((" leading", "begins or ends with whitespace"), ("trailing\t", "begins or ends"),
                          ("x" * (MAX_PASSWORD + 1), f"longer than {MAX_PASSWORD} bytes")):
        with pytest.raises(BackupError, match=f"backup target t: its password .*{why}"):
            Restic(BackupTarget("t", str(work / "repo"), password)).ensure_repository()
    assert not (work / "repo").exists()
