"""scripts/build-kubernetes.sh: every supported release and its etcd, built from Go modules, cached.

The suite's set-up (scripts/install-deps.sh) ran the build; here a second run must find every build
in the cache (it prints "cached" for each and builds nothing), and each cached binary must be the
static program of the version its directory names, stamped so `--version` tells the truth.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gitops.lab import kubebin
from gitops.model import versions

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build-kubernetes.sh"


def test_the_build_list_is_the_supported_releases() -> None:
    out = subprocess.run(["python3", str(ROOT / "gitops" / "model" / "versions.py")], capture_output=True, text=True,
                         check=True).stdout
    kube, etcd = versions.built()
    assert out == f"kubernetes {' '.join(kube)}\netcd {' '.join(etcd)}\ncontainerd v{versions.CONTAINERD}\n"
    assert kube == tuple(f"v{r.kubernetes}" for _, r in sorted(versions.RELEASES.items()))
    assert all(not any(tag in v for tag in ("alpha", "beta", "rc")) for v in (*kube, *etcd))


def test_a_second_run_finds_everything_in_the_cache() -> None:
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for v in kubebin.KUBERNETES_BUILT:
        assert any(line.endswith(f"kubernetes {v}: cached in {kubebin.cache_root() / v}") for line in lines), lines
    for v in kubebin.ETCD_BUILT:
        assert any(line.endswith(f"etcd {v}: cached in {kubebin.cache_root() / f'etcd-{v}'}") for line in lines), lines
    ctrd = f"v{versions.CONTAINERD}"
    assert any(line.endswith(f"containerd {ctrd}: cached in {kubebin.cache_root() / f'containerd-{ctrd}'}")
               for line in lines), lines
    assert "go build" not in done.stdout


def test_containerd_is_static_and_says_its_version() -> None:
    """containerd, ctr and the runc shim of the module build: cgo off, `--version` the module's release."""
    v = f"v{versions.CONTAINERD}"
    for name in ("containerd", "ctr", "containerd-shim-runc-v2"):
        path = kubebin.containerd_program(name)
        settings = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True, check=True)
        assert "\tbuild\tCGO_ENABLED=0\n" in settings.stdout, name
        assert f"\tdep\tgithub.com/containerd/containerd/v2\t{v}\t" in settings.stdout or \
            f"\tmod\tgithub.com/containerd/containerd/v2\t{v}\t" in settings.stdout, name
    out = subprocess.run([str(kubebin.containerd_program("containerd")), "--version"], capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert out[:3] == ["containerd", "github.com/containerd/containerd/v2", v]


@pytest.mark.parametrize("version", kubebin.KUBERNETES_BUILT)
def test_each_kubernetes_binary_is_static_and_says_its_version(version: str) -> None:
    major, minor, _ = versions.parse(version)
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"):
        path = kubebin.binary(name, version)
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"Kubernetes {version}", (name, out.stdout, out.stderr)
        settings = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True, check=True)
        assert "\tbuild\tCGO_ENABLED=0\n" in settings.stdout, name
        # the module itself, its staging modules replaced by the matching release (the wrapper module)
        assert f"\tmod\tk8s.io/kubernetes\t{version}\t" in settings.stdout, name
        assert f"\t=>\tk8s.io/client-go\tv0.{minor}.{version.rsplit('.', 1)[1]}\t" in settings.stdout, name
    client = json.loads(subprocess.run([str(kubebin.kubectl(version)), "version", "--client", "-o", "json"],
                                       capture_output=True, text=True, check=True, timeout=60).stdout)["clientVersion"]
    assert (client["gitVersion"], client["major"], client["minor"]) == (version, str(major), str(minor))
    assert client["gitTreeState"] == "archive" and client["buildDate"].endswith("Z")


@pytest.mark.parametrize("version", kubebin.ETCD_BUILT)
def test_each_etcd_binary_is_static_and_says_its_version(version: str) -> None:
    v = version.removeprefix("v")
    etcd = subprocess.run([str(kubebin.etcd_program("etcd", v)), "--version"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.splitlines()
    assert etcd[0] == f"etcd Version: {v}" and etcd[1] == f"Git SHA: module-{version}"
    for tool in ("etcdctl", "etcdutl"):
        out = subprocess.run([str(kubebin.etcd_program(tool, v)), "version"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
        assert f"{tool} version: {v}" in out.splitlines()
    for tool in ("etcd", "etcdctl", "etcdutl"):
        settings = subprocess.run(["go", "version", "-m", str(kubebin.etcd_program(tool, v))], capture_output=True,
                                  text=True, check=True).stdout
        assert "\tbuild\tCGO_ENABLED=0\n" in settings and f"\tdep\tgo.etcd.io/etcd/api/v3\t{version}" in settings
