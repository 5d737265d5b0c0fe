"""The controller image, built and run: Dockerfile -> buildah -> lab containerd -> a CRI pod that converges the lab.

Real: mmdebstrap (a Debian bookworm minbase from the apt mirror, as the Dockerfile's BASE: no
registry is reachable here), buildah building both Dockerfile targets (apt and pip run inside the
build), `ctr images import` into a 3-hypervisor lab (1 public, 1 over mTLS), `git daemon` serving a
bare repo from the host, and the controller running from its image as a CRI pod on a lab
hypervisor: it reaches two hypervisors through their mounted unix sockets and one over mTLS, pushes
its status branch, and leaves nothing for a live `gitops plan` to do. The node pods it creates run
the files agent built from the same Dockerfile.

Marked `image` (about 5 minutes, the build's 3 of them beside the Python-only modules: tests/imagebuild.py):
plain `pytest` leaves it out, `scripts/test.sh` (CI) runs it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import imagebuild
import pytest
import yaml
from conftest import require_root, running_lab
from ports import free_port, wait_listening
from repo_helpers import team_a_only

from gitops.cri.client import CRIClient
from gitops.cri.types import ContainerSpec, ContainerState, Mount, SandboxSpec
from gitops.pods import MANAGED, MANAGER
from gitops.state.store import LocalDirStore
from gitops.status.reader import SEALED, StatusReader
from gitops.status.sealed_state import Sealer, merge

pytestmark = [pytest.mark.image, pytest.mark.lab("image")]

ROOT = Path(__file__).resolve().parent.parent
GITOPS = str(Path(sys.executable).parent / "gitops")
GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com"]
SUBNET = "127.0.26"
UID = 10001  # the Dockerfile's USER
CONVERGE_TIMEOUT = 420


_CONFIG: list[pytest.Config] = []


def progress(message: str) -> None:
    """Long steps say what they do, past pytest's capture."""
    line = f"[test_image {time.strftime('%H:%M:%S')}] {message}"
    capture = _CONFIG[0].pluginmanager.get_plugin("capturemanager") if _CONFIG else None
    if capture is None:
        print(line, flush=True)
        return
    with capture.global_and_fixture_disabled():
        print("\n" + line, end="", flush=True)


def mounts_under(path: Path) -> list[str]:
    root = str(path.resolve())
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == root or p.startswith(root + "/")]


def archive_image(tar: Path) -> tuple[str, dict]:
    """(image id, config) of a docker archive."""
    with tarfile.open(tar) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))[0]
        config = json.load(archive.extractfile(manifest["Config"]))
    return "sha256:" + manifest["Config"].removesuffix(".json").removeprefix("sha256:"), config


