"""The machine's side of onboarding (`gitops hypervisor init`), run on the machine that becomes a hypervisor.

In order, and nothing is changed until every check passed: the CA hash and the address are checked
(the address must be one of this machine's), the machine must not be a hypervisor already (its
directory holds no `hypervisor.json`), the CRI port must be free and outside the pods' port range. Then the
pods' port range (and the CRI port) is reserved from the kernel's ephemeral ports
(`net.ipv4.ip_local_reserved_ports`, now and in a sysctl.d file for boots), so that no outgoing connection
of the machine holds a port gitops gives a pod; a warning is printed when root's inotify instances leave
room for few control planes (`inotify_note`); containerd's config is written
as gitops needs it (`gitops.hypervisor.configs`), in the config version the release its `--version` names
reads, and containerd restarted when it changed; a key is
made here (kept in the directory, mode 0600, reused if an earlier run stopped before enrolling, so its
fingerprint stays the same); the machine serves its request (`gitops.hypervisor.enroll`) until the
fleet delivers a certificate that checks out; then the front's files are written and `hypervisor.json`
records it. The caller starts the front (haproxy) on them.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gitops.cri.client import CRIClient
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError
from gitops.hypervisor import configs
from gitops.hypervisor.enroll import Enrollment, EnrollError, Request, check_hash, csr_for
from gitops.pki import generate_key, key_hash, key_to_pem, load_key_pem

RECORD = "hypervisor.json"
KEY = "server.key"
SYSTEMD_RESTART = "systemctl restart containerd"
RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")  # this process's network namespace's
SYSCTL_FILE = Path("/etc/sysctl.d/60-gitops-hypervisor.conf")
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")  # per user, shared by all of root's processes
#: inotify instances one control plane's pods hold on a hypervisor: kube-apiserver 6 (its certificate and CA
#: file watchers), kube-controller-manager up to 3 (docs/development/lab.md, counted on 1.35-1.37)
INOTIFY_PER_CONTROL_PLANE = 9
#: below this, `init` warns (it does not change a kernel setting for all of the machine's users)
INOTIFY_ADVISED = 1024
DEFAULT_PORT_RANGE = (30000, 30999)


@dataclass(frozen=True)
class MachineSpec:
    """What `gitops hypervisor init` was told."""

    address: str
    ca_hash: str
    directory: Path
    cri_port: int = configs.DEFAULT_CRI_PORT
    #: containerd's config file to write, and where that containerd keeps everything
    containerd_config: Path = Path("/etc/containerd/config.toml")
    #: the containerd that reads it (a name on PATH, or a path): its `--version` decides the config version
    containerd_binary: str = "containerd"
    paths: configs.ContainerdPaths = configs.ContainerdPaths.system()
    #: run when the config changed ("" = do not restart: containerd is started by someone else)
    restart: str = SYSTEMD_RESTART
    sandbox_image: str = configs.DEFAULT_SANDBOX_IMAGE
    #: where gitops keeps node files on this machine (the Hypervisor's data dir)
    data_dir: str = "/var/lib/gitops"
    #: ports gitops may give its pods here (the Hypervisor's portRange), reserved from ephemeral ports
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    #: where the reservation is kept for the next boot (None: not kept, e.g. a lab machine)
    sysctl_file: Path | None = SYSCTL_FILE

    @property
    def front_config(self) -> Path:
        return self.directory / "front.cfg"


@dataclass(frozen=True)
class Enrolled:
    """A machine made a hypervisor: its front's config (haproxy), and its record."""

    front_config: Path
    record: Path


def interface_of(address: str) -> str:
    """The network interface holding `address` on this machine (`ip -o addr`), "" when none does."""
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] in ("inet", "inet6") and fields[3].split("/")[0] == address:
            return fields[1].split("@")[0]
    return ""


