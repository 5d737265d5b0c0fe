"""The jump host (issue #5): Debian's real sshd in a host-network CRI pod on a public lab
hypervisor, reached with the real ssh client; plus its pure spec and the lab image."""
from __future__ import annotations

import dataclasses
import io
import os
import shlex
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import wait_exit
from ports import free_port_in, wait_listening

from gitops.cri.client import CRIClient
from gitops.cri.types import ContainerSpec, ContainerState, SandboxSpec
from gitops.lab import images as labimages
from gitops.lab import recipes
from gitops.compile import jumphost
from gitops.compile.jumphost import JumphostError, jumphost_container, jumphost_files

pytestmark = pytest.mark.lab("session")

SSH_TIMEOUT = 15
Pod = tuple[CRIClient, str, SandboxSpec, Path]  # client, sandbox id, sandbox spec, base dir


def _keygen(path: Path) -> str:
    """A fresh ed25519 client key pair at `path`; returns the public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, timeout=10)
    return (path.parent / (path.name + ".pub")).read_text().strip()


# ---------------------------------------------------------------------------- pure


def test_files_and_container_spec(tmp_path: Path) -> None:
    key = _keygen(tmp_path / "k")
    other = _keygen(tmp_path / "o")
    files = jumphost_files((key, f"  {other}\n", key))
    assert files["authorized_keys"] == f"{key}\n{other}\n"  # one per line, trimmed, deduplicated
    config = files["sshd_config"]
    for line in ("PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin no",
                 "AllowUsers jump", "AllowTcpForwarding yes", "UsePAM no", "StrictModes yes", "PidFile none",
                 "AuthorizedKeysFile .ssh/authorized_keys", "HostKey /var/lib/jumphost/ssh_host_ed25519_key"):
        assert line in config.splitlines()
    assert "ListenAddress" not in config and "PRIVATE" not in config + files["authorized_keys"]

    spec = jumphost_container("jumphost", "127.0.20.1", 30022, (key,), "/data/jh/files/")
    assert spec.image == jumphost.DEFAULT_JUMPHOST_IMAGE == "ghcr.io/gitops-infra/gitops-jumphost:0.1.0"
    assert spec.command == ("/usr/local/bin/gitops-jumphost",)
    assert spec.args[1:] == ("--", "-D", "-e", "-f", "/etc/gitops/sshd_config",
                             "-o", "ListenAddress=127.0.20.1:30022")
    assert spec.args[0].startswith("--authorized-keys-sha256=") and not spec.env
    assert [(m.container_path, m.host_path, m.readonly) for m in spec.mounts] == [
        ("/etc/gitops", "/data/jh/files", True), ("/var/lib/jumphost", "/data/jh/host-keys", False)]
    # the keys are in the spec (as a digest): other keys, another container
    assert jumphost_container("jumphost", "127.0.20.1", 30022, (other,), "/data/jh/files").args != spec.args
    v6 = jumphost_container("jh", "fd00::1", 22, (key,), "/f", "example.test/jh:1", state_dir_host="/s")
    assert v6.args[-1] == "ListenAddress=[fd00::1]:22" and v6.image == "example.test/jh:1"
    assert v6.mounts[1].host_path == "/s"


@pytest.mark.parametrize("keys, message", [
    ((), "at least one authorized key"),
    ("ssh-ed25519 AAAA", "a tuple of keys"),
    (("",), "empty authorized key"),
    (("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 a\nssh-rsa AAAA",), "must be one line"),
    (("-----BEGIN OPENSSH PRIVATE KEY-----",), "not a private key"),
    (("hello world",), "not an OpenSSH public key"),
    (("ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGpY",), "not a ssh-rsa key"),
])
def test_bad_keys_are_refused(keys: tuple[str, ...], message: str) -> None:
    with pytest.raises(JumphostError, match=message):
        jumphost_container("jumphost", "127.0.0.1", 2222, keys, "/f")


@pytest.mark.parametrize("kwargs, message", [
    ({"ip": "jump.example"}, "not an IP address"),
    ({"ip": "0.0.0.0"}, "one address"),
    ({"port": 0}, "not a TCP port"),
    ({"port": 65536}, "not a TCP port"),
    ({"files_dir_host": "relative/files"}, "absolute path"),
    ({"files_dir_host": "/a/../files"}, "absolute path"),
    ({"name": "Jump_Host"}, "not a container name"),
])
def test_bad_placement_is_refused(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"name": "jumphost", "ip": "127.0.0.1", "port": 2222,
                               "authorized_keys": (_keygen(tmp_path / "k"),), "files_dir_host": "/f", **kwargs}
    with pytest.raises(JumphostError, match=message):
        jumphost_container(**args)  # type: ignore[arg-type]


def test_image_contents() -> None:
    recipe = recipes.jumphost_recipe()
    assert recipe.ref == f"gitops.lab/jumphost:{recipes.sshd_version('/usr/sbin/sshd')}"
    assert recipes.upstream_aliases(recipes.lab_recipes())[jumphost.DEFAULT_JUMPHOST_IMAGE] == recipe.ref
    with tarfile.open(fileobj=io.BytesIO(labimages._layer(recipe))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        passwd = tar.extractfile("etc/passwd").read().decode()  # type: ignore[union-attr]
    assert "jump:x:1000:1000:gitops jump host:/home/jump:/bin/sh" in passwd.splitlines()
    assert any(line.startswith("sshd:x:100:65534:") for line in passwd.splitlines())
    privsep = members["run/sshd"]
    assert privsep.isdir() and privsep.mode == 0o755 and privsep.uid == 0
    assert members["home/jump"].isdir() and members["home/jump"].mode == 0o755  # root's, not writable by jump
    assert members["usr/local/bin/gitops-jumphost"].mode == 0o755
    for path in ("usr/sbin/sshd", "usr/bin/ssh-keygen", "usr/bin/sh", "usr/bin/sha256sum", "etc/ssh/moduli"):
        assert members[path].isfile(), path
    assert any("libcrypto" in name for name in members) and members["bin"].issym()


# ---------------------------------------------------------------------------- live, on a lab hypervisor


def _log(base: Path, name: str) -> str:
    """A container's output (CRI log lines are `<time> <stream> <tag> <text>`)."""
    path = base / "logs" / f"{name}.log"
    if not path.exists():
        return ""
    return "\n".join(line.split(" ", 3)[3] for line in path.read_text().splitlines() if line.count(" ") >= 3)


