"""Container images built from host binaries (no registry needed).

Each image is one layer holding the binaries, every shared library `ldd`
reports for them, and a minimal /etc; it is written as a docker-archive
tarball (manifest.json + config + layer.tar) that `ctr images import`
accepts. Output is byte-for-byte deterministic for the same host files.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gitops.cri._log import event
from gitops.lab.errors import LabError

log = logging.getLogger(__name__)

REGISTRY = "gitops.lab"
_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
_DIRS = {"tmp": 0o1777, "var/lib": 0o755, "var/run": 0o755, "run": 0o755}
_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/lib:/usr/lib"]


@dataclass(frozen=True)
class ImageRecipe:
    """What goes into an image built from host binaries."""

    name: str
    tag: str
    binaries: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{REGISTRY}/{self.name}:{self.tag}"

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.tag}.tar"


def _which(binary: str) -> str:
    path = shutil.which(binary) if "/" not in binary else binary
    if not path or not os.path.exists(path):
        raise LabError(f"{binary} not found on this machine (run scripts/install-deps.sh)")
    return path


def _version(argv: list[str], pattern: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise LabError(f"cannot run {' '.join(argv)}: {err}") from err
    match = re.search(pattern, out)
    if not match:
        raise LabError(f"cannot find a version in the output of {' '.join(argv)}")
    return match.group(1)


def default_recipes() -> dict[str, ImageRecipe]:
    """The lab's images: `pause` (sandbox), `etcd` and `haproxy`, from the host's Debian packages."""
    etcd = _which("etcd")
    haproxy = _which("haproxy")
    sleep = _which("sleep")
    return {
        # A pod sandbox only needs a process that waits; it is stopped with SIGKILL.
        "pause": ImageRecipe("pause", "3.9", (sleep,), (sleep, "infinity")),
        "etcd": ImageRecipe("etcd", _version([etcd, "--version"], r"etcd Version:\s*(\S+)"),
                            (etcd,), (etcd,), dirs=("var/lib/etcd",)),
        "haproxy": ImageRecipe("haproxy", _version([haproxy, "-v"], r"version\s+(\d+\.\d+\.\d+)"),
                               (haproxy,), (haproxy,), dirs=("usr/local/etc/haproxy",)),
    }


def shared_libraries(binary: str) -> list[str]:
    """Absolute paths of the shared libraries (and loader) `binary` needs, from ldd."""
    proc = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        if "not a dynamic executable" in proc.stdout + proc.stderr:
            return []
        raise LabError(f"ldd {binary} failed: {proc.stderr.strip()}")
    libs: list[str] = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            raise LabError(f"{binary}: shared library missing on this machine: {line}")
        match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if match:
            libs.append(match.group(1))
    return sorted(set(libs))


def _tarinfo(name: str, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _layer(recipe: ImageRecipe) -> bytes:
    """The image's single layer, as an uncompressed deterministic tar."""
    files: dict[str, tuple[str | None, bytes | None, int]] = {}  # path -> (host source, data, mode)
    for binary in recipe.binaries:
        for path in [binary, *shared_libraries(binary)]:
            real = os.path.realpath(path)
            files[path.lstrip("/")] = (real, None, os.stat(real).st_mode & 0o7777)
    for path, text in _ETC_FILES.items():
        files[path] = (None, text.encode(), 0o644)
    dirs = dict(_DIRS)
    dirs.update({d: 0o755 for d in recipe.dirs})
    for path in list(files) + list(dirs):
        parent = os.path.dirname(path)
        while parent:
            dirs.setdefault(parent, 0o755)
            parent = os.path.dirname(parent)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(set(dirs) | set(files)):
            if name in files:
                src, data, mode = files[name]
                if data is None:
                    assert src is not None
                    data = Path(src).read_bytes()
                tar.addfile(_tarinfo(name, mode=mode, size=len(data)), io.BytesIO(data))
            else:
                tar.addfile(_tarinfo(name, kind=tarfile.DIRTYPE, mode=dirs[name]))
    return buf.getvalue()


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_image(recipe: ImageRecipe, out_dir: Path) -> Path:
    """Write `recipe` as a docker-archive tarball under `out_dir`; returns its path."""
    layer = _layer(recipe)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = _json({
        "architecture": _arch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": list(recipe.entrypoint), "Cmd": list(recipe.cmd) or None,
                   "Env": _ENV, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gitops lab (host binaries)"}],
    })
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = _json([{"Config": config_name, "RepoTags": [recipe.ref], "Layers": [layer_name]}])
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / recipe.filename
    tmp = target.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted([(config_name, config), (layer_name, layer),
                                  ("manifest.json", manifest)]):
            if "/" in name:
                tar.addfile(_tarinfo(os.path.dirname(name), kind=tarfile.DIRTYPE, mode=0o755))
            tar.addfile(_tarinfo(name, size=len(data)), io.BytesIO(data))
    tmp.replace(target)
    event(log, logging.INFO, "built image", image=recipe.ref, path=str(target), bytes=target.stat().st_size)
    return target


def build_images(recipes: Iterable[ImageRecipe], out_dir: Path) -> dict[str, Path]:
    """Build every recipe; returns image ref -> tarball path."""
    return {r.ref: build_image(r, out_dir) for r in recipes}