def check(spec: MachineSpec) -> None:
    """Everything that can be checked before anything changes (EnrollError names what is wrong)."""
    check_hash(spec.ca_hash, "--ca-hash")
    try:
        probe = socket.socket(socket.AF_INET6 if ":" in spec.address else socket.AF_INET)
    except OSError as err:
        raise EnrollError(f"--address {spec.address}: {err}") from None
    with probe:
        try:
            probe.bind((spec.address, 0))
        except OSError:
            raise EnrollError(f"--address {spec.address} is not an address of this machine "
                              "(`ip -br addr` lists them)") from None
    low, high = spec.port_range
    if not 1024 <= low <= high <= 65535:
        raise EnrollError(f"--port-range {low}-{high}: LOW-HIGH with 1024 <= LOW <= HIGH <= 65535")
    if low <= spec.cri_port <= high:
        raise EnrollError(f"--port-range {low}-{high} holds the CRI front's port {spec.cri_port}")
    record = spec.directory / RECORD
    if record.exists():
        raise EnrollError(f"this machine is already a hypervisor ({record} exists); to onboard it again into "
                          f"another fleet, stop its CRI front and remove {spec.directory} first")
    with socket.socket(socket.AF_INET6 if ":" in spec.address else socket.AF_INET) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a listener is in the way, not TIME_WAIT
        try:
            taken.bind((spec.address, spec.cri_port))
            taken.listen(1)
        except OSError as err:
            raise EnrollError(f"port {spec.cri_port} on {spec.address} is in use ({err.strerror}): another CRI "
                              "front, or a kubelet? Choose one with --cri-port") from None


def _ranges(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.replace("\n", ",").split(","):
        low, _, high = part.strip().partition("-")
        if low.strip().isdigit():
            out.append((int(low), int(high or low)))
    return out


def reserve_ports(spec: MachineSpec, say: Callable[[str], None]) -> None:
    """Keep the pods' ports and the CRI port out of the kernel's ephemeral ports: an outgoing connection
    bound to one (an etcd peer's, a CRI stream's) would make a pod's listen fail with EADDRINUSE."""
    low, high = spec.port_range
    want = [(low, high), (spec.cri_port, spec.cri_port)]
    have = _ranges(RESERVED_PORTS.read_text()) if RESERVED_PORTS.exists() else []
    missing = [r for r in want if not any(a <= r[0] and r[1] <= b for a, b in have)]
    text = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in sorted(set(have + want)))
    if missing:
        try:
            RESERVED_PORTS.write_text(text)
        except OSError as err:
            raise EnrollError(f"reserving ports {low}-{high} ({RESERVED_PORTS}): {err.strerror}") from None
        say(f"reserved ports {low}-{high} and {spec.cri_port} from ephemeral ports (net.ipv4.ip_local_reserved_ports)")
    if spec.sysctl_file is not None:
        line = f"net.ipv4.ip_local_reserved_ports = {text}\n"
        if not spec.sysctl_file.exists() or spec.sysctl_file.read_text() != line:
            spec.sysctl_file.parent.mkdir(parents=True, exist_ok=True)
            spec.sysctl_file.write_text(line)
            say(f"wrote {spec.sysctl_file} (the reservation after a reboot)")


