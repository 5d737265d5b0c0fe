"""etcd backups (issue #29, item 1) on real parts: a real etcd over mutual TLS, Debian's restic, and
its three kinds of target: a local directory, a restic REST server (`rclone serve restic`) and sftp
through a real sshd; plus the repo settings that name them."""
from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from children import stop_all
from kubeapi import etcd_binary
from ports import free_ports, wait_listening

from gitops.backup import targets
from gitops.backup.etcdsnapshot import MemberStatus, pick_member
from gitops.backup.restic import BackupError, Restic
from gitops.backup.take import back_up
from gitops.etcdclient import client_context
from gitops.model.config import BackupTarget
from gitops.model.schemas import schema as load_schema
from gitops.pki import create_ca, issue_cert

pytestmark = pytest.mark.lab("etcd")

IP = "127.0.38.1"
#: a rest: target's password (in its URL), looked for on the machine's command lines
TOKEN = "rest-t0ken-60"
PASSWORD = "correct horse battery staple"


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gitops-backup-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_etcd(work: Path, ca, name: str = "m1", data: Path | None = None,
               extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """One etcd member on IP, clients over mutual TLS signed by `ca`; `data`: an existing data dir; `extra`: more
    flags."""
    server = issue_cert(ca, "etcd", ip_addresses=[IP], server=True, client=True)
    for file, pem in (("ca.crt", ca.cert_pem), ("server.crt", server.cert_pem), ("server.key", server.key_pem)):
        (work / file).write_text(pem)
    client, peer = free_ports(IP, 2)
    log = open(work / f"{name}.log", "a")
    proc = subprocess.Popen([
        str(etcd_binary()), f"--name={name}", f"--data-dir={data or work / name}",
        f"--listen-client-urls=https://{IP}:{client}", f"--advertise-client-urls=https://{IP}:{client}",
        f"--listen-peer-urls=http://{IP}:{peer}", f"--initial-advertise-peer-urls=http://{IP}:{peer}",
        f"--initial-cluster={name}=http://{IP}:{peer}", "--listen-metrics-urls=",
        f"--cert-file={work / 'server.crt'}", f"--key-file={work / 'server.key'}", "--client-cert-auth",
        f"--trusted-ca-file={work / 'ca.crt'}", "--log-level=warn", *extra], stdout=log, stderr=log)
    log.close()
    wait_listening(IP, client, 30, lambda: "etcd exited" if proc.poll() is not None else None)
    return proc, f"https://{IP}:{client}"


def kv(context, url: str, op: str, key: str, value: str = "") -> dict:
    import urllib.request
    body = {"key": base64.b64encode(key.encode()).decode()}
    if op == "put":
        body["value"] = base64.b64encode(value.encode()).decode()
    request = urllib.request.Request(f"{url}/v3/kv/{op}", data=json.dumps(body).encode(), method="POST")
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture
def etcd(work: Path):
    ca = create_ca("backup-test-etcd-ca")
    proc, url = start_etcd(work, ca)
    try:
        yield ca, url
    finally:
        stop_all([proc])


def rest_server(work: Path, user: str = "", password: str = "") -> tuple[subprocess.Popen, str]:
    """`rclone serve restic` on IP (behind Basic auth with `user` and `password`); its repository URL, with
    them in it."""
    port = free_ports(IP, 1)[0]
    (work / "rest").mkdir()
    auth = ["--user", user, "--pass", password] if user else []
    proc = subprocess.Popen(["rclone", "serve", "restic", "--addr", f"{IP}:{port}", *auth, str(work / "rest")],
                            stdout=subprocess.DEVNULL, stderr=open(work / "rclone.log", "w"))
    wait_listening(IP, port, 30, lambda: "rclone exited" if proc.poll() is not None else None)
    return proc, f"rest:http://{f'{user}:{password}@' if user else ''}{IP}:{port}/"


def sftp_server(work: Path) -> tuple[subprocess.Popen, list[str], str]:
    """Debian's sshd on IP (root login by key only, sftp subsystem); the ssh command restic runs."""
    ssh = work / "ssh"
    ssh.mkdir(mode=0o700)
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / key)], check=True)
    (ssh / "authorized_keys").write_text((ssh / "client.pub").read_text())
    port = free_ports(IP, 1)[0]
    (ssh / "known_hosts").write_text(f"[{IP}]:{port} {(ssh / 'host.pub').read_text()}")
    (ssh / "sshd_config").write_text(
        f"ListenAddress {IP}:{port}\nHostKey {ssh / 'host'}\nAuthorizedKeysFile {ssh / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPidFile none\nSubsystem sftp internal-sftp\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(ssh / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(work / "sshd.log", "w"))
    wait_listening(IP, port, 30, lambda: "sshd exited" if proc.poll() is not None else None)
    command = ["ssh", "-p", str(port), "-i", str(ssh / "client"), "-o", f"UserKnownHostsFile={ssh / 'known_hosts'}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{IP}", "-s", "sftp"]
    return proc, command, f"sftp:root@{IP}:{work / 'sftp-repo'}"


def test_snapshots_go_to_each_kind_of_target_and_retention_keeps_the_newest(work: Path, etcd) -> None:
    ca, url = etcd
    context = client_context(ca)
    rest, rest_repo = rest_server(work, "bob", TOKEN)  # (its credentials reach restic in a pipe, never argv)
    sshd, ssh_command, sftp_repo = sftp_server(work)
    try:
        kinds = {"local": BackupTarget("local", str(work / "local-repo"), PASSWORD),
                 "rest": BackupTarget("rest", rest_repo, PASSWORD),
                 "sftp": BackupTarget("sftp", sftp_repo, PASSWORD, tuple(ssh_command))}
        assert {k: targets.kind_of(t).name for k, t in kinds.items()} == {k: k for k in kinds}
        for name, target in kinds.items():
            revisions = []
            for round_ in range(2):
                kv(context, url, "put", f"/registry/round-{name}", str(round_))
                snap = back_up(target, "team-a", 1, context, {"m1": url})
                assert snap.cluster == "team-a" and snap.member == "m1" and snap.bytes > 0
                revisions.append(snap.revision)
            listed = Restic(target).snapshots("team-a")
            assert [s.revision for s in listed] == revisions[1:], name  # keep 1: the older one forgotten
            assert revisions == sorted(set(revisions)), revisions
            assert Restic(target).snapshots("team-b") == []
    finally:
        stop_all([rest, sshd])
    assert (work / "sftp-repo" / "config").is_file()  # restic's repository really is on the sftp side


def test_a_rest_targets_credentials_never_reach_restics_command_line(work: Path) -> None:
    """A rest: repository's user and password (its URL) reach restic through a pipe (`--repository-file`), as
    its password does: while restic waits on a server that answers nothing, no command line on the machine
    holds them (issue #60.3's class: /proc/PID/cmdline is anyone's to read)."""
    import socket
    import threading

    from githttp import processes

    server = socket.create_server((IP, free_ports(IP, 1)[0]))
    port, held = server.getsockname()[1], []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(100)), daemon=True).start()
    target = BackupTarget("rest", f"rest:http://bob:{TOKEN}@{IP}:{port}/", PASSWORD)
    failed: list[BaseException] = []
    listing = threading.Thread(target=lambda: failed.extend(_raised(lambda: Restic(target).snapshots("team-a")))
                               , daemon=True)
    listing.start()
    try:
        deadline = time.monotonic() + 30
        while not held and time.monotonic() < deadline:
            time.sleep(0.05)
        running = processes("--repository-file")
        assert held and running, running
        assert processes(TOKEN) == []
    finally:
        for pid, _line in processes("--repository-file"):
            os.kill(pid, 9)
        listing.join(timeout=30)
        server.close()
    assert len(failed) == 1 and isinstance(failed[0], BackupError) and TOKEN not in str(failed[0]), failed