@dataclasses.dataclass
class Run:
    base: Path
    build: dict
    build_seconds: float
    lab: object
    origin: Path
    work: Path
    key: Path
    hv: object  # the lab hypervisor running the controller pod
    sandbox_id: str
    container_id: str
    metrics: str
    controller_id: str
    agent_id: str
    converged_seconds: float

    def git(self, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(["git", *GIT_ID, *args], cwd=cwd or self.work, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
        return proc.stdout.strip()

    def client(self) -> CRIClient:
        return CRIClient(self.hv.local().cri_endpoint(), slow_timeout=60)

    def logs(self) -> str:
        path = self.base / "podlogs" / "controller.log"
        return path.read_text()[-6000:] if path.exists() else "(no log)"


def status_file(origin: Path, rel: str) -> str | None:
    proc = subprocess.run(["git", "--git-dir", str(origin), "show", f"gitops/status:{rel}"], capture_output=True,
                          text=True)
    return proc.stdout if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def run(request):
    require_root()
    _CONFIG[:] = [request.config]
    for tool in ("buildah", "mmdebstrap", "unshare", "age-keygen"):
        assert shutil.which(tool), f"{tool} not found (scripts/install-deps.sh installs it)"
    from gitops import lab as labmod

    with running_lab("gitops-image-") as (base, _):  # (the lab comes up while the images build)
        daemon = None
        try:
            # the images build since the session started (tests/imagebuild.py); the lab comes up meanwhile
            building = imagebuild.start()
            progress("lab up: 3 containerd hypervisors (1 public, 1 behind mTLS), while the images build")
            lab = labmod.up(base / "lab", hypervisors=3, public=1, remote=True, subnet=SUBNET)
            progress("the images: scripts/build-image.sh (mmdebstrap base, buildah), "
                     "building since the session started")
            build = building.wait(progress)
            build_seconds = build["seconds"]["total"]
            images = building.images
            controller_id, _ = archive_image(images / "gitops.tar")
            agent_id, _ = archive_image(images / "gitops-agent.tar")
            hv = next(h for h in lab.hypervisors if not h.public)  # where the controller's pod runs
            progress(f"importing gitops.tar into {hv.name}, where the controller runs (ctr images import)")
            labmod.import_image(images / "gitops.tar", base / "lab", only=[hv.name])
            progress("importing gitops-agent.tar into every lab hypervisor (ctr images import)")
            labmod.import_image(images / "gitops-agent.tar", base / "lab")
            imagebuild.stop()  # (the archives are imported: nothing else reads them)

            # the infra repo: the example wired to the lab, its mTLS key encrypted to the controller's identity
            key = base / "controller.key"
            recipient = subprocess.run(["age-keygen", "-o", str(key)], capture_output=True, text=True,
                                       check=True).stderr.split("Public key:")[1].strip()
            work, origin = base / "work", base / "srv" / "infra.git"
            subprocess.run([GITOPS, "lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"),
                            str(work), "--encrypt-to", recipient], check=True, capture_output=True)
            # team-a alone (its 3 controlplane nodes on the two private machines, its ingress on the public one):
            # every hypervisor, each way of reaching one, and a third of the CPU two clusters and SIP's hosts take
            team_a_only(work)
            subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
            subprocess.run(["git", *GIT_ID, "add", "-A"], cwd=work, check=True)
            subprocess.run(["git", *GIT_ID, "commit", "-q", "-m", "infra"], cwd=work, check=True)
            subprocess.run(["git", "clone", "-q", "--bare", str(work), str(origin)], check=True)
            # on a host loopback address the lab's machines reach over the lab bridge (inside a machine, 127.0.0.1
            # is its own)
            git_host = f"{SUBNET}.250"
            git_port = free_port(git_host)
            daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                                       f"--base-path={origin.parent}", f"--listen={git_host}", f"--port={git_port}",
                                       str(origin.parent)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_listening(git_host, git_port, timeout=20)

            # what the pod gets: the identity (readable by its user only) and the unix sockets of the
            # hypervisors the repo reaches locally, at the same paths; the sockets' group is the image's
            # (an admin grants a controller's group a containerd socket the same way: containerd's [grpc] gid)
            pod_dir = base / "pod"
            pod_dir.mkdir()
            identity = pod_dir / "identity.txt"
            shutil.copy(key, identity)
            os.chown(identity, UID, UID)
            os.chmod(identity, 0o400)
            mounts = [Mount("/etc/gitops/identity.txt", str(identity), readonly=True)]
            for path in sorted((work / "hypervisors").glob("*.yaml")):
                endpoint = yaml.safe_load(path.read_text())["spec"].get("localCRIEndpoint")
                if endpoint:
                    sock = endpoint["criEndpointPath"]
                    os.chown(sock, -1, UID)
                    assert os.stat(sock).st_mode & 0o060 == 0o060, oct(os.stat(sock).st_mode)
                    mounts.append(Mount(sock, sock))
            assert len(mounts) == 3, mounts  # two hypervisors by socket; the third over mTLS (host network)

            metrics = f"{hv.ip}:{free_port()}"  # the pod lives in the machine's network (host networking there)
            sandbox = SandboxSpec("gitops-controller", namespace="gitops-system", log_directory=str(base / "podlogs"))
            container = ContainerSpec(
                "controller", "ghcr.io/gitops-infra/gitops:0.1.0",
                args=("--repo", f"git://{git_host}:{git_port}/infra.git", "--interval", "10s"),
                env={"GITOPS_METRICS_ADDRESS": metrics}, mounts=tuple(mounts), log_path="controller.log")
            progress(f"running the controller image as a CRI pod on {hv.name}; waiting for it to converge the lab")
            start = time.monotonic()
            with CRIClient(hv.local().cri_endpoint(), slow_timeout=60) as client:
                sandbox_id = client.run_sandbox(sandbox)
                container_id = client.create_container(sandbox_id, container, sandbox)
                client.start_container(container_id)
            r = Run(base, build, build_seconds, lab, origin, work, key, hv, sandbox_id, container_id, metrics,
                    controller_id, agent_id, 0.0)
            sha = r.git("rev-parse", "HEAD")
            end = time.monotonic() + CONVERGE_TIMEOUT
            while True:
                with r.client() as client:
                    state = client.container_status(container_id).state
                assert state == ContainerState.RUNNING, f"the controller container is {state.value}:\n{r.logs()}"
                source = (yaml.safe_load(status_file(origin, "status/source.yaml") or "{}") or {}).get("status", {})
                record = (yaml.safe_load(status_file(origin, "status/apply.yaml") or "{}") or {}).get("status", {})
                if source.get("appliedSHA") == sha and source.get("result") == "Applied" and \
                        record.get("result") == "Applied" and not record.get("followUp"):
                    break
                assert time.monotonic() < end, f"not converged after {CONVERGE_TIMEOUT}s:\n{source}\n{r.logs()}"
                time.sleep(3)
            r.converged_seconds = time.monotonic() - start
            progress(f"converged in {r.converged_seconds:.0f} s")
            yield r
        finally:
            progress("tearing down: controller pod, lab, git daemon, temp dir")
            imagebuild.stop()
            if daemon is not None:
                daemon.terminate()
                daemon.wait(10)
            # then the lab down: it drains every sandbox, the controller's too
    leftover = mounts_under(base)  # (the removal of `base` leaves a mount left under it: a mount point stays)
    assert not leftover, leftover


def test_image_config_and_sizes(run):
    """Both targets built from the Dockerfile on the local base; the controller runs as 10001, not root."""
    controller, agent = run.build["controller"], run.build["agent"]
    config = controller["config"]
    assert run.build["base"] == "localhost/gitops-base:bookworm"
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["gitops", "watch"]
    assert "9100/tcp" in config["ExposedPorts"]
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "python3"]
    assert "GITOPS_METRICS_ADDRESS=0.0.0.0:9100" in config["Env"]
    assert agent["config"]["Cmd"] == ["sleep", "infinity"] and not agent["config"].get("User")
    progress(f"build {run.build_seconds:.0f} s (base {run.build['seconds']['base']:.0f} s, agent "
             f"{run.build['seconds']['agent']:.0f} s, controller {run.build['seconds']['controller']:.0f} s); "
             f"controller {controller['size'] / 2**20:.0f} MiB ({controller['gzipSize'] / 2**20:.0f} MiB gzipped), "
             f"agent {agent['size'] / 2**20:.0f} MiB ({agent['gzipSize'] / 2**20:.0f} MiB gzipped)")


