"""`gitops lab`: real containerd "hypervisors", each a machine of its own on the lab's network,
optionally behind mTLS.

Each hypervisor is a network namespace on the lab bridge (`gitops.lab.network`), address
10.249.<T>.<N> for the lab of `--subnet 127.0.<T>`: its containerd, its mTLS front and every pod it
runs (host-network pods share containerd's namespace) live there, so a link can be cut, a machine
partitioned or powered off (`power_off`, `power_on`, `partition`, `heal`).

Layout of a lab directory:
    lab.json                 state: subnet, hypervisors, started processes (PID + start time), images
    images/lab-images.tar    images built from host binaries (one archive, shared layers)
    pki/                     the lab's fleet: its hypervisor CA (fleet/state.json), gitops's client certificate
    hv-N/front/              what `gitops hypervisor init` made on the machine: its key, certificate, front config
    hv-N/                    one containerd: config, root, state, sockets, logs (+ haproxy)
    hv-N/data/               the hypervisor's data dir (annotation gitops.infra/data-dir):
                             node files gitops mounts into pods

Images: pause, haproxy and keepalived from the host's Debian packages, the files agent, the jump host
(the host's sshd, see gitops.compile.jumphost), and kube-apiserver / kube-controller-manager /
kube-scheduler per Kubernetes version and etcd per etcd version: the real binaries
scripts/build-kubernetes.sh built from their Go modules (gitops.lab.kubebin, gitops.lab.recipes). They
are also tagged under the upstream names default Clusters use (registry.k8s.io/kube-apiserver:v1.37.2,
registry.k8s.io/etcd:3.7.3-0, ...): the alias table is in lab.json and `gitops lab status`.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import yaml

from gitops.logs import event
from gitops.cri.client import CRIClient
from gitops.cri.errors import CRIError
from gitops import procs
from gitops.lab import hostcheck, images, network, recipes as lab_images
from gitops.lab.netns import RECORD, release
from gitops.lab.network import LabNetwork, Machine, enter
from gitops.lab.errors import LabError
from gitops.lab.recipes import DEFAULT_KUBERNETES_VERSIONS
from gitops.model import versions as versions_mod
from gitops.model.components import COMPONENTS, OIDC
from gitops.model.resources import (
    DATA_DIR_ANNOTATION,
    Hypervisor,
    LocalCRIEndpoint,
    PortRange,
    RemoteCRIEndpoint,
)
from gitops.hypervisor.enroll import deliver, fetch_request
from gitops.hypervisor.configs import (DEFAULT_CRI_PORT, ContainerdError, ContainerdPaths, containerd_config,
                                      release_of, shim_beside)
from gitops.hypervisor.fleet import CERT_DAYS, LiteralDumper, ca_hash as fleet_hash, fleet_ca
from gitops.pki import CertKey, cert_to_pem, issue_cert, sign_public_key
from gitops.state.store import LocalDirStore

log = logging.getLogger(__name__)

STATE_FILE = "lab.json"
IMAGES_ARCHIVE = "lab-images.tar"
#: the public hypervisors' archive: IMAGES_ARCHIVE without the control-plane images
PUBLIC_ARCHIVE = "lab-images-public.tar"
DEFAULT_SUBNET = "127.0.10"
DEFAULT_FIRST_PORT = 30000
PORTS_PER_HYPERVISOR = 1000
READY_TIMEOUT = 30.0
_SOCKET_MAX = 100  # sun_path is 108 bytes; keep room for the ".ttrpc" suffix
_REQUIRED = ("containerd", "ctr", "runc", "containerd-shim-runc-v2")


def _containerd(program: str = "containerd") -> str:
    """The lab's `containerd`, `ctr` or `containerd-shim-runc-v2`."""
    return program


def _containerd_config(hv_dir: Path, ip: str, sandbox_image: str) -> str:
    """The config of a lab containerd in `hv_dir`, in the version its release reads."""
    try:
        release = release_of(_containerd())
    except ContainerdError as err:
        raise LabError(str(err)) from None
    # as `gitops hypervisor init --containerd-binary` writes it
    return containerd_config(ContainerdPaths.under(hv_dir), ip, sandbox_image, release=release,
                             shim=shim_beside(_containerd()))


def default_dir() -> Path:
    """$GITOPS_LAB_DIR, else ./.lab."""
    return Path(os.environ.get("GITOPS_LAB_DIR") or ".lab").resolve()


@dataclass(frozen=True)
class LabHypervisor:
    """One lab hypervisor: a containerd, and with --remote an haproxy mTLS front."""

    name: str
    public: bool
    ip: str
    port_range: PortRange
    dir: str
    socket: str
    remote_uri: str = ""
    #: where gitops keeps node files on this hypervisor (absolute; under the lab directory)
    data_dir: str = ""
    ca_pem: str = field(default="", repr=False)
    client_cert_pem: str = field(default="", repr=False)
    client_key_pem: str = field(default="", repr=False)
    #: its network namespace and its port on the lab bridge (`gitops.lab.network`)
    netns: str = ""
    port: str = ""
    subnet: str = ""

    @property
    def node_data_dir(self) -> str:
        return self.data_dir or str(Path(self.dir) / "data")

    def machine(self) -> Machine:
        if not self.netns:
            raise LabError(f"lab hypervisor {self.name} has no network namespace (a lab from an older gitops)")
        return Machine(self.name, self.netns, self.port, self.ip, self.subnet)

    def run(self, argv: list[str]) -> list[str]:
        """`argv` as it runs on this machine (in its network namespace)."""
        return enter(self.netns, argv) if self.netns else argv

    def local(self) -> Hypervisor:
        """This hypervisor through its unix socket."""
        return Hypervisor(self.name, self.public, self.ip, self.port_range, LocalCRIEndpoint(self.socket),
                          data_dir=self.node_data_dir)

    def remote(self) -> Hypervisor:
        """This hypervisor through its mTLS front (only for --remote labs)."""
        if not self.remote_uri:
            raise LabError(f"lab hypervisor {self.name} has no remote endpoint (lab up --remote)")
        ep = RemoteCRIEndpoint(self.remote_uri, self.ca_pem, self.client_cert_pem, self.client_key_pem)
        return Hypervisor(self.name, self.public, self.ip, self.port_range, ep, data_dir=self.node_data_dir)

    def hypervisor(self) -> Hypervisor:
        """The remote endpoint if there is one, else the local socket."""
        return self.remote() if self.remote_uri else self.local()