def _raised(call) -> list[BaseException]:
    try:
        call()
    except BaseException as err:  # noqa: BLE001 -- handed to the test
        return [err]
    return []


def test_a_backup_killed_before_its_cleanup_leaves_no_snapshot_behind(work: Path, etcd) -> None:
    """kill -9 while a backup holds the snapshot in its scratch directory (a copy of the cluster's data):
    the next backup removes that directory first; a running backup's own stays."""
    ca, url = etcd
    tmp = Path(tempfile.gettempdir())
    killed = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, tempfile, time\n"
        "d = tempfile.mkdtemp(prefix=f'gitops-backup-{os.getpid()}-')\n"
        "open(os.path.join(d, 'etcd.db'), 'wb').write(b'the cluster data')\n"
        "print(d, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    left = Path(killed.stdout.readline().strip())
    killed.kill()
    killed.wait()
    killed.stdout.close()
    running = Path(tempfile.mkdtemp(prefix=f"gitops-backup-{os.getpid()}-", dir=tmp))
    try:
        assert (left / "etcd.db").is_file()
        back_up(BackupTarget("local", str(work / "local-repo"), PASSWORD), "team-a", 1, client_context(ca),
                {"m1": url})
        assert not left.exists()
        assert running.is_dir()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(running, ignore_errors=True)
    assert not [p for p in tmp.glob(f"gitops-backup-{os.getpid()}-*") if p != running]


