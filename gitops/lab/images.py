"""Container images built from host binaries (no registry needed).

An image is a stack of layers; each layer holds host binaries (with every shared
library `ldd` reports for them), further host files or directories, generated
files (scripts, configs) and, in a base layer, a minimal /etc. Images are
written as docker-archive tarballs (manifest.json + configs + layer.tar files)
that `ctr images import` accepts; several images can share one archive, and
layers they share are stored once. Output is byte-for-byte deterministic for the
same host files.
"""
from __future__ import annotations

import fnmatch
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gitops.logs import event
from gitops.lab.errors import LabError

log = logging.getLogger(__name__)

REGISTRY = "gitops.lab"
_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
_DIRS = {"tmp": 0o1777, "var/lib": 0o755, "var/run": 0o755, "run": 0o755, "root": 0o700}
# merged /usr, as on the host: binaries found in /bin or /sbin are stored under /usr
_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin"}
_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/lib:/usr/lib"]


@dataclass(frozen=True)
class ImageFile:
    """A generated file in an image (a script, a config)."""

    path: str  # absolute, in the image
    data: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class ImageRecipe:
    """What goes into an image built from host binaries.

    `binaries` and `extra` are host paths copied at the same path (symlinks
    resolved; /bin and /sbin map to /usr/bin and /usr/sbin); directories in
    `extra` are copied whole; `installs` are (host path, image path) pairs for
    files or directories that go elsewhere (a cached build's binaries into /usr/local/bin,
    Python packages into dist-packages). `exclude`: fnmatch patterns of host paths below
    `extra` and `installs` directories left out (a library's tests, byte code).
    ELF files bring their shared libraries. With a `base`, the base's layers
    come first and this recipe adds one layer.
    """

    name: str
    tag: str
    binaries: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    files: tuple[ImageFile, ...] = ()
    installs: tuple[tuple[str, str], ...] = ()
    exclude: tuple[str, ...] = ()
    base: ImageRecipe | None = None
    stop_signal: str = ""  # e.g. SIGKILL for images whose PID 1 ignores SIGTERM (sleep)
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def ref(self) -> str:
        return f"{REGISTRY}/{self.name}:{self.tag}"

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.tag}.tar"

    def chain(self) -> list[ImageRecipe]:
        """Base first, this recipe last."""
        return ([] if self.base is None else self.base.chain()) + [self]


def _which(binary: str) -> str:
    path = shutil.which(binary) if "/" not in binary else binary
    if not path or not os.path.exists(path):
        raise LabError(f"{binary} not found on this machine (run scripts/install-deps.sh)")
    return path


def _version(argv: list[str], pattern: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30)
        out = done.stdout + done.stderr  # (keepalived prints its version on stderr)
    except (OSError, subprocess.SubprocessError) as err:
        raise LabError(f"cannot run {' '.join(argv)}: {err}") from err
    match = re.search(pattern, out)
    if not match:
        raise LabError(f"cannot find a version in the output of {' '.join(argv)}")
    return match.group(1)


def base_recipes() -> dict[str, ImageRecipe]:
    """The lab's own images: `pause` (sandbox), `haproxy` and `keepalived`, from the host's Debian packages,
    and `busybox` (busybox-static) for workloads on joined workers."""
    busybox = _which("busybox")
    haproxy = _which("haproxy")
    keepalived = _which("keepalived")
    sleep = _which("sleep")
    return {
        # A pod sandbox only needs a process that waits; it is stopped with SIGKILL.
        "pause": ImageRecipe("pause", "3.9", (sleep,), (sleep, "infinity")),
        # as docker.io/library/haproxy: stopped with SIGUSR1, a soft stop (connections in flight finish)
        "haproxy": ImageRecipe("haproxy", _version([haproxy, "-v"], r"version\s+(\d+\.\d+\.\d+)"),
                               (haproxy,), (haproxy,), dirs=("usr/local/etc/haproxy",), stop_signal="SIGUSR1"),
        # keepalived (VRRP) beside haproxy in an ingress pod of a cluster with a virtual IP; GNU wget for its
        # health check of haproxy (/usr/bin/wget, as in the upstream image; busybox-static's wget crashes here);
        # kill (procps) for the plan's reload, `kill -HUP 1`, as the upstream image's busybox has it
        "keepalived": ImageRecipe("keepalived", _version([keepalived, "--version"], r"Keepalived v(\d+\.\d+\.\d+)"),
                                  (keepalived, _which("wget"), _which("kill")), (keepalived,),
                                  dirs=("tmp", "run", "etc/keepalived")),
        "busybox": ImageRecipe("busybox", _version([busybox], r"BusyBox v(\d+\.\d+\.\d+)"),
                               (busybox,), (busybox,), cmd=("sh",), dirs=("tmp", "www")),
    }