@dataclass(frozen=True)
class LabInfo:
    dir: Path
    hypervisors: tuple[LabHypervisor, ...]
    images: dict[str, str]  # role (pause, haproxy, agent, etcd/3.7.3, kube-apiserver/v1.37.2...) -> image ref
    processes: tuple[procs.Proc, ...]
    aliases: dict[str, str] = field(default_factory=dict)  # alias (upstream name) -> lab image ref
    #: Kubernetes version (its real binaries are imported) -> the etcd version it runs by default
    kubernetes: dict[str, str] = field(default_factory=dict)
    #: `--subnet` (127.0.T): names the lab network (`gitops.lab.network.LabNetwork`)
    subnet: str = ""

    def etcd_image(self, version: str | None = None) -> str:
        """The lab ref of etcd `version` ("3.7.3"; default: the newest imported)."""
        found = {role.partition("/")[2]: ref for role, ref in self.images.items() if role.startswith("etcd/")}
        if not found:
            raise LabError("this lab has no etcd image")
        return found[version] if version else found[max(found, key=versions_mod.parse)]

    def get(self, name: str) -> LabHypervisor:
        for hv in self.hypervisors:
            if hv.name == name:
                return hv
        raise LabError(f"no lab hypervisor named {name!r}")


@dataclass(frozen=True)
class ProcStatus:
    proc: procs.Proc
    alive: bool


@dataclass(frozen=True)
class LabStatus:
    dir: Path
    hypervisors: tuple[LabHypervisor, ...]
    processes: tuple[ProcStatus, ...]
    mounts: tuple[str, ...]
    images: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    kubernetes: dict[str, str] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return bool(self.processes) and all(p.alive for p in self.processes)


@dataclass(frozen=True)
class DownReport:
    stopped: tuple[str, ...]
    unmounted: tuple[str, ...]
    removed: bool
    #: what was undone of workers still joined on the lab's runtimes ("<join --dir>: <what>")
    workers: tuple[str, ...] = ()


# ---------------------------------------------------------------------------- state

def _state_path(lab_dir: Path) -> Path:
    return lab_dir / STATE_FILE