def test_a_snapshot_restores_into_an_etcd_that_serves_its_keys(work: Path, etcd) -> None:
    ca, url = etcd
    context = client_context(ca)
    target = BackupTarget("local", str(work / "repo"), PASSWORD)
    kv(context, url, "put", "/registry/configmaps/default/a", "before")
    snap = back_up(target, "team-a", 5, context, {"m1": url})
    kv(context, url, "put", "/registry/configmaps/default/b", "after")
    with (work / "restored.db").open("wb") as out:
        Restic(target).dump(snap.id, "team-a", out)
    subprocess.run([str(etcd_binary("etcdutl")), "snapshot", "restore", str(work / "restored.db"), "--name=r1",
                    f"--data-dir={work / 'r1'}", "--initial-cluster=r1=http://127.0.0.1:2380",
                    "--initial-advertise-peer-urls=http://127.0.0.1:2380", "--initial-cluster-token=restore-1"],
                   check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    restored_dir = work / "restored"
    restored_dir.mkdir()
    proc, restored = start_etcd(restored_dir, ca, "r1", data=work / "r1")
    try:
        got = kv(context, restored, "range", "/registry/configmaps/default/a")
        assert [base64.b64decode(k["value"]).decode() for k in got.get("kvs", [])] == ["before"]
        assert kv(context, restored, "range", "/registry/configmaps/default/b").get("kvs") is None
    finally:
        stop_all([proc])


def test_a_wrong_password_is_an_error_and_never_a_new_repository(work: Path, etcd) -> None:
    ca, url = etcd
    back_up(BackupTarget("local", str(work / "repo"), PASSWORD), "team-a", 5, client_context(ca), {"m1": url})
    before = sorted(p.name for p in (work / "repo").iterdir())
    with pytest.raises(BackupError, match="backup target local: cannot open its restic repository"):
        back_up(BackupTarget("local", str(work / "repo"), "wrong"), "team-a", 5, client_context(ca), {"m1": url})
    assert sorted(p.name for p in (work / "repo").iterdir()) == before
    assert len(Restic(BackupTarget("local", str(work / "repo"), PASSWORD)).snapshots("team-a")) == 1


def test_no_healthy_member_names_each_member_and_why(work: Path) -> None:
    ca = create_ca("backup-test-etcd-ca")
    port = free_ports(IP, 1)[0]
    with pytest.raises(BackupError, match=r"no healthy etcd member to take a snapshot from: m1 \(.*\)"):
        back_up(BackupTarget("local", str(work / "repo"), PASSWORD), "team-a", 5, client_context(ca),
                {"m1": f"https://{IP}:{port}"})


def test_the_snapshot_comes_from_a_current_follower_before_the_leader() -> None:
    statuses = [MemberStatus("a", "u1", True, 10, leader=True), MemberStatus("b", "u2", True, 10),
                MemberStatus("c", "u3", True, 9), MemberStatus("d", "u4", False, why="down")]
    assert pick_member(statuses).node == "b"
    assert pick_member(statuses[:1] + statuses[2:]).node == "a"  # the follower lags: the leader is current


def test_the_schema_accepts_exactly_the_registered_kinds_of_target() -> None:
    schema = load_schema("GitopsConfig")
    pattern = schema["properties"]["spec"]["properties"]["backup"]["properties"]["targets"]["items"][
        "properties"]["repository"]["pattern"]
    prefixes = pattern[pattern.index("(") + 1:pattern.index(")")].split("|")
    assert sorted(p.replace("https?://", "") for p in prefixes) == sorted(k.prefix for k in targets.KINDS.values())


# --- the repo settings ------------------------------------------------------------------------------------

def backup_repo(root: Path, password: str, *, allow_plaintext: bool, target: str = "offsite",
                names: tuple[str, ...] = ("offsite",), recipient: str = "") -> Path:
    from repo_helpers import minimal_repo, write
    repo = minimal_repo(root)
    listed = "".join(f"      - name: {n}\n        repository: /srv/backups/{n}\n        password: |\n"
                     + "".join(f"          {ln}\n" for ln in password.splitlines()) for n in names)
    write(repo, "gitops.yaml", "apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n"
                               f"  secrets:\n    recipients: [{recipient or 'age1' + 'q' * 58}]\n"
                               f"    allowPlaintext: {'true' if allow_plaintext else 'false'}\n"
                               f"  backup:\n    targets:\n{listed}")
    cluster = repo / "clusters/c1.yaml"
    first, sep, rest = cluster.read_text().partition("\n---")
    cluster.write_text(first.rstrip("\n") + f"\n  backup:\n    target: {target}\n    keep: 3" + sep + rest)
    return repo


def test_a_plaintext_password_is_refused_and_allowed_only_in_labs(work: Path) -> None:
    from gitops.model.validate import validate_repo
    refused = validate_repo(backup_repo(work / "a", PASSWORD, allow_plaintext=False))
    assert [str(d) for d in refused.diagnostics] == [
        "gitops.yaml:11: GitopsConfig: spec.backup.targets[0].password: plaintext secret in the repo; encrypt it: "
        "gitops secrets encrypt gitops.yaml --field spec.backup.targets[0].password, or set "
        "spec.secrets.allowPlaintext: true in gitops.yaml (labs only)"]
    allowed = validate_repo(backup_repo(work / "b", PASSWORD, allow_plaintext=True))
    assert allowed.ok, allowed.diagnostics
    assert allowed.repo.config.backup_targets["offsite"].password == PASSWORD
    assert allowed.model.clusters["c1"].backup.keep == 3


def test_an_encrypted_password_is_decrypted_with_the_identity_only(work: Path) -> None:
    from gitops.model.validate import validate_repo
    from gitops.secrets import encrypt
    subprocess.run(["age-keygen", "-o", str(work / "id.key")], check=True, capture_output=True)
    recipient = subprocess.run(["age-keygen", "-y", str(work / "id.key")], check=True, capture_output=True,
                               text=True).stdout.strip()
    repo = backup_repo(work / "r", encrypt(PASSWORD.encode(), [recipient]), allow_plaintext=False,
                       recipient=recipient)
    opened = validate_repo(repo, (work / "id.key").read_text())
    assert opened.ok, opened.diagnostics
    assert opened.repo.config.backup_targets["offsite"].password == PASSWORD
    sealed = validate_repo(repo)
    assert any("spec.backup.targets[0].password: age-encrypted, and no identity to decrypt it" in str(d)
               for d in sealed.diagnostics), sealed.diagnostics


def test_a_cluster_naming_no_target_and_a_repeated_target_name_are_errors(work: Path) -> None:
    from gitops.model.validate import validate_repo
    found = [str(d) for d in validate_repo(backup_repo(work / "r", PASSWORD, allow_plaintext=True, target="tape",
                                                       names=("offsite", "offsite"))).diagnostics]
    assert any(f.startswith("gitops.yaml:") and "spec.backup.targets[1].name: backup target 'offsite' is named twice"
               in f for f in found), found
    assert any(f.startswith("clusters/c1.yaml:") and "spec.backup.target: no backup target 'tape' "
               "(gitops.yaml's targets: offsite)" in f for f in found), found


# --- the schedule and its record on the status branch ------------------------------------------------------

@pytest.fixture
def origin(work: Path) -> str:
    bare, clone = work / "origin.git", work / "clone"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    subprocess.run(["git", "clone", "-q", str(bare), str(clone)], check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "init"],
                   cwd=clone, check=True)
    subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=clone, check=True)
    return str(bare)


