"""containerd 2.x built from its module (scripts/build-kubernetes.sh), configured as gitops writes it.

The real containerd 2.4.2, `ctr` and runc shim from the build cache run with the config
`gitops.hypervisor.configs` writes for the release `containerd --version` names (config version 4 from 2.4,
3 for 2.0-2.3): its CRI answers, images import, and a pod sandbox and a container run and log. The machine's
packaged containerd (Debian's 1.6) is read as a release of its own and gets config version 2.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import require_root, wait_exit

from gitops import procs
from gitops.cri.client import CRIClient
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError
from gitops.cri.types import ContainerSpec, SandboxSpec
from gitops.hypervisor import configs
from gitops.lab import images, kubebin
from gitops.model import versions

pytestmark = pytest.mark.lab("session")


def test_the_built_containerd_runs_a_pod_on_the_config_gitops_writes_for_it() -> None:
    require_root()
    binary = kubebin.containerd_program("containerd")
    release = configs.release_of(str(binary))
    assert release == configs.ContainerdRelease(versions.CONTAINERD) and release.supported
    assert release.config_version == (4 if release.minor >= (2, 4) else 3)
    base = Path(tempfile.mkdtemp(prefix="gitops-ctrd-", dir="/tmp"))
    proc = None
    try:
        paths = configs.ContainerdPaths.under(base)
        for d in (paths.cni_bin, paths.cni_conf):
            Path(d).mkdir(parents=True)
        config = base / "config.toml"
        config.write_text(configs.containerd_config(paths, "127.0.0.1", "gitops.lab/pause:3.9", release=release,
                                                    shim=str(kubebin.containerd_program("containerd-shim-runc-v2"))))
        dump = subprocess.run([str(binary), "--config", str(config), "config", "dump"], capture_output=True,
                              text=True, timeout=60)
        assert dump.returncode == 0 and "migrated" not in dump.stderr, dump.stderr  # its own config version
        assert "restrict_oom_score_adj = true" in dump.stdout and "sandbox = 'gitops.lab/pause:3.9'" in dump.stdout
        log = (base / "containerd.log").open("w")
        proc = subprocess.Popen([str(binary), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        endpoint = CRIEndpoint.unix("containerd 2", paths.socket)
        deadline = time.monotonic() + 30
        while True:
            try:
                with CRIClient(endpoint, timeout=2) as client:
                    if client.status().ready:
                        break
            except CRIError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (base / "containerd.log").read_text()[-2000:]
            time.sleep(0.2)
        recipes = images.base_recipes()
        archive = images.build_archive([(recipes["pause"], []), (recipes["busybox"], [])], base / "images.tar")
        subprocess.run([str(kubebin.containerd_program("ctr")), "-a", paths.socket, "-n", "k8s.io", "images",
                        "import", str(archive)], check=True, capture_output=True, timeout=120)
        with CRIClient(endpoint, slow_timeout=60) as client:
            assert client.version().runtime_version == f"v{versions.CONTAINERD}"
            spec = SandboxSpec("hello", namespace="containerd2", log_directory=str(base / "logs"))
            sandbox = client.run_sandbox(spec)
            try:
                ctr = client.create_container(sandbox, ContainerSpec(
                    "hello", recipes["busybox"].ref, args=("sh", "-c", "echo hello $((6 * 7))"),
                    log_path="hello.log"), spec)
                client.start_container(ctr)
                assert wait_exit(client, ctr, 30) == 0
                assert "stdout F hello 42" in (base / "logs" / "hello.log").read_text()
            finally:
                client.stop_sandbox(sandbox)
                client.remove_sandbox(sandbox)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        procs.unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)


def test_a_packaged_containerd_gets_the_config_version_it_reads() -> None:
    """The release each `containerd --version` names, and the config version gitops writes for it."""
    module = "containerd github.com/containerd/containerd/v2 v2.4.2 module-v2.4.2"
    debian = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
    assert configs.parse_release(module).config_version == 4
    assert configs.parse_release("containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7").config_version == 3
    assert configs.parse_release("containerd containerd.io v1.7.27 05044ec").config_version == 2
    old = configs.parse_release(debian)
    assert old.version == "1.6.20~ds1" and old.config_version == 2 and not old.supported
    for bad in ("containerd github.com/containerd/containerd v1.5.9 1407cab", "runc version 1.1.5", ""):
        with pytest.raises(configs.ContainerdError):
            configs.parse_release(bad)
    paths = configs.ContainerdPaths.under(Path("/x"))
    v3 = configs.containerd_config(paths, "10.0.0.1", release=configs.ContainerdRelease("2.0.5"))
    assert v3.splitlines()[1:2] == ["version = 3"] and "[grpc]" in v3 and 'bin_dir = "/x/cni/bin"' in v3
    v4 = configs.containerd_config(paths, "10.0.0.1", release=configs.ContainerdRelease("2.4.2"))
    assert "[plugins.'io.containerd.server.v1.grpc']" in v4 and "[grpc]" not in v4 and "bin_dirs = [" in v4
    v2 = configs.containerd_config(paths, "10.0.0.1", release=old)
    assert "version = 2" in v2 and "io.containerd.grpc.v1.cri\".containerd.runtimes.runc]" in v2