def test_the_lab_runs_the_built_images(run):
    """The controller pod runs the built image; every node pod's files agent is the built agent target."""
    for hv in run.lab.hypervisors:
        with CRIClient(hv.local().cri_endpoint()) as client:
            if hv.name == run.hv.name:
                assert client.image_status("ghcr.io/gitops-infra/gitops:0.1.0").id == run.controller_id
            assert client.image_status("ghcr.io/gitops-infra/gitops-agent:0.1.0").id == run.agent_id
            agents = [c for c in client.list_containers({MANAGED: MANAGER}) if c.name == "files"]
            assert all(client.container_status(c.id).image_ref == run.agent_id for c in agents), agents
    with run.client() as client:
        assert client.container_status(run.container_id).image_ref == run.controller_id


def test_controller_runs_as_non_root_and_answers_health(run):
    with run.client() as client:
        code, out, err = client.exec_sync(run.container_id, ["id", "-u"])
        assert (code, out.decode().strip()) == (0, str(UID)), err
        code, out, err = client.exec_sync(run.container_id, ["id", "-g"])
        assert (code, out.decode().strip()) == (0, str(UID)), err
        for tool in (["restic", "version"], ["etcdctl", "version"]):  # etcd backups run them (gitops.backup)
            code, out, err = client.exec_sync(run.container_id, tool, timeout=10)
            assert code == 0 and out, (tool, out, err)
        # the image's own HEALTHCHECK command, as docker or podman would run it
        check = run.build["controller"]["config"]["Healthcheck"]["Test"][1:]
        code, out, err = client.exec_sync(run.container_id, check, timeout=10)
        assert code == 0, (out, err)
    with urllib.request.urlopen(f"http://{run.metrics}/healthz", timeout=5) as resp:
        health = json.loads(resp.read())
    assert resp.status == 200 and health["ok"] and health["lastResult"] == "applied", health
    with urllib.request.urlopen(f"http://{run.metrics}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'gitops_reconcile_total{result="applied"}' in text, text[:2000]


def test_live_plan_is_empty_after_the_controller(run):
    """From the host, with the state the controller sealed on its status branch: `gitops plan` finds nothing to do."""
    reader = StatusReader.at_ref(run.origin, "gitops/status")
    secrets = json.loads(Sealer(run.key.read_text()).open(reader.require(SEALED)))
    state_dir = run.base / "state"
    LocalDirStore(state_dir).save(merge(reader.public_state(), secrets))
    checkout = run.base / "checkout"
    run.git("clone", "-q", str(run.origin), str(checkout), cwd=run.base)
    proc = subprocess.run([GITOPS, "plan", str(checkout), "--state-dir", str(state_dir), "--identity", str(run.key),
                           "--detailed-exitcode"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr + run.logs()
    assert "No changes" in proc.stdout, proc.stdout
    pods = {hv.name: len(CRIClient(hv.local().cri_endpoint()).list_sandboxes({MANAGED: MANAGER}))
            for hv in run.lab.hypervisors}
    assert sum(pods.values()) == 4 and all(pods.values()), pods  # team-a's 3 controlplane nodes and its ingress