def test_a_failed_snapshot_is_a_condition_retried_later_and_gone_clusters_lose_their_record(work: Path,
                                                                                            origin: str) -> None:
    import datetime as dt

    from gitops.model.validate import validate_repo
    from gitops.state.records import State
    from gitops.status.backups import BACKUPS_DIR, backup_path, read_backup, take_due
    from gitops.status.branch import StatusBranch
    checked = validate_repo(backup_repo(work / "r", PASSWORD, allow_plaintext=True))
    model, config = checked.model, checked.repo.config
    branch = StatusBranch(origin, work / "ctl")
    now = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.timezone.utc)

    def commits() -> int:
        return len(subprocess.run(["git", "--git-dir", origin, "log", "--format=%s", "gitops/status"],
                                  capture_output=True, text=True, check=True).stdout.splitlines())

    # c1 was never applied (no etcd recorded): the attempt fails, and says so on the branch
    statuses = take_due(model, config, State(), branch, now, ["c1"])
    record = read_backup(branch.read(backup_path("c1")), "c1")
    assert statuses["c1"] == record and record.last is None and record.failed_at == now
    assert [(c["type"], c["status"], c["reason"]) for c in record.conditions] == [("BackedUp", "False", "BackupFailed")]
    assert "Cluster c1 has not been applied yet" in record.message
    assert commits() == 1
    take_due(model, config, State(), branch, now + dt.timedelta(minutes=1), ["c1"])  # too soon to retry
    assert commits() == 1
    take_due(model, config, State(), branch, now + dt.timedelta(minutes=6), ["c1"])
    assert commits() == 2 and read_backup(branch.read(backup_path("c1")), "c1").failed_at > now
    # the cluster left the repo: its record goes with the next round of the controller that owns every cluster
    take_due(model, config, State(), branch, now + dt.timedelta(minutes=7), [])
    assert branch.tracked_under(BACKUPS_DIR) == [] and commits() == 3