def shared_libraries(binary: str) -> list[str]:
    """Absolute paths of the shared libraries (and loader) `binary` needs, from ldd ([] for non-ELF files)."""
    with open(binary, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return []
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


def _tarinfo(name: str, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, size: int = 0,
             link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _image_path(path: str) -> str:
    """Where a host path goes in an image: relative, with /bin and /sbin folded into /usr."""
    rel = path.lstrip("/")
    for link, target in _LINKS.items():
        if rel.startswith(link + "/"):
            return target + rel[len(link):]
    return rel


def _host_files(path: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """`path`, or every file below it if it is a directory (sorted), but those `exclude` matches."""
    if not os.path.isdir(path):
        return [path]
    found = []
    for root, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not _excluded(os.path.join(root, d), exclude))
        found += [p for p in (os.path.join(root, name) for name in sorted(filenames)) if not _excluded(p, exclude)]
    return found


def _excluded(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _layer(recipe: ImageRecipe) -> bytes:
    """The recipe's own layer, as an uncompressed deterministic tar."""
    files: dict[str, tuple[str | None, bytes | None, int]] = {}  # path -> (host source, data, mode)
    sources = [p for b in recipe.binaries for p in [b, *shared_libraries(b)]]
    for extra in recipe.extra:
        if not os.path.exists(extra):
            raise LabError(f"{extra} not found on this machine (run scripts/install-deps.sh)")
        for path in _host_files(extra, recipe.exclude):
            sources += [path, *shared_libraries(os.path.realpath(path))]
    placed = [(path, _image_path(path)) for path in sources]
    for host, target in recipe.installs:
        if not os.path.exists(host):
            raise LabError(f"{host} not found on this machine")
        for path in _host_files(host, recipe.exclude):
            inside = target.lstrip("/") if path == host else os.path.join(target.lstrip("/"),
                                                                          os.path.relpath(path, host))
            placed += [(path, inside)] + [(lib, _image_path(lib)) for lib in shared_libraries(os.path.realpath(path))]
    for path, target in placed:
        real = os.path.realpath(path)
        files[target] = (real, None, os.stat(real).st_mode & 0o7777)
    for generated in recipe.files:
        files[generated.path.lstrip("/")] = (None, generated.data, generated.mode)
    dirs = {d: 0o755 for d in recipe.dirs}
    links: dict[str, str] = {}
    if recipe.base is None:
        for path, text in _ETC_FILES.items():
            files.setdefault(path, (None, text.encode(), 0o644))
        dirs.update(_DIRS)
        links.update(_LINKS)
        dirs.update({target: 0o755 for target in _LINKS.values()})
    for path in list(files) + list(dirs):
        parent = os.path.dirname(path)
        while parent:
            dirs.setdefault(parent, 0o755)
            parent = os.path.dirname(parent)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(set(dirs) | set(files) | set(links)):
            if name in links:
                tar.addfile(_tarinfo(name, kind=tarfile.SYMTYPE, mode=0o777, link=links[name]))
            elif name in files:
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


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Layers:
    """Layer tarballs by recipe, each built once (shared by the archives of one lab)."""

    def __init__(self) -> None:
        self._built: dict[ImageRecipe, tuple[str, bytes]] = {}

    def get(self, recipe: ImageRecipe) -> tuple[str, bytes]:
        """(hex sha256, tar bytes) of the recipe's own layer."""
        if recipe not in self._built:
            layer = _layer(recipe)
            self._built[recipe] = (_sha(layer), layer)
        return self._built[recipe]


def _config(recipe: ImageRecipe, diff_ids: list[str]) -> bytes:
    config: dict[str, object] = {"Entrypoint": list(recipe.entrypoint), "Cmd": list(recipe.cmd) or None,
                                 "Env": _ENV, "WorkingDir": "/"}
    if recipe.stop_signal:
        config["StopSignal"] = recipe.stop_signal
    if recipe.labels:
        config["Labels"] = dict(recipe.labels)
    return _json({
        "architecture": _arch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"gitops lab: {r.name}:{r.tag}"}
                    for r in recipe.chain()],
    })


def build_archive(images: Sequence[tuple[ImageRecipe, Sequence[str]]], target: Path,
                  layers: Layers | None = None) -> Path:
    """Write several images into one docker-archive tarball at `target`.

    Each entry is (recipe, extra tags): the image is tagged with its lab ref and
    every extra tag (aliases such as upstream names). Shared layers are stored once.
    """
    layers = layers or Layers()
    blobs: dict[str, bytes] = {}
    manifest = []
    for recipe, extra_tags in images:
        diff_ids = []
        for part in recipe.chain():
            digest, layer = layers.get(part)
            diff_ids.append(digest)
            blobs[f"{digest}/layer.tar"] = layer
        config = _config(recipe, diff_ids)
        config_name = _sha(config) + ".json"
        blobs[config_name] = config
        manifest.append({"Config": config_name, "RepoTags": list(dict.fromkeys([recipe.ref, *extra_tags])),
                         "Layers": [f"{d}/layer.tar" for d in diff_ids]})
    blobs["manifest.json"] = _json(manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for name, data in sorted(blobs.items()):
            if "/" in name and os.path.dirname(name) not in made:
                made.add(os.path.dirname(name))
                tar.addfile(_tarinfo(os.path.dirname(name), kind=tarfile.DIRTYPE, mode=0o755))
            tar.addfile(_tarinfo(name, size=len(data)), io.BytesIO(data))
    tmp.replace(target)
    event(log, logging.INFO, "built images", images=len(manifest), path=str(target), bytes=target.stat().st_size)
    return target


def build_image(recipe: ImageRecipe, out_dir: Path) -> Path:
    """Write `recipe` as a docker-archive tarball under `out_dir`; returns its path."""
    return build_archive([(recipe, ())], out_dir / recipe.filename)