def _save(lab_dir: Path, hvs: list[LabHypervisor] | tuple[LabHypervisor, ...],
          started: list[procs.Proc] | tuple[procs.Proc, ...], imgs: dict[str, str],
          aliases: dict[str, str], kubernetes: dict[str, str], subnet: str) -> None:
    state = {
        "version": 1,
        "subnet": subnet,
        "hypervisors": [{"name": h.name, "public": h.public, "ip": h.ip,
                         "portRange": [h.port_range.low, h.port_range.high], "dir": h.dir,
                         "socket": h.socket, "remoteURI": h.remote_uri, "dataDir": h.node_data_dir,
                         "netns": h.netns, "port": h.port, "subnet": h.subnet}
                        for h in hvs],
        "processes": [p.to_json() for p in started],
        "images": imgs,
        "aliases": aliases,
        "kubernetes": kubernetes,
    }
    tmp = _state_path(lab_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(_state_path(lab_dir))


def _load(lab_dir: Path) -> LabInfo | None:
    path = _state_path(lab_dir)
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LabError(f"unreadable lab state {path}: {err}") from err
    pki = lab_dir / "pki"
    pems = {}
    if (pki / "ca.crt").exists():
        pems = {"ca_pem": (pki / "ca.crt").read_text(),
                "client_cert_pem": (pki / "client.crt").read_text(),
                "client_key_pem": (pki / "client.key").read_text()}
    hvs = []
    for h in state["hypervisors"]:
        extra = pems if h["remoteURI"] else {}
        hvs.append(LabHypervisor(h["name"], h["public"], h["ip"], PortRange(*h["portRange"]), h["dir"],
                                 h["socket"], h["remoteURI"], data_dir=h.get("dataDir", ""), netns=h.get("netns", ""),
                                 port=h.get("port", ""), subnet=h.get("subnet", ""), **extra))
    return LabInfo(lab_dir, tuple(hvs), dict(state["images"]),
                   tuple(procs.Proc.from_json(p) for p in state["processes"]),
                   dict(state.get("aliases") or {}), dict(state.get("kubernetes") or {}), state.get("subnet", ""))


def _save_info(lab: LabInfo, hvs: tuple[LabHypervisor, ...] | None = None,
               started: tuple[procs.Proc, ...] | list[procs.Proc] | None = None,
               aliases: dict[str, str] | None = None) -> None:
    _save(lab.dir, lab.hypervisors if hvs is None else hvs, lab.processes if started is None else started,
          lab.images, lab.aliases if aliases is None else aliases, lab.kubernetes, lab.subnet)


def info(lab_dir: Path | None = None) -> LabInfo:
    """The lab recorded in `lab_dir`; LabError if there is none."""
    lab_dir = (lab_dir or default_dir()).resolve()
    found = _load(lab_dir)
    if found is None:
        raise LabError(f"no lab in {lab_dir} (gitops lab up)")
    return found


# ---------------------------------------------------------------------------- helpers

def _wait(what: str, check: Callable[[], bool], timeout: float, alive: procs.Proc | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        if alive is not None and not alive.alive():
            raise LabError(f"{what}: {alive.argv[0]} exited; see {alive.log}")
        time.sleep(0.1)
    raise LabError(f"{what}: not ready after {timeout:g}s" + (f"; see {alive.log}" if alive else ""))


def _cri_ready(hv: Hypervisor) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with CRIClient(hv.cri_endpoint(), timeout=2) as client:
                return client.status().ready
        except CRIError:
            return False
    return check


def _port_open(ip: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection((ip, port), timeout=1):
                return True
        except OSError:
            return False
    return check


def _run(argv: list[str], what: str, timeout: float = 120) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LabError(f"{what}: {err}") from err
    if proc.returncode != 0:
        raise LabError(f"{what}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def _ctr_import(socket_path: str, tarball: Path, hv: str) -> None:
    _run([_containerd("ctr"), "-a", socket_path, "-n", "k8s.io", "images", "import", str(tarball)],
         f"importing {tarball.name} into {hv}")


#: image imports running at once (a lab of many hypervisors would otherwise unpack them all together)
IMPORTS_AT_ONCE = 4


def _import_everywhere(hvs: list[LabHypervisor], tarball: Path, public: Path | None = None) -> None:
    """`tarball` (`public` into the public ones, if given) into each of `hvs` at once (a thread per
    `ctr import`: each is its own containerd's work)."""
    if not hvs:
        return
    pool = ThreadPoolExecutor(max_workers=min(len(hvs), IMPORTS_AT_ONCE))
    try:
        for done in as_completed([pool.submit(_ctr_import, hv.socket, public if hv.public and public else tarball,
                                              hv.name) for hv in hvs]):
            done.result()  # the first failure ends it: what is still queued is cancelled below
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ctr_tag(socket_path: str, src: str, dst: str, hv: str) -> None:
    """Tag `src` as `dst` in the k8s.io namespace; containerd's CRI plugin sees it at once."""
    _run([_containerd("ctr"), "-a", socket_path, "-n", "k8s.io", "images", "tag", "--force", src, dst],
         f"tagging {src} as {dst} in {hv}")


def _check_host(remote: bool) -> None:
    if os.geteuid() != 0:
        raise LabError("the lab runs containerd and needs root")
    for binary in _REQUIRED + (("haproxy",) if remote else ()):
        if shutil.which(binary) is None:
            raise LabError(f"{binary} not found (run scripts/install-deps.sh)")


# ---------------------------------------------------------------------------- up / down

def up(lab_dir: Path | None = None, *, hypervisors: int = 1, public: int = 0, remote: bool = False,
       subnet: str = DEFAULT_SUBNET, cri_port: int = DEFAULT_CRI_PORT,
       first_port: int = DEFAULT_FIRST_PORT,
       kubernetes_versions: Iterable[str] = DEFAULT_KUBERNETES_VERSIONS,
       etcd_versions: Iterable[str] = (), data_tmpfs_mib: int = 0) -> LabInfo:
    """Start `hypervisors` containerd instances (the first `public` of them public).

    Every hypervisor gets the lab images, tagged under the upstream names a default Cluster uses too;
    the private ones also the real control-plane binaries of each of `kubernetes_versions` and the
    etcd each runs by default (and `etcd_versions`): control-plane Nodes sit on private hypervisors.
    With `data_tmpfs_mib`, each hypervisor's node data (etcd's WAL and database among it) is a tmpfs of
    that size: the dedicated disk etcd asks for, where the host's one disk, shared with every other job on
    it, can hold a write back for seconds (`down` unmounts it; a power cut of a machine keeps it, as a
    disk would).
    """
    lab_dir = (lab_dir or default_dir()).resolve()
    versions = tuple(dict.fromkeys(lab_images.normalize_version(v) for v in kubernetes_versions))
    if not 1 <= hypervisors <= 250:
        raise LabError("--hypervisors must be between 1 and 250")
    if not 0 <= public <= hypervisors:
        raise LabError("--public must be between 0 and --hypervisors")
    if not 0 <= data_tmpfs_mib <= 65536:
        raise LabError("--data-tmpfs must be between 0 (the lab directory's disk) and 65536 MiB")
    LabNetwork.for_subnet(subnet)
    if len(str(lab_dir / "hv-999" / "containerd.sock.ttrpc")) > _SOCKET_MAX:
        raise LabError(f"lab directory path too long for unix sockets: {lab_dir}")
    _check_host(remote)
    existing = _load(lab_dir)
    if existing is not None:
        if any(p.alive() for p in existing.processes):
            raise LabError(f"a lab is already up in {lab_dir} (gitops lab down first)")
        down(lab_dir)
    lab_dir.mkdir(parents=True, exist_ok=True)
    hostcheck.record(lab_dir)
    try:
        return _up(lab_dir, hypervisors, public, remote, subnet, cri_port, first_port, versions,
                   tuple(v for v in etcd_versions if v.strip()), data_tmpfs_mib)
    except BaseException:
        event(log, logging.WARNING, "lab up failed; tearing down what was started", dir=str(lab_dir))
        down(lab_dir)
        raise


def write_archives(recipes: dict[str, images.ImageRecipe], aliases: dict[str, str],
                   directory: Path) -> tuple[Path, Path]:
    """The lab's two image archives: every image (IMAGES_ARCHIVE, for the private hypervisors) and the
    public hypervisors' (ingress, SIP services), without the control-plane images, most of the bytes.
    Each is one import per hypervisor, each layer stored once, the aliases as extra repo tags; both take
    their layers from one cache, so a layer they share (the base's) is built once."""
    by_ref: dict[str, list[str]] = {}
    for alias, ref in aliases.items():
        by_ref.setdefault(ref, []).append(alias)
    layers = images.Layers()
    every = images.build_archive([(r, by_ref.get(r.ref, [])) for r in recipes.values()],
                                 directory / IMAGES_ARCHIVE, layers)
    private = lab_images.controlplane_roles(recipes)
    public = images.build_archive([(r, by_ref.get(r.ref, [])) for role, r in recipes.items() if role not in private],
                                  directory / PUBLIC_ARCHIVE, layers)
    return every, public


def _up(lab_dir: Path, n: int, public: int, remote: bool, subnet: str, cri_port: int,
        first_port: int, versions: tuple[str, ...], etcd_versions: tuple[str, ...], data_tmpfs_mib: int) -> LabInfo:
    net = LabNetwork.for_subnet(subnet)
    if network.leftover(net):
        event(log, logging.WARNING, "the lab network of a lab that no longer runs removed", subnet=subnet,
              removed=network.remove_leftover(net))
    if network.exists(net.netns):
        raise LabError(f"subnet {subnet} is in use (its lab network {net.netns} exists): another lab runs on it; "
                       "choose another subnet or stop that lab first")
    recipes = lab_images.lab_recipes(versions, etcd_versions)
    kinds = {v: versions_mod.etcd_for(v) for v in versions}  # each version and the etcd it runs by default
    aliases = lab_images.upstream_aliases(recipes)
    image_refs = {role: r.ref for role, r in recipes.items()}
    archive, public_archive = write_archives(recipes, aliases, lab_dir / "images")
    machines = [net.hypervisor(i, f"lab-hv-{i}") for i in range(1, n + 1)]
    client = ca = None
    if remote:
        ca, client = _lab_fleet(lab_dir / "pki")
    hvs: list[LabHypervisor] = []
    started: list[procs.Proc] = []
    _save(lab_dir, hvs, started, image_refs, aliases, kinds, subnet)  # first: `down` removes what follows
    network.create_lab(net)
    for i, machine in enumerate(machines, start=1):
        name, ip = machine.name, machine.ip
        hv_dir = lab_dir / f"hv-{i}"
        for sub in ("cni/bin", "cni/conf", "logs", "data"):
            (hv_dir / sub).mkdir(parents=True, exist_ok=True)
        if data_tmpfs_mib:
            _mount_tmpfs(hv_dir / "data", data_tmpfs_mib)
        sock = hv_dir / "containerd.sock"
        low = first_port + (i - 1) * PORTS_PER_HYPERVISOR
        hv = LabHypervisor(
            name=name, public=i <= public, ip=ip, port_range=PortRange(low, low + PORTS_PER_HYPERVISOR - 1),
            dir=str(hv_dir), socket=str(sock), remote_uri=f"tcp://{ip}:{cri_port}" if remote else "",
            data_dir=str(hv_dir / "data"),
            ca_pem=ca.cert_pem if ca else "", client_cert_pem=client.cert_pem if client else "",
            client_key_pem=client.key_pem if client else "", netns=machine.netns, port=machine.port,
            subnet=machine.subnet)
        hvs.append(hv)
        _save(lab_dir, hvs, started, image_refs, aliases, kinds, subnet)
        network.create_machine(machine)
        network.reserve_ports(machine, f"{hv.port_range.low}-{hv.port_range.high},{cri_port}")
        config = hv_dir / "containerd.toml"
        config.write_text(_containerd_config(hv_dir, ip, image_refs["pause"]))
        ctrd = _spawn_containerd(hv)
        started.append(ctrd)
        _save(lab_dir, hvs, started, image_refs, aliases, kinds, subnet)
        _wait(f"containerd for {name}", _cri_ready(hv.local()), READY_TIMEOUT, ctrd)
    # the images into every hypervisor at once: each import is its own containerd's work (ingest, unpack),
    # most of a lab's start when done one after another
    _import_everywhere(hvs, archive, public_archive)
    if remote:  # each machine onboarded as a real one is: `gitops hypervisor init` on it, the fleet's side here
        assert ca is not None
        fronts = []
        for hv in hvs:  # all at once: each waits for the fleet
            front = _spawn_init(hv, fleet_hash(ca), cri_port, image_refs["pause"])
            fronts.append(front)
            started.append(front)
            _save(lab_dir, hvs, started, image_refs, aliases, kinds, subnet)
        for hv, front in zip(hvs, fronts):
            _enroll(hv, front, ca, cri_port)
            _wait_front(hv, front)
    for hv in hvs:
        event(log, logging.INFO, "lab hypervisor ready", hypervisor=hv.name, ip=hv.ip, remote=remote)
    return LabInfo(lab_dir, tuple(hvs), image_refs, tuple(started), aliases, kinds, subnet)


def _mount_tmpfs(path: Path, mib: int) -> None:
    """A tmpfs of `mib` MiB (mode 0700) on `path` (`down` unmounts everything under the lab directory)."""
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "gitops-lab-data", str(path)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise LabError(f"mounting a {mib} MiB tmpfs on {path}: {(done.stderr or done.stdout).strip()}")


def import_provider_image(info: LabInfo) -> str:
    """The image SIP's OIDC provider runs (`recipes.python_recipe`: this gitops on the interpreter it runs on),
    tagged under the provider's default image too, into the lab's public hypervisors, where auth pods run.
    Built on demand: only labs that run a provider need it. Returns its lab ref."""
    recipe = lab_images.python_recipe()
    alias = COMPONENTS[OIDC].default_image
    archive = images.build_archive([(recipe, [alias])], info.dir / "images" / recipe.filename)
    _import_everywhere([hv for hv in info.hypervisors if hv.public], archive)
    event(log, logging.INFO, "the OIDC provider's image imported", ref=recipe.ref, alias=alias,
          hypervisors=sum(1 for hv in info.hypervisors if hv.public))
    return recipe.ref


def _lab_fleet(pki_dir: Path) -> tuple[CertKey, CertKey]:
    """The lab's fleet: its hypervisor CA in a recorded state of its own (`pki/fleet/state.json`), and the
    client certificate gitops uses for every lab front (`pki/ca.crt`, `client.crt`, `client.key`)."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(pki_dir, 0o700)
    (pki_dir / "fleet").mkdir(mode=0o700, exist_ok=True)
    store = LocalDirStore(pki_dir / "fleet")
    state, ca = fleet_ca(store.load())
    store.save(state)
    client = issue_cert(ca, "gitops-lab-client", organizations=["gitops"], client=True)
    (pki_dir / "ca.crt").write_text(ca.cert_pem)
    (pki_dir / "client.crt").write_text(client.cert_pem)
    (pki_dir / "client.key").write_text(client.key_pem)
    return ca, client


def _spawn_init(hv: LabHypervisor, ca_hash: str, cri_port: int, sandbox_image: str) -> procs.Proc:
    """`gitops hypervisor init` on lab machine `hv`, as an operator runs it on a new machine (its containerd is
    already configured and running: the lab is its init system). Once enrolled it becomes the front (haproxy)."""
    hv_dir = Path(hv.dir)
    argv = [sys.executable, "-m", "gitops", "hypervisor", "init", "--address", hv.ip, "--ca-hash", ca_hash,
            "--cri-port", str(cri_port), "--dir", str(hv_dir / "front"), "--containerd-binary", _containerd(),
            "--containerd-config",
            str(hv_dir / "containerd.toml"), "--containerd-root", str(hv_dir), "--restart", "",
            "--data-dir", hv.node_data_dir, "--sandbox-image", sandbox_image, "--timeout", str(READY_TIMEOUT * 4),
            "--port-range", f"{hv.port_range.low}-{hv.port_range.high}",
            "--sysctl-file", str(hv_dir / "front" / "sysctl.conf")]
    return procs.spawn("haproxy", hv.name, hv.run(argv), hv_dir / "logs" / "haproxy.log", hv_dir)


def _enroll(hv: LabHypervisor, front: procs.Proc, ca: CertKey, cri_port: int) -> None:
    """The fleet's side for lab machine `hv` (`gitops hypervisor add` without a repo): its fingerprint read
    where `init` printed it, its key signed for its address, its certificate handed over."""
    log_path = Path(front.log)
    found: list[str] = []

    def printed() -> bool:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        found[:] = [line.split(": ", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("this machine's key: ")]
        return bool(found)

    _wait(f"gitops hypervisor init on {hv.name}", printed, READY_TIMEOUT, front)
    fingerprint = found[-1]
    _request, csr = fetch_request(hv.ip, cri_port, fingerprint)
    cert = sign_public_key(ca, csr.public_key(), f"cri-{hv.name}", ip_addresses=[hv.ip], server=True, days=CERT_DAYS)
    deliver(hv.ip, cri_port, fingerprint, ca.cert_pem, cert_to_pem(cert))


def _spawn_containerd(hv: LabHypervisor) -> procs.Proc:
    """Hypervisor `hv`'s containerd, on its machine, from its config (`hv.dir/containerd.toml`)."""
    hv_dir = Path(hv.dir)
    return procs.spawn("containerd", hv.name, hv.run([_containerd(), "--config", str(hv_dir / "containerd.toml")]),
                       hv_dir / "logs" / "containerd.log", hv_dir)


def _spawn_front(hv: LabHypervisor) -> procs.Proc:
    """Hypervisor `hv`'s mTLS front (haproxy on the config `gitops hypervisor init` wrote), on its machine: as a
    real machine's init system starts it again after a reboot."""
    hv_dir = Path(hv.dir)
    return procs.spawn("haproxy", hv.name, hv.run(["haproxy", "-db", "-f", str(hv_dir / "front" / "front.cfg")]),
                       hv_dir / "logs" / "haproxy.log", hv_dir)


def _wait_front(hv: LabHypervisor, front: procs.Proc) -> None:
    port = int(hv.remote_uri.rsplit(":", 1)[1])
    _wait(f"haproxy for {hv.name}", _port_open(hv.ip, port), READY_TIMEOUT, front)
    _wait(f"CRI over mTLS for {hv.name}", _cri_ready(hv.remote()), READY_TIMEOUT, front)


def add_runtime(lab_dir: Path, name: str, ip: str, netns: str | None = None) -> tuple[Path, procs.Proc]:
    """One more containerd in the lab, not a hypervisor (a worker's CRI): in `lab_dir/hv-<name>`, streaming
    on `ip`, in network namespace `netns` if given (its CNI bridge and pods then live there), with the lab
    images; recorded so `down` stops it. Returns its directory and process."""
    lab = info(lab_dir)
    hv_dir = lab.dir / f"hv-{name}"
    for sub in ("cni/bin", "cni/conf", "logs"):
        (hv_dir / sub).mkdir(parents=True, exist_ok=True)
    config = hv_dir / "containerd.toml"
    config.write_text(_containerd_config(hv_dir, ip, lab.images["pause"]))
    argv = [_containerd(), "--config", str(config)]
    ctrd = procs.spawn("containerd", name, enter(netns, argv) if netns else argv, hv_dir / "logs" / "containerd.log",
                       hv_dir)
    _save_info(lab, started=[*lab.processes, ctrd])
    _wait(f"containerd for {name}", _cri_ready(_runtime(name, hv_dir, ip)), READY_TIMEOUT, ctrd)
    _ctr_import(str(hv_dir / "containerd.sock"), lab.dir / "images" / IMAGES_ARCHIVE, name)
    return hv_dir, ctrd


def _runtime(name: str, hv_dir: Path, ip: str = "127.0.0.1") -> Hypervisor:
    """A runtime `add_runtime` started, as a Hypervisor its CRI client can reach."""
    return Hypervisor(name, False, ip, PortRange(1, 1), LocalCRIEndpoint(str(hv_dir / "containerd.sock")))


def kill_containerd(lab_dir: Path, name: str) -> None:
    """SIGKILL hypervisor `name`'s containerd, as a crash would (its containers run on under their shims);
    returns once its CRI socket no longer answers."""
    lab = info(lab_dir)
    hv = lab.get(name)
    [ctrd] = [p for p in lab.processes if p.role == "containerd" and p.hypervisor == name]
    if not ctrd.alive():
        raise LabError(f"the containerd of {name} is not running")
    os.kill(ctrd.pid, signal.SIGKILL)
    try:
        os.waitpid(ctrd.pid, 0)  # started by this process (`up`): reap it, or it lingers as a zombie
    except ChildProcessError:
        pass
    _wait(f"containerd of {name} gone", lambda: not _cri_ready(hv.local())(), READY_TIMEOUT)


def start_containerd(lab_dir: Path, name: str) -> procs.Proc:
    """Start hypervisor `name`'s containerd again on its config and state (after `kill_containerd`): it
    finds its pods and containers again. Recorded in place of the old process, so `down` stops it."""
    lab = info(lab_dir)
    hv = lab.get(name)
    [old] = [p for p in lab.processes if p.role == "containerd" and p.hypervisor == name]
    if old.alive():
        raise LabError(f"the containerd of {name} is still running (pid {old.pid})")
    ctrd = _spawn_containerd(hv)
    _save_info(lab, started=[ctrd if p == old else p for p in lab.processes])
    _wait(f"containerd for {name}", _cri_ready(hv.local()), READY_TIMEOUT, ctrd)
    return ctrd


def lose_hypervisor(lab_dir: Path, name: str) -> None:
    """Hypervisor `name` dies for good, as a machine switched off would: every pod on it stopped and removed,
    then its containerd killed (its CRI never answers again; `down` still cleans up after it)."""
    lab = info(lab_dir)
    _drain(lab.get(name).local())
    kill_containerd(lab_dir, name)


# ---------------------------------------------------------------------------- faults

def machine(lab: LabInfo, name: str) -> Machine:
    """The machine (network) of lab hypervisor or worker `name`."""
    for hv in lab.hypervisors:
        if hv.name == name:
            return hv.machine()
    from gitops.lab.netns import recorded

    found = recorded(lab.dir / f"hv-{name}")
    if found is None:
        names = [hv.name for hv in lab.hypervisors] + sorted(
            p.parent.name.removeprefix("hv-") for p in lab.dir.glob(f"hv-*/{RECORD}"))
        raise LabError(f"no lab machine named {name!r} (there are: {', '.join(names)})")
    return found


def power_off(lab_dir: Path | None, name: str) -> int:
    """Cut hypervisor `name`'s power: every process on it SIGKILLed at once, its link down, and what a power
    cut takes with the machine's memory gone too (the mounts its containers had). Its disk stays (root,
    data dir). Returns how many processes were killed."""
    lab = info(lab_dir)
    hv = lab.get(name)
    m = hv.machine()
    if not network.link_up(m) and not any(p.alive() for p in lab.processes if p.hypervisor == name):
        raise LabError(f"{name} is already powered off")
    killed = network.power_off(m)
    for p in lab.processes:  # started by this process (`up`): reap them, or they linger as zombies
        if p.hypervisor == name:
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                pass
    procs.unmount_under(Path(hv.dir) / "state")
    event(log, logging.WARNING, "lab machine powered off", machine=name, killed=killed)
    return killed


def power_on(lab_dir: Path | None, name: str) -> list[procs.Proc]:
    """Boot hypervisor `name` as after a power cut: what lived in memory (containerd's state, runc's) is gone,
    its link comes up, its containerd starts on its disk (and its mTLS front in a --remote lab). Its pods are
    as a reboot leaves them: known to containerd, not running. Returns the processes started."""
    lab = info(lab_dir)
    hv = lab.get(name)
    m = hv.machine()
    alive = [p for p in lab.processes if p.hypervisor == name and p.alive()]
    if alive or network.in_namespace(m.netns):
        raise LabError(f"{name} is running (gitops lab poweroff {name} first)")
    hv_dir = Path(hv.dir)
    procs.unmount_under(hv_dir / "state")
    _remove_cgroups(lab.dir, hv_dir.name)
    for volatile in ("state", "runc", "runc-v1"):  # a real machine keeps them in /run
        shutil.rmtree(hv_dir / volatile, ignore_errors=True)
    network.set_link(m, up=True)
    ctrd = _spawn_containerd(hv)
    started = [ctrd]
    replaced = {p for p in lab.processes if p.hypervisor == name}
    _save_info(lab, started=[p for p in lab.processes if p not in replaced] + started)
    _wait(f"containerd for {name}", _cri_ready(hv.local()), READY_TIMEOUT, ctrd)
    if hv.remote_uri:
        front = _spawn_front(hv)
        started.append(front)
        _save_info(info(lab.dir), started=[*info(lab.dir).processes, front])
        _wait_front(hv, front)
    event(log, logging.INFO, "lab machine powered on", machine=name)
    return started


def partition(lab_dir: Path | None, name: str, peers: Iterable[str] = ()) -> list[str]:
    """Drop machine `name`'s traffic both ways while it runs on: all of it, or only to and from the machines
    `peers` (`host` is the host, where gitops and the tests run). Returns what it is now cut from."""
    lab = info(lab_dir)
    m = machine(lab, name)
    addresses = []
    for peer in peers:
        if peer == name:
            raise LabError(f"{name} cannot be partitioned from itself")
        addresses.append(LabNetwork(m.subnet).host_ip if peer == "host" else machine(lab, peer).ip)
    network.partition(m, addresses)
    event(log, logging.WARNING, "lab machine partitioned", machine=name, peers=list(peers) or "all")
    return network.partitioned_from(m)


def heal(lab_dir: Path | None, name: str) -> bool:
    """Undo every partition of machine `name`; whether there was one."""
    lab = info(lab_dir)
    m = machine(lab, name)
    healed = network.heal(m)
    event(log, logging.INFO, "lab machine healed", machine=name, was_partitioned=healed)
    return healed


def _drain(hv: Hypervisor) -> list[str]:
    """Stop and remove every pod sandbox of a lab runtime (best effort)."""
    removed = []
    try:
        with CRIClient(hv.cri_endpoint(), timeout=5, slow_timeout=30) as client:
            for sandbox in client.list_sandboxes():
                client.stop_sandbox(sandbox.id)
                client.remove_sandbox(sandbox.id)
                removed.append(f"{hv.name}/sandbox/{sandbox.name}")
    except CRIError as err:
        event(log, logging.WARNING, "cannot drain hypervisor", hypervisor=hv.name, error=str(err))
    return removed


def _remove_cgroups(lab_dir: Path, hv_dir: str = "hv-*") -> None:
    """Remove the (now empty) cgroups runc made for the lab's containers (of every runtime, or of the one in
    `lab_dir/hv_dir`), from runc's state."""
    for state_file in sorted(lab_dir.glob(f"{hv_dir}/runc/*/*/state.json")):
        try:
            paths = json.loads(state_file.read_text()).get("cgroup_paths") or {}
        except (OSError, ValueError):
            continue
        for path in sorted(set(paths.values())):
            try:
                os.rmdir(path)
            except OSError:
                pass  # already gone, or shared


def down(lab_dir: Path | None = None) -> DownReport:
    """Stop everything the lab in `lab_dir` started, unmount what is under it, remove its files.

    Only recorded processes (PID and start time must match), containerd/shim/runc/haproxy
    processes whose command line names the lab directory (containerd shims) and their
    descendants are signalled; never this process or its ancestors (sudo, time, a shell).
    A worker still joined on a lab worker's runtime goes with it: its kubelet and kube-proxy are
    stopped first (so they start no pod while the runtime drains), the processes left in its
    namespace with the namespace, then its mounts (kubelet's, in its `join --dir`) are undone and
    that directory removed (`gitops.worker.run.abandon`).
    """
    from gitops.lab.netns import joined
    from gitops.worker import run as worker_run

    lab_dir = (lab_dir or default_dir()).resolve()
    if not lab_dir.exists():
        return DownReport((), (), False)
    state = _load(lab_dir)
    stopped: list[str] = []
    undone: list[str] = []  # of the workers still joined
    workers = [directory for record in sorted(lab_dir.glob(f"hv-*/{RECORD}")) for directory in joined(record.parent)]
    for directory in workers:
        undone += [f"{directory}: {what}" for what in worker_run.stop(directory)]
    if state is not None:
        alive = {(p.role, p.hypervisor) for p in state.processes if p.alive()}
        for hv in state.hypervisors:
            if ("containerd", hv.name) in alive:
                stopped += _drain(hv.local())
        for record in sorted(lab_dir.glob(f"hv-*/{RECORD}")):  # a worker's runtime: its pods' networks go too
            name = record.parent.name.removeprefix("hv-")
            if ("containerd", name) in alive:
                stopped += _drain(_runtime(name, record.parent))
        for role in ("haproxy", "containerd"):
            recorded = [p for p in state.processes if p.role == role and p.alive()]
            procs.terminate([(p.pid, p.start_time) for p in recorded])
            stopped += [f"{p.hypervisor}/{p.role}[{p.pid}]" for p in recorded]
    kids = procs.children_map()
    leftovers = procs.pids_referencing(lab_dir, procs.LAB_PROGRAMS)
    for pid in list(leftovers):
        leftovers += procs.descendants(pid, kids)
    mine = {os.getpid(), *procs.ancestors(os.getpid())}
    leftovers = [pid for pid in leftovers if pid not in mine]
    if leftovers:
        sockets = [procs.shim_socket(procs.cmdline(pid)) for pid in leftovers]
        # Orphaned shims and container processes: nothing to shut down gracefully.
        procs.terminate([(pid, procs.start_time(pid)) for pid in sorted(set(leftovers))], timeout=0)
        for sock in sockets:
            if sock is not None and sock.is_socket():
                sock.unlink()
        stopped += [f"leftover[{pid}]" for pid in sorted(set(leftovers))]
    _remove_cgroups(lab_dir)
    unmounted: list[str] = []
    for directory in workers:  # before the namespaces' records go: a failure here leaves them for the next down
        unmounted += procs.mounts_under(directory)
        undone += [f"{directory}: {what}" for what in worker_run.abandon(directory)
                   if not what.startswith(("unmounted ", "stopped "))]
    for hv_dir in sorted(lab_dir.glob("hv-*")):
        stopped += release(hv_dir)
    if state is not None:
        for hv in state.hypervisors:
            if hv.netns:
                stopped += network.remove_machine(hv.machine())
        if state.subnet:
            stopped += network.remove_lab(LabNetwork(state.subnet))
    unmounted += procs.unmount_under(lab_dir)
    for name in [STATE_FILE, hostcheck.BASELINE, "images", "pki"] + [p.name for p in lab_dir.glob("hv-*")]:
        path = lab_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    removed = False
    try:
        lab_dir.rmdir()
        removed = True
    except OSError:
        pass  # not empty: something that is not ours lives there
    event(log, logging.INFO, "lab down", dir=str(lab_dir), stopped=len(stopped), unmounted=len(unmounted),
          workers=len(workers))
    return DownReport(tuple(stopped), tuple(unmounted), removed, tuple(undone))


def status(lab_dir: Path | None = None) -> LabStatus:
    """What the lab in `lab_dir` recorded, and whether each process is still running."""
    lab = info(lab_dir)
    return LabStatus(lab.dir, lab.hypervisors,
                     tuple(ProcStatus(p, p.alive()) for p in lab.processes),
                     tuple(procs.mounts_under(lab.dir)), dict(lab.images), dict(lab.aliases),
                     dict(lab.kubernetes))


def import_image(tarball: Path, lab_dir: Path | None = None, only: Iterable[str] | None = None) -> list[str]:
    """Import an image tarball (docker or OCI archive) into every lab hypervisor (or those named in `only`)."""
    lab = info(lab_dir)
    if not tarball.is_file():
        raise LabError(f"no such image tarball: {tarball}")
    wanted = None if only is None else set(only)
    hvs = [hv for hv in lab.hypervisors if wanted is None or hv.name in wanted]
    _import_everywhere(hvs, tarball.absolute())
    return [hv.name for hv in hvs]


def alias_image(src: str, dst: str, lab_dir: Path | None = None) -> list[str]:
    """Tag image `src` (present in the lab) as `dst` in every lab hypervisor that has it (a control-plane
    image: the private ones); recorded in lab.json.

    Returns the hypervisors' names. `dst` is replaced if it already names another image.
    """
    lab = info(lab_dir)
    if not src or not dst:
        raise LabError("alias: both SRC and DST are required")
    private = {lab.images[role] for role in lab_images.controlplane_roles(lab.images)}
    done = []
    for hv in lab.hypervisors:
        if hv.public and lab.aliases.get(src, src) in private:
            continue  # a public hypervisor has no control-plane image
        _ctr_tag(hv.socket, src, dst, hv.name)
        done.append(hv.name)
    aliases = dict(lab.aliases)
    aliases[dst] = src
    _save_info(lab, aliases=aliases)
    event(log, logging.INFO, "image alias", alias=dst, image=src, hypervisors=len(done))
    return done


# ---------------------------------------------------------------------------- YAML

def hypervisor_document(hv: LabHypervisor) -> dict[str, object]:
    """The repo's Hypervisor document for a lab hypervisor (remote endpoint if it has one)."""
    spec: dict[str, object] = {
        "public": hv.public,
        "ipAddress": hv.ip,
        "portRange": {"low": hv.port_range.low, "high": hv.port_range.high},
    }
    if hv.remote_uri:
        spec["remoteCRIEndpoint"] = {
            "criEndpointURI": hv.remote_uri,
            "caCertificate": hv.ca_pem,
            "clientCertificate": {"certificate": hv.client_cert_pem, "privateKey": hv.client_key_pem},
        }
    else:
        spec["localCRIEndpoint"] = {"criEndpointPath": hv.socket}
    return {"apiVersion": "gitops.infra/v1alpha1", "kind": "Hypervisor",
            "metadata": {"name": hv.name, "annotations": {DATA_DIR_ANNOTATION: hv.node_data_dir}}, "spec": spec}


def hypervisors_yaml(lab: LabInfo) -> str:
    """All lab hypervisors as a multi-document YAML stream."""
    return yaml.dump_all([hypervisor_document(hv) for hv in lab.hypervisors], Dumper=LiteralDumper,
                         sort_keys=False, explicit_start=True)