def test_restic_times_read_whatever_fraction_go_prints_and_a_bad_entry_is_an_error() -> None:
    """Go cuts trailing zeros of RFC 3339 fractions: 0 to 9 digits (a 7-digit one was once read wrong)."""
    from gitops.backup.restic import parse_snapshot
    base = {"id": "ab" * 32, "tags": ["gitops", "cluster=team-a", "revision=7", "bytes=9", "member=cp-1"]}
    for stamp, micro in (("2026-11-26T00:05:12Z", 0), ("2026-11-26T00:05:12.1234567Z", 123456),
                         ("2026-11-26T00:05:12.1+00:00", 100000), ("2026-11-26T01:05:12.123456789+01:00", 123456)):
        snap = parse_snapshot({**base, "time": stamp})
        assert (snap.time.astimezone(dt.timezone.utc).replace(microsecond=0).isoformat(), snap.time.microsecond) == (
            "2026-11-26T00:05:12+00:00", micro), stamp
    assert parse_snapshot({**base, "tags": ["other"], "time": "x"}) is None  # not gitops's: left alone
    with pytest.raises(BackupError, match="does not read as gitops's"):
        parse_snapshot({**base, "time": "yesterday"})


def test_metrics_give_each_clusters_backup_age_when_scraped_and_whether_it_worked() -> None:
    from prometheus_client import generate_latest

    from gitops.metrics import Metrics
    from gitops.status.backups import BackupStatus
    now = dt.datetime.now(dt.timezone.utc)
    metrics = Metrics()
    metrics.backups({
        "team-a": BackupStatus("team-a", {"id": "a" * 64, "time": (now - dt.timedelta(minutes=10)).isoformat()}),
        "team-b": BackupStatus("team-b", {"id": "b" * 64, "time": (now - dt.timedelta(hours=2)).isoformat()},
                               failed_at=now - dt.timedelta(minutes=1), message="no healthy etcd member"),
        "team-c": BackupStatus("team-c", None, failed_at=now)})
    text = generate_latest(metrics.registry).decode()
    ages = {ln.split('"')[1]: float(ln.split()[-1]) for ln in text.splitlines()
            if ln.startswith("gitops_etcd_backup_age_seconds{")}
    assert set(ages) == {"team-a", "team-b"} and 600 <= ages["team-a"] < 660 and 7200 <= ages["team-b"] < 7260
    assert 'gitops_etcd_backup_ok{cluster="team-a"} 1.0' in text
    assert 'gitops_etcd_backup_ok{cluster="team-b"} 0.0' in text  # failed after its last snapshot
    assert 'gitops_etcd_backup_ok{cluster="team-c"} 0.0' in text