def _start(pod: Pod, spec: ContainerSpec) -> str:
    client, sandbox_id, sandbox, _ = pod
    ctr = client.create_container(sandbox_id, dataclasses.replace(spec, log_path=f"{spec.name}.log"), sandbox)
    client.start_container(ctr)
    return ctr


def _wait_listening(pod: Pod, ctr: str, name: str, ip: str, port: int, timeout: float = 10) -> None:
    client, _, _, base = pod
    try:
        wait_listening(ip, port, timeout, gone=lambda: None if client.container_status(ctr).state
                       == ContainerState.RUNNING else "the jump host exited")
    except AssertionError as err:
        raise AssertionError(f"{err}:\n{_log(base, name)}") from None


def _ssh_argv(key: Path, ip: str, port: int, user: str = "jump", *options: str) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", *options, f"{user}@{ip}"]


def _ssh(key: Path, ip: str, port: int, *command: str, user: str = "jump",
         options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}  # only the key we name
    return subprocess.run([*_ssh_argv(key, ip, port, user, *options), *command], capture_output=True, text=True,
                          timeout=SSH_TIMEOUT, env=env, stdin=subprocess.DEVNULL)


def test_jump_host_serves_only_declared_keys(lab, pod: Pod, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client, _, _, base = pod
    hv, other_hv = lab.hypervisors[0], lab.hypervisors[1]
    declared, stranger = tmp_path / "declared", tmp_path / "stranger"
    keys = (_keygen(declared),)
    _keygen(stranger)
    # This test stands in for gitops' files agent: it writes the public files on the host.
    files_dir = base / "files"
    files_dir.mkdir(parents=True)
    for name, text in jumphost_files(keys).items():
        (files_dir / name).write_text(text)
    port = free_port_in(hv.ip, hv.port_range.low + 700, hv.port_range.high)
    spec = jumphost_container("jumphost", hv.ip, port, keys, str(files_dir))
    assert not any("PRIVATE" in a for a in spec.args) and not spec.env
    ctr = _start(pod, spec)
    _wait_listening(pod, ctr, "jumphost", hv.ip, port)

    ok = _ssh(declared, hv.ip, port, "echo", "ok")
    assert (ok.returncode, ok.stdout) == (0, "ok\n"), ok.stderr + _log(base, "jumphost")
    assert _ssh(declared, hv.ip, port, "true").returncode == 0

    refused = _ssh(stranger, hv.ip, port, "true")
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr, refused.stderr
    root = _ssh(declared, hv.ip, port, "true", user="root")  # the right key, the wrong user
    assert root.returncode == 255 and "Permission denied" in root.stderr
    # publickey is the only method offered: no password, no keyboard-interactive
    password = _ssh(declared, hv.ip, port, "true", options=(
        "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive"))
    assert password.returncode == 255 and "Permission denied (publickey)." in password.stderr, password.stderr

    # a jump host: ssh through it (ProxyCommand ssh -W, i.e. what ProxyJump does) to itself
    hop = shlex.join(_ssh_argv(declared, hv.ip, port, "jump", "-W", "%h:%p"))
    through = _ssh(declared, hv.ip, port, "echo", "through", options=("-o", f"ProxyCommand={hop}"))
    assert (through.returncode, through.stdout) == (0, "through\n"), through.stderr

    # only ip:port: the other hypervisor's address (same host network) gets no answer
    with pytest.raises(OSError):
        socket.create_connection((other_hv.ip, port), timeout=1).close()

    # the host key was born on the hypervisor, in the host-key directory, and is the one served
    host_key = base / "host-keys" / "ssh_host_ed25519_key"
    assert host_key.stat().st_mode & 0o777 == 0o600
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(port), hv.ip], capture_output=True,
                          text=True, timeout=SSH_TIMEOUT)
    served = scan.stdout.split()[1:3]
    assert served == (base / "host-keys" / "ssh_host_ed25519_key.pub").read_text().split()[:2], scan.stderr
    log = _log(base, "jumphost")
    assert "gitops-jumphost: generated the host key" in log and "Accepted publickey for jump" in log

    # restarted (new container, same host directories): same host key, no new one
    client.stop_container(ctr, timeout=5)
    assert wait_exit(client, ctr) in (0, 255)  # sshd exits on SIGTERM
    client.remove_container(ctr)
    again = _start(pod, dataclasses.replace(spec, name="jumphost-again"))
    _wait_listening(pod, again, "jumphost-again", hv.ip, port)
    rescan = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(port), hv.ip], capture_output=True,
                            text=True, timeout=SSH_TIMEOUT)
    assert rescan.stdout.split()[1:3] == served
    assert "generated" not in _log(base, "jumphost-again")


def test_stale_authorized_keys_fail_loudly(lab, pod: Pod, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A container made for other keys than the files directory holds exits with a clear message."""
    client, _, _, base = pod
    hv = lab.hypervisors[0]
    files_dir = base / "files"
    files_dir.mkdir(parents=True)
    for name, text in jumphost_files((_keygen(tmp_path / "old"),)).items():
        (files_dir / name).write_text(text)
    spec = jumphost_container("jumphost", hv.ip, hv.port_range.high, (_keygen(tmp_path / "new"),), str(files_dir))
    ctr = _start(pod, spec)
    assert wait_exit(client, ctr) == 1
    assert "/etc/gitops/authorized_keys: sha256" in _log(base, "jumphost")
    assert "stale files?" in _log(base, "jumphost")
    assert not (base / "host-keys" / "ssh_host_ed25519_key").exists()  # checked before anything is generated