def inotify_note(instances: int) -> str | None:
    """A warning when root's inotify instances (`fs.inotify.max_user_instances`) leave room for few control
    planes: a kube-apiserver that finds none left stops noticing renewed certificates until it retries."""
    if instances >= INOTIFY_ADVISED:
        return None
    room = max(0, (instances - 8) // INOTIFY_PER_CONTROL_PLANE)  # 8: containerd, its shims and the front
    return (f"warning: fs.inotify.max_user_instances is {instances}, shared by every process of root here: room "
            f"for about {room} control planes ({INOTIFY_PER_CONTROL_PLANE} each); raise it before placing more "
            f"(sysctl -w fs.inotify.max_user_instances={INOTIFY_ADVISED}, and in /etc/sysctl.d for boots)")


def warn_inotify(say: Callable[[str], None], source: Path = INOTIFY_INSTANCES) -> None:
    """Say `inotify_note`'s warning, if any (an unreadable limit says nothing)."""
    try:
        note = inotify_note(int(source.read_text()))
    except (OSError, ValueError):
        return
    if note:
        say(note)


def containerd_release(spec: MachineSpec) -> configs.ContainerdRelease:
    """The release of the machine's containerd (`--version`); EnrollError when it is none gitops configures."""
    try:
        return configs.release_of(spec.containerd_binary)
    except configs.ContainerdError as err:
        raise EnrollError(f"--containerd-binary {spec.containerd_binary}: {err}") from None


def configure_containerd(spec: MachineSpec, release: configs.ContainerdRelease, say: Callable[[str], None]) -> None:
    """containerd's config as gitops needs it, in the version `release` reads; containerd restarted if it
    changed; its CRI answering."""
    say(f"found containerd {release.version} (config version {release.config_version})"
        + ("" if release.supported else ": out of support upstream, configured all the same; gitops builds and "
                                        "tests containerd 2.x"))
    text = configs.containerd_config(spec.paths, spec.address, spec.sandbox_image, release=release,
                                     shim=configs.shim_beside(spec.containerd_binary))
    path = spec.containerd_config
    before = path.read_text() if path.exists() else None
    if before != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        if before is not None:
            backup = path.with_name(path.name + ".before-gitops")
            if not backup.exists():
                backup.write_text(before)
                say(f"kept the former containerd config as {backup}")
        path.write_text(text)
        say(f"wrote {path} (CRI: host network, restrict_oom_score_adj, streams on {spec.address})")
        if spec.restart:
            done = subprocess.run(shlex.split(spec.restart), capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise EnrollError(f"restarting containerd ({spec.restart}) failed: "
                                  f"{(done.stderr or done.stdout).strip()[:500]}")
            say(f"restarted containerd ({spec.restart})")
    endpoint = CRIEndpoint.unix("this machine", spec.paths.socket)
    deadline = time.monotonic() + 60
    while True:
        try:
            with CRIClient(endpoint, timeout=2) as client:
                if client.status().ready:
                    return
        except CRIError:
            pass
        if time.monotonic() > deadline:
            raise EnrollError(f"containerd's CRI does not answer on {spec.paths.socket} (is containerd running? "
                              "`systemctl status containerd`)")
        time.sleep(0.5)


def machine_key(spec: MachineSpec):  # type: ignore[no-untyped-def]
    """This machine's front key: made here on the first run, kept (0600) and reused by a later one."""
    spec.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = spec.directory / KEY
    if path.exists():
        return load_key_pem(path.read_bytes())
    key = generate_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key_to_pem(key))
    return key


def init(spec: MachineSpec, say: Callable[[str], None], timeout: float = 3600) -> Enrolled:
    """Make this machine a hypervisor of the fleet whose CA hashes to `spec.ca_hash` (see the module)."""
    check(spec)
    release = containerd_release(spec)
    reserve_ports(spec, say)
    warn_inotify(say)
    configure_containerd(spec, release, say)
    key = machine_key(spec)
    fingerprint = key_hash(key.public_key())
    request = Request(csr_for(key, spec.address), spec.address, spec.cri_port, spec.data_dir, *spec.port_range,
                      interface=interface_of(spec.address))
    enrollment = Enrollment(key, request, spec.ca_hash)
    say(f"this machine's key: {fingerprint}")
    say("waiting for the fleet; where gitops runs:")
    say(f"  gitops hypervisor add REPO --name NAME --address {spec.address} --cri-port {spec.cri_port} "
        f"--fingerprint {fingerprint} --port-range {spec.port_range[0]}-{spec.port_range[1]} [--public]")
    delivered = enrollment.wait(timeout)
    d = spec.directory
    (d / "ca.crt").write_text(delivered.ca_pem)
    pem = d / "server.pem"
    fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(delivered.cert_pem + key_to_pem(key))
    spec.front_config.write_text(configs.front_config(spec.address, spec.cri_port, pem, d / "ca.crt",
                                                      spec.paths.socket))
    record = d / RECORD
    record.write_text(json.dumps({"address": spec.address, "criPort": spec.cri_port, "caHash": spec.ca_hash,
                                  "keyHash": fingerprint, "containerdSocket": spec.paths.socket,
                                  "dataDir": spec.data_dir}, indent=2, sort_keys=True) + "\n")
    say(f"enrolled: the fleet's certificate is installed ({pem}); the CRI front listens on "
        f"{spec.address}:{spec.cri_port} (TLS only, client certificates of the fleet's CA)")
    return Enrolled(spec.front_config, record)
