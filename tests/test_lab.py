"""`gitops lab`: images from host binaries, up/status/down with real containerd and haproxy,
the files agent, the real control-plane and etcd images (built from their Go modules), upstream-name aliases."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import wait_exit
import yaml
from cryptography.hazmat.primitives import serialization
from ports import free_port_in, wait_listening

from gitops import pki
from gitops.cri.client import CRIClient
from gitops.cri.types import ContainerSpec, ContainerState, Mount, SandboxSpec
from gitops.model.validate import load_hypervisors
from gitops.lab import LabError, hypervisors_yaml
from gitops.lab import images as labimages
from gitops import procs
from gitops.lab import kubebin, recipes
from gitops.model import versions
from gitops.model.components import DEFAULT_AGENT_IMAGE
from gitops.model.resources import DATA_DIR_ANNOTATION

pytestmark = pytest.mark.lab("session")


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab runs real containerd instances")


def _gitops(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "gitops", *args], capture_output=True, text=True, timeout=180)
    if check:
        assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_images_are_deterministic(tmp_path: Path) -> None:
    recipe = labimages.ImageRecipe("tiny", "1", (labimages._which("sleep"),), ("/usr/bin/sleep",))
    first = labimages.build_image(recipe, tmp_path / "a").read_bytes()
    assert labimages.build_image(recipe, tmp_path / "b").read_bytes() == first
    libs = labimages.shared_libraries(labimages._which("haproxy"))
    assert any("libssl" in lib for lib in libs) and any("ld-linux" in lib for lib in libs)


def test_the_labs_two_archives_build_each_layer_once(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`lab up`'s archives (every image; the public hypervisors' without the control-plane ones) take their
    layers from one cache: a layer both hold (the base's, the public images') is built once, and is the
    same bytes in both."""
    import tarfile

    from gitops.lab.lab import write_archives

    built: list[str] = []
    real = labimages._layer
    monkeypatch.setattr(labimages, "_layer", lambda recipe: built.append(recipe.ref) or real(recipe))
    every_recipe = recipes.lab_recipes(kubebin.KUBERNETES_BUILT[-1:], ())
    every, public = write_archives(every_recipe, recipes.upstream_aliases(every_recipe), tmp_path)
    assert len(built) == len(set(built)), sorted(built)
    private = recipes.controlplane_roles(every_recipe)
    shared = [r for role, r in every_recipe.items() if role not in private]
    assert shared and set(every_recipe.values()) - set(shared)

    def layers_of(archive: Path) -> dict[str, bytes]:
        with tarfile.open(archive) as outer:
            return {tag: outer.extractfile(name).read() for m in json.load(outer.extractfile("manifest.json"))
                    for tag in m["RepoTags"] for name in m["Layers"][:1]}
    in_every, in_public = layers_of(every), layers_of(public)
    assert {r.ref for r in shared} <= set(in_public) and not {r.ref for r in every_recipe.values()
                                                                if r not in shared} & set(in_public)
    assert all(in_public[r.ref] == in_every[r.ref] for r in shared)


def test_yaml_documents_round_trip(lab, tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = hypervisors_yaml(lab)
    docs = list(yaml.safe_load_all(text))
    (tmp_path / "hvs.yaml").write_text(text)
    loaded = load_hypervisors(tmp_path / "hvs.yaml")
    assert [d["metadata"]["name"] for d in docs] == ["lab-hv-1", "lab-hv-2"]
    assert [d["spec"]["public"] for d in docs] == [True, False]
    assert docs[0]["spec"]["portRange"] == {"low": 30000, "high": 30999}
    assert docs[1]["spec"]["ipAddress"] == "10.249.20.2"  # a machine of its own on the lab network
    assert docs[0]["spec"]["remoteCRIEndpoint"]["criEndpointURI"] == "tcp://10.249.20.1:10250"
    for doc, hv in zip(docs, lab.hypervisors):
        data_dir = doc["metadata"]["annotations"][DATA_DIR_ANNOTATION]
        assert data_dir == f"{lab.dir}/{hv.dir.rsplit('/', 1)[1]}/data" and os.path.isdir(data_dir)
        assert hv.local().data_dir == hv.remote().data_dir == hv.hypervisor().data_dir == data_dir
        assert loaded[doc["metadata"]["name"]] == hv.remote()


def test_up_refuses_a_running_lab(lab) -> None:  # type: ignore[no-untyped-def]
    from gitops import lab as labmod

    with pytest.raises(LabError, match="already up"):
        labmod.up(lab.dir)


def test_status_and_image_import(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    status = _gitops("lab", "status", "--dir", str(lab.dir)).stdout
    assert status.startswith(f"lab {lab.dir}: up\n")
    assert status.count("containerd  pid=") == 2 and status.count("haproxy  pid=") == 2
    recipe = labimages.ImageRecipe("user-image", "7", (labimages._which("true"),), ("/usr/bin/true",))
    tarball = labimages.build_image(recipe, tmp_path)
    out = _gitops("lab", "images", "import", str(tarball), "--dir", str(lab.dir)).stdout
    assert out.splitlines() == [f"imported {tarball.name} into lab-hv-1", f"imported {tarball.name} into lab-hv-2"]
    for hv in lab.hypervisors:
        with CRIClient(hv.local().cri_endpoint()) as client:
            assert client.image_status(recipe.ref) is not None


def _netns() -> list[str]:
    return [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines()]


def _shim_socket(containerd_socket: Path, sandbox_id: str) -> Path:
    """The socket of a sandbox's shim (containerd 1.6 `shim.SocketAddress`: the sha256 of containerd's
    address, the namespace and the id, under /run/containerd/s, shared by every containerd of the host)."""
    name = hashlib.sha256(f"{containerd_socket}/k8s.io/{sandbox_id}".encode()).hexdigest()
    return Path("/run/containerd/s") / name


def _leftovers(lab_dir: Path) -> tuple[list[int], list[str]]:
    return procs.pids_referencing(lab_dir), procs.mounts_under(lab_dir)


def test_up_and_down_leave_nothing_behind(tmp_path: Path) -> None:
    require_root()
    lab_dir = Path(tempfile.mkdtemp(prefix="gitops-lab-updown-", dir="/tmp"))
    try:
        up = _gitops("lab", "up", "--hypervisors", "3", "--public", "1", "--remote",
                     "--subnet", "127.0.21", "--dir", str(lab_dir))
        docs = list(yaml.safe_load_all(up.stdout))
        assert [d["metadata"]["name"] for d in docs] == ["lab-hv-1", "lab-hv-2", "lab-hv-3"]
        assert [d["spec"]["public"] for d in docs] == [True, False, False]
        assert [d["spec"]["ipAddress"] for d in docs] == ["10.249.21.1", "10.249.21.2", "10.249.21.3"]
        assert {f"gitops-0-21-{n}" for n in ("net", "hv1", "hv2", "hv3")} <= set(_netns())
        state = json.loads((lab_dir / "lab.json").read_text())
        recorded = [procs.Proc.from_json(p) for p in state["processes"]]
        assert sorted(p.role for p in recorded) == ["containerd"] * 3 + ["haproxy"] * 3
        assert all(p.alive() for p in recorded)

        # A running pod on every hypervisor (shims, mounts); containerd of hv-1 then dies
        # abruptly, so its pod can only be cleaned up through the leftover-process path.
        (tmp_path / "hvs.yaml").write_text(up.stdout)
        hvs = list(load_hypervisors(tmp_path / "hvs.yaml").values())
        shim_sockets = []
        for number, hv in enumerate(hvs, start=1):
            with CRIClient(hv.cri_endpoint()) as client:
                spec = SandboxSpec("busy")
                sandbox_id = client.run_sandbox(spec)
                ctr = client.create_container(sandbox_id, ContainerSpec("sleep", "gitops.lab/pause:3.9"), spec)
                client.start_container(ctr)
            shim_sockets.append(_shim_socket(lab_dir / f"hv-{number}" / "containerd.sock", sandbox_id))
        assert all(socket.exists() for socket in shim_sockets), shim_sockets
        pids, mounts = _leftovers(lab_dir)
        assert len(pids) > 6 and mounts
        hv1 = next(p for p in recorded if p.role == "containerd" and p.hypervisor == "lab-hv-1")
        os.kill(hv1.pid, signal.SIGKILL)

        # Through a parent whose command line names the lab directory (as sudo's or time's
        # does): down must not take it (nor itself) for a leftover of the lab.
        wrapped = subprocess.run(["sh", "-c", '"$@" && echo wrapper-survived', "sh", sys.executable, "-m", "gitops",
                                  "lab", "down", "--dir", str(lab_dir)], capture_output=True, text=True, timeout=180)
        assert wrapped.returncode == 0, wrapped.stderr
        assert "lab directory removed" in wrapped.stdout and "wrapper-survived" in wrapped.stdout
        assert not lab_dir.exists()
        assert _leftovers(lab_dir) == ([], [])
        assert not any(p.alive() for p in recorded)
        assert not [ns for ns in _netns() if ns.startswith("gitops-0-21-")]
        assert "glab0-21" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert [socket for socket in shim_sockets if socket.exists()] == []  # even the killed shim's socket
        status = _gitops("lab", "status", "--dir", str(lab_dir), check=False)
        assert status.returncode == 1 and "no lab in" in status.stderr
    finally:
        from gitops import lab as labmod

        labmod.down(lab_dir)



def test_up_replaces_the_network_of_a_lab_that_no_longer_runs_and_nothing_else() -> None:
    """A lab whose processes all died without `lab down` (a killed test run, a killed sandbox) leaves its
    namespaces behind; the next `lab up` on that subnet removes them. A lab with a process left, or with a
    machine powered off, is still a lab: refused."""
    require_root()
    from gitops import lab as labmod
    from gitops.lab import network

    net = network.LabNetwork("127.0.21")
    old = [net.hypervisor(1, "old-1"), net.hypervisor(7, "old-7")]
    lab_dir = Path(tempfile.mkdtemp(prefix="gitops-lab-leftover-", dir="/tmp"))
    sleeper = None
    try:
        network.create_lab(net)
        for m in old:
            network.create_machine(m)
        sleeper = subprocess.Popen(network.enter(old[1].netns, ["sleep", "300"]))
        with pytest.raises(LabError, match="127.0.21 is in use"):
            labmod.up(lab_dir, hypervisors=1, public=1, subnet="127.0.21", kubernetes_versions=())
        sleeper.kill()
        sleeper.wait()
        network.set_link(old[1], up=False)  # powered off
        with pytest.raises(LabError, match="127.0.21 is in use"):
            labmod.up(lab_dir, hypervisors=1, public=1, subnet="127.0.21", kubernetes_versions=())
        assert network.exists(old[1].netns)
        network.set_link(old[1], up=True)

        lab = labmod.up(lab_dir, hypervisors=1, public=1, subnet="127.0.21", kubernetes_versions=())
        assert not network.exists(old[1].netns)  # the leftover machine is gone, the new lab's is there
        assert sorted(ns for ns in _netns() if ns.startswith("gitops-0-21-")) == ["gitops-0-21-hv1", "gitops-0-21-net"]
        with CRIClient(lab.hypervisors[0].local().cri_endpoint()) as client:
            assert client.version()
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        labmod.down(lab_dir)
        for m in old:
            network.remove_machine(m)
        network.remove_lab(net)
        shutil.rmtree(lab_dir, ignore_errors=True)
    assert not [ns for ns in _netns() if ns.startswith("gitops-0-21-")]


# ---------------------------------------------------------------------------- control-plane images

def _start(pod, name: str, image: str, command: tuple[str, ...], args: tuple[str, ...] = (),  # type: ignore[no-untyped-def]
           mounts: tuple[Mount, ...] = ()) -> str:
    client, sandbox_id, spec, _ = pod
    ctr = client.create_container(sandbox_id, ContainerSpec(name, image, command=command, args=args, mounts=mounts,
                                                            log_path=f"{name}.log"), spec)
    client.start_container(ctr)
    return ctr


def _log(pod, name: str) -> str:  # type: ignore[no-untyped-def]
    """The container's output (CRI log lines are `<time> <stream> <tag> <text>`)."""
    path = pod[3] / "logs" / f"{name}.log"
    return "\n".join(line.split(" ", 3)[3] for line in path.read_text().splitlines() if line.count(" ") >= 3)


def test_agent_image_runs_openssl(pod) -> None:  # type: ignore[no-untyped-def]
    client, _, _, base = pod
    assert not base.exists()  # containerd creates missing host paths of mounts
    ctr = _start(pod, "files", DEFAULT_AGENT_IMAGE, ("sleep", "infinity"), mounts=(Mount("/node", str(base / "node")),))
    script = ("set -e; mkdir -p /node/files; cd /node/files; "
              "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out k.key 2>/dev/null; chmod 600 k.key; "
              "openssl req -new -key k.key -subj /CN=agent-test; openssl pkey -in k.key -pubout; "
              "printf 'sum %s\\n' \"$(sha256sum k.key | cut -c1-12)\"; cat k.key > k.tmp; mv k.tmp k2.key; rm k2.key; ls")
    code, out, err = client.exec_sync(ctr, ["sh", "-c", script], timeout=20)
    assert code == 0, err.decode()
    text = out.decode()
    csr = pki.load_csr_pem(text[text.index("-----BEGIN CERTIFICATE REQUEST"):text.index("-----BEGIN PUBLIC KEY")])
    assert csr.is_signature_valid
    assert csr.subject.rfc4514_string() == "CN=agent-test"
    key = pki.load_key_pem((base / "node" / "files" / "k.key").read_text())  # written through the mount
    public = text[text.index("-----BEGIN PUBLIC KEY"):text.index("-----END PUBLIC KEY-----\n") + 25]
    assert public.encode() == key.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    assert text.splitlines()[-2:] == [f"sum {text.split('sum ')[1][:12]}", "k.key"]
    t = time.monotonic()
    client.stop_container(ctr, timeout=10)
    assert time.monotonic() - t < 5  # the image's StopSignal (SIGKILL): sleep as PID 1 ignores SIGTERM


def test_the_files_agent_replaces_a_batch_whole_or_not_at_all(pod) -> None:  # type: ignore[no-untyped-def]
    """#26: write-files writes every file under a temporary name, then renames them all; a failure while
    writing leaves the old set whole and no temporary file behind."""
    from gitops import agent

    client, _, _, base = pod
    files = base / "batch" / "files"
    ctr = _start(pod, "batch-files", DEFAULT_AGENT_IMAGE, ("sleep", "infinity"),
                 mounts=(Mount("/node", str(base / "batch")),))
    try:
        agent.write_files(client, ctr, {"a.crt": "old a\n", "b.pem": "old b\n"})
        assert {p.name: p.read_text() for p in files.iterdir()} == {"a.crt": "old a\n", "b.pem": "old b\n"}
        (files / ".c.conf.batch").mkdir()  # c.conf cannot be written: the batch fails after a.crt's temp
        with pytest.raises(agent.AgentError, match="write a.crt, b.pem, c.conf failed"):
            agent.write_files(client, ctr, {"a.crt": "new a\n", "b.pem": "new b\n", "c.conf": "new c\n"})
        (files / ".c.conf.batch").rmdir()
        assert {p.name: p.read_text() for p in files.iterdir()} == {"a.crt": "old a\n", "b.pem": "old b\n"}
        agent.write_files(client, ctr, {"a.crt": "new a\n", "c.conf": "new c\n"})
        assert sorted(p.name for p in files.iterdir()) == ["a.crt", "b.pem", "c.conf"]
        assert (files / "a.crt").read_text() == "new a\n" and (files / "b.pem").read_text() == "old b\n"
        with pytest.raises(agent.AgentError, match="refusing to send private key"):
            agent.write_files(client, ctr, {"x.key": "KEY"})
    finally:
        client.stop_container(ctr, timeout=10)
        client.remove_container(ctr)


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


def _https(ip: str, port: int, path: str, ca: pki.CertKey, client_cert: pki.CertKey | None,
           tmp: Path) -> tuple[int, str]:
    ctx = ssl.create_default_context(cadata=ca.cert_pem)
    if client_cert is not None:
        (tmp / "c.crt").write_text(client_cert.cert_pem)
        (tmp / "c.key").write_text(client_cert.key_pem)
        ctx.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    conn = http.client.HTTPSConnection(ip, port, context=ctx, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_the_control_plane_images_run_the_real_binaries(lab, private_pod, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each image, run by its upstream name, is the real program of the version its tag says; the real
    kube-apiserver refuses a missing file a flag names, as it does outside a container."""
    pod = private_pod
    client, _, _, base = pod
    v = kubebin.DEFAULT_VERSION
    for component in kubebin.CONTROL_PLANE:
        ctr = _start(pod, f"{component}-version", f"registry.k8s.io/{component}:{v}", (component,), ("--version",))
        assert wait_exit(client, ctr) == 0
        assert _log(pod, f"{component}-version").strip() == f"Kubernetes {v}"
    etcd = versions.DEFAULT_ETCD
    for tool, args, says in (("etcd", ("--version",), f"etcd Version: {etcd}"),
                             ("etcdctl", ("version",), f"etcdctl version: {etcd}"),
                             ("etcdutl", ("version",), f"etcdutl version: {etcd}")):
        ctr = _start(pod, f"{tool}-version", f"registry.k8s.io/etcd:{etcd}-0", (tool,), args)
        assert wait_exit(client, ctr) == 0
        assert says in _log(pod, f"{tool}-version").splitlines()
    _write(base / "files", {"ca.crt": pki.create_ca("cluster-ca").cert_pem})
    files = Mount("/etc/gitops", str(base / "files"), readonly=True)
    broken = _start(pod, "kube-apiserver-broken", f"registry.k8s.io/kube-apiserver:{v}", ("kube-apiserver",),
                    ("--etcd-servers=https://127.0.0.1:2379", "--client-ca-file=/etc/gitops/ca.crt",
                     "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
                     "--service-cluster-ip-range=10.96.0.0/12",
                     "--tls-cert-file=/etc/gitops/apiserver.crt", "--tls-private-key-file=/etc/gitops/apiserver.key",
                     "--service-account-issuer=https://kubernetes.default.svc",
                     "--service-account-key-file=/etc/gitops/sa.key",
                     "--service-account-signing-key-file=/etc/gitops/sa.key"), (files,))
    assert wait_exit(client, broken) != 0
    assert "open /etc/gitops/sa.key: no such file or directory" in _log(pod, "kube-apiserver-broken")


def test_versions_are_normalized() -> None:
    assert recipes.normalize_version("1.37.2") == "v1.37.2"
    with pytest.raises(LabError):
        recipes.normalize_version("1.37")
    with pytest.raises(LabError, match="not built here"):
        kubebin.binary("kube-apiserver", "1.20.2")
    assert recipes.etcd_versions(["v1.37.2", "1.36.3", "v1.35.4"]) == ("3.6.16", "3.7.3")


def test_real_kubernetes_images_run_the_cached_binaries(lab) -> None:  # type: ignore[no-untyped-def]
    """The images hold the real binaries built by scripts/build-kubernetes.sh, byte for byte."""
    import hashlib
    import tarfile

    from gitops.lab import kubebin

    archive = lab.dir / "images" / "lab-images.tar"
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        for component in kubebin.CONTROL_PLANE:
            v = kubebin.DEFAULT_VERSION
            [entry] = [m for m in manifest if f"registry.k8s.io/{component}:{v}" in m["RepoTags"]]
            assert entry["RepoTags"][0] == f"gitops.lab/{component}:{v}"
            [layer] = entry["Layers"]
            with tarfile.open(fileobj=outer.extractfile(layer)) as inner:
                data = inner.extractfile(f"usr/local/bin/{component}").read()
            assert hashlib.sha256(data).digest() == hashlib.sha256(kubebin.binary(component).read_bytes()).digest()


def test_upstream_aliases(lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    v, etcd = kubebin.DEFAULT_VERSION, versions.DEFAULT_ETCD
    assert lab.aliases[f"registry.k8s.io/etcd:{etcd}-0"] == lab.images[f"etcd/{etcd}"] == lab.etcd_image() \
        == f"gitops.lab/etcd:{etcd}"
    assert lab.aliases[DEFAULT_AGENT_IMAGE] == lab.images["agent"]
    assert lab.aliases[f"registry.k8s.io/kube-apiserver:{v}"] == f"gitops.lab/kube-apiserver:{v}"
    # a lab imports the two newest releases (the example's clusters run them), each with its etcd
    previous = kubebin.KUBERNETES_BUILT[-2]
    assert lab.kubernetes == {v: etcd, previous: versions.etcd_for(previous)}
    assert lab.aliases["docker.io/osixia/keepalived:2.0.20"] == lab.images["keepalived"]
    assert len(lab.aliases) == 4 + len(set(lab.kubernetes.values())) + 3 * len(lab.kubernetes)
    # the control-plane images (versioned roles) on the private hypervisor only: control-plane Nodes sit there
    controlplane = {lab.images[role] for role in recipes.controlplane_roles(lab.images)}
    assert controlplane >= {f"gitops.lab/kube-apiserver:{v}", f"gitops.lab/etcd:{etcd}"}
    for hv in lab.hypervisors:
        with CRIClient(hv.remote().cri_endpoint()) as client:
            for alias, ref in lab.aliases.items():
                image = client.image_status(alias)
                if hv.public and ref in controlplane:
                    assert image is None and client.image_status(ref) is None, (hv.name, alias)
                    continue
                assert image is not None and image.id == client.image_status(ref).id, alias
    status = _gitops("lab", "status", "--dir", str(lab.dir)).stdout
    assert f"registry.k8s.io/kube-scheduler:{v} -> gitops.lab/kube-scheduler:{v}" in status
    assert f"  kubernetes {v}: real binaries (etcd {etcd} by default)\n" in status
    assert "STAND-IN" not in status

    # An image of its own: a second tag changes what ContainerStatus reports as the image of
    # containers made from it (containerd reports the image's first repo tag, not the requested one).
    recipe = labimages.ImageRecipe("alias-test", "1", (labimages._which("true"),), ("/usr/bin/true",))
    _gitops("lab", "images", "import", str(labimages.build_image(recipe, tmp_path)), "--dir", str(lab.dir))
    out = _gitops("lab", "images", "alias", recipe.ref, "example.test/lab/alias-test:1", "--dir", str(lab.dir))
    assert out.stdout.splitlines()[0] == f"tagged {recipe.ref} as example.test/lab/alias-test:1 in lab-hv-1"
    for hv in lab.hypervisors:
        with CRIClient(hv.local().cri_endpoint()) as client:
            assert client.image_status("example.test/lab/alias-test:1") is not None
    status = _gitops("lab", "status", "--dir", str(lab.dir)).stdout
    assert f"example.test/lab/alias-test:1 -> {recipe.ref}" in status
    bad = _gitops("lab", "images", "alias", "gitops.lab/absent:1", "example.test/x:1", "--dir", str(lab.dir), check=False)
    assert bad.returncode != 0 and "gitops.lab/absent:1" in bad.stderr
