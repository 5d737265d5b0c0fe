"""The lab's images: real binaries of every Kubernetes and etcd version asked for, and the lab's own.

* `kube-apiserver`, `kube-controller-manager`, `kube-scheduler` per Kubernetes version and `etcd` (with
  etcdctl and etcdutl) per etcd version: the binaries `scripts/build-kubernetes.sh` built from their Go
  modules (`gitops.lab.kubebin`); a version that is not built is an error naming the build step;
* the files `agent`: sh (dash), openssl and the coreutils the agent's scripts use;
* the `jumphost`: Debian's real sshd with ssh-keygen, sh and the entrypoint of
  `gitops.compile.jumphost` (the real daemon, configured by gitops);
* `gitops-oidc`: the interpreter gitops runs on, its standard library, gitops and the
  packages `gitops oidc serve` imports (the provider SIP's auth pod runs, as the controller
  image would run it). Built on demand (`python_recipe`): only labs that run an auth pod import it,
  on their public hypervisors;
* pause, haproxy, keepalived and busybox from the host's Debian packages (`gitops.lab.images`).

`upstream_aliases` maps the image names gitops's clusters use by default
(registry.k8s.io/..., docker.io/library/haproxy, the agent, the jump host) to these lab images.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from gitops.lab import kubebin
from gitops.lab.errors import LabError
from gitops.lab.images import ImageFile, ImageRecipe, _which, base_recipes
from gitops import __version__
from gitops.model import versions
from gitops.model.components import COMPONENTS as COMPONENT_REGISTRY, DEFAULT_AGENT_IMAGE, KEEPALIVED, OIDC
from gitops.compile import jumphost

#: what a lab imports unless told otherwise: the two newest releases, which the example repo's clusters run
#: (team-a the newest, team-b the one before; the oldest on request: `--kubernetes-versions`)
DEFAULT_KUBERNETES_VERSIONS = kubebin.KUBERNETES_BUILT[-2:][::-1]
UPSTREAM_HAPROXY = "docker.io/library/haproxy:2.8"
COMPONENTS = kubebin.CONTROL_PLANE

#: what the files agent's scripts may call (sh is dash; echo, printf, test, cd, read are builtins)
AGENT_TOOLS = ("sh", "openssl", "sleep", "sha256sum", "cut", "cat", "mv", "rm", "mkdir", "chmod", "ls",
               "printf", "cp", "ln", "touch", "head", "tail", "wc", "tr", "grep", "sed", "env",
               "dirname", "basename", "rmdir", "true", "false", "stat", "date", "sync", "id")
_OPENSSL_DIR = "/usr/lib/ssl"  # OPENSSLDIR of Debian's openssl: openssl.cnf lives there
_MULTIARCH_LIB = "/usr/lib/x86_64-linux-gnu"


normalize_version = kubebin.normalize


def _openssl_extras() -> tuple[str, ...]:
    """openssl's config and its engines/providers directories (if this host has them)."""
    found = [f"{_OPENSSL_DIR}/openssl.cnf"]
    if not os.path.exists(found[0]):
        raise LabError(f"{found[0]} not found (is openssl installed?)")
    for sub in ("engines-3", "ossl-modules"):
        if os.path.isdir(f"{_MULTIARCH_LIB}/{sub}"):
            found.append(f"{_MULTIARCH_LIB}/{sub}")
    return tuple(found)


def agent_recipe() -> ImageRecipe:
    """The files agent: gitops runs `sleep infinity` in it and `sh -c` scripts via ExecSync."""
    tag = DEFAULT_AGENT_IMAGE.rsplit(":", 1)[1]
    # sleep as PID 1 ignores SIGTERM: SIGKILL stops the container at once (it holds no state)
    return ImageRecipe("agent", tag, tuple(_which(b) for b in AGENT_TOOLS), ("sleep", "infinity"),
                       extra=_openssl_extras(), dirs=("node",), stop_signal="SIGKILL",
                       labels=(("org.opencontainers.image.description", "gitops lab files agent"),))


#: what the jump host's entrypoint runs (besides sshd itself)
JUMPHOST_TOOLS = ("sh", "ssh-keygen", "sha256sum", "mkdir", "cp", "mv", "rm", "chmod", "chown")


def sshd_version(sshd: str) -> str:
    """OpenSSH's version (e.g. 9.2p1), from the banner compiled into `sshd`."""
    try:
        data = Path(sshd).read_bytes()
    except OSError as err:
        raise LabError(f"cannot read {sshd}: {err}") from err
    # the banner (OpenSSH_9.2p1) carries the portable release; sshd -V says only 9.2
    match = re.search(rb"OpenSSH_(\d+\.\d+p\d+)", data) or re.search(rb"OpenSSH_(\d+\.\d+)", data)
    if not match:
        raise LabError(f"cannot find OpenSSH's version in {sshd}")
    return match.group(1).decode()


def jumphost_recipe() -> ImageRecipe:
    """`gitops.lab/jumphost:<openssh version>`: the host's sshd, run by gitops.compile.jumphost's entrypoint.

    Besides the binaries (and their libraries): /etc/passwd with sshd's privilege-separation
    user and the login user, their home and /run/sshd (root, 0755), /etc/ssh/moduli.
    """
    sshd = _which(jumphost.SSHD)
    moduli = "/etc/ssh/moduli"
    return ImageRecipe(
        "jumphost", sshd_version(sshd), (sshd, *(_which(t) for t in JUMPHOST_TOOLS)), (jumphost.ENTRYPOINT,),
        dirs=(jumphost.PRIVSEP_DIR.lstrip("/"), jumphost.LOGIN_HOME.lstrip("/"), jumphost.STATE_DIR.lstrip("/"),
              jumphost.FILES_DIR.lstrip("/"), "etc/ssh"),
        extra=(moduli,) if os.path.exists(moduli) else (),
        files=(ImageFile(jumphost.ENTRYPOINT, jumphost.entrypoint_script().encode(), 0o755),
               ImageFile("/etc/passwd", jumphost.passwd_text().encode()),
               ImageFile("/etc/group", jumphost.group_text().encode())),
        labels=(("org.opencontainers.image.description", "gitops jump host (lab build of the host's sshd)"),))


#: what `gitops oidc serve` imports, at once or later (the password hashes), beyond the standard library
OIDC_MODULES = ("gitops.cli", "gitops.cli.oidc", "gitops.oidc.provider", "gitops.oidc.passwords", "waitress",
                "bcrypt", "argon2", "joserfc.jwk")
#: parts of the standard library a server never imports
_STDLIB_UNUSED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "venv",
                  "unittest", "distutils", "site-packages", "dist-packages", "config-*", "lib-dynload/_test*",
                  "lib-dynload/_tkinter*", "lib-dynload/_ctypes_test*", "lib-dynload/xx*", "lib-dynload/_xx*")
#: where its packages go in the image (the launcher puts it first on sys.path: the interpreter's own
#: site-packages directory differs between Debian's python3 and others)
PACKAGES_DIR = "/opt/gitops/lib"
PYTHON_HOME = "/opt/python"
#: the uid the provider drops to (the controller image's user)
OIDC_UID = 10001

_FIND_PACKAGES = r"""
import importlib, importlib.metadata as md, json, os, sys, sysconfig
for name in sys.argv[1:]:
    importlib.import_module(name)
std = {os.path.realpath(sysconfig.get_paths()["stdlib"])}
dists = md.packages_distributions()
found = set()
for name, module in list(sys.modules.items()):
    top = name.partition(".")[0]
    where = getattr(sys.modules.get(top), "__path__", None)
    path = list(where)[0] if where else getattr(sys.modules.get(top), "__file__", None)
    if not path or any(os.path.realpath(path).startswith(s + os.sep) for s in std):
        continue
    found.add(os.path.realpath(path))
    parent = os.path.dirname(os.path.realpath(path))
    if os.path.isdir(os.path.join(parent, top + ".libs")):
        found.add(os.path.join(parent, top + ".libs"))
    for dist in dists.get(top, ()):
        meta = md.distribution(dist)
        info = getattr(meta, "_path", None)
        if info is not None and os.path.isdir(str(info)):
            found.add(os.path.realpath(str(info)))
print(json.dumps(sorted(found)))
"""


def python_packages(modules: Iterable[str] = OIDC_MODULES) -> list[str]:
    """Host paths of the packages (with their dist-info and bundled libraries) outside the standard library
    that importing `modules` loads, in the interpreter gitops runs on."""
    try:
        done = subprocess.run([sys.executable, "-c", _FIND_PACKAGES, *modules], capture_output=True, text=True,
                              check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        raise LabError(f"cannot list what {' '.join(modules)} import: {err}") from err
    return json.loads(done.stdout)


def python_recipe() -> ImageRecipe:
    """`gitops.lab/gitops-oidc:<version>-py<X.Y>`: the interpreter and standard library this gitops runs on (under
    /opt/python, readable by any user: the provider drops root), gitops itself and what `gitops oidc serve`
    imports, and /usr/local/bin/gitops; `gitops` (uid OIDC_UID) in /etc/passwd."""
    python = os.path.realpath(sys.executable)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    home = f"{PYTHON_HOME}/lib/python{version}"  # where the interpreter looks for it, from its own path
    launcher = (f"#!{PYTHON_HOME}/bin/python{version} -s\nimport sys\nsys.path.insert(0, {PACKAGES_DIR!r})\n"
                "from gitops.cli import main\nsys.exit(main())\n")
    return ImageRecipe(
        "gitops-oidc", f"{__version__}-py{version}", (), ("/usr/local/bin/gitops",),
        installs=((python, f"{PYTHON_HOME}/bin/python{version}"), (stdlib, home),
                  *((path, f"{PACKAGES_DIR}/{os.path.basename(path)}") for path in python_packages())),
        exclude=(*(f"{stdlib}/{part}" for part in _STDLIB_UNUSED), "*/__pycache__", "*.pyc"),
        dirs=("tmp", "var/lib/gitops"),
        files=(ImageFile("/usr/local/bin/gitops", launcher.encode(), 0o755),
               ImageFile("/etc/passwd", (f"root:x:0:0:root:/root:/bin/sh\n"
                                         f"gitops:x:{OIDC_UID}:{OIDC_UID}:gitops:/var/lib/gitops:/bin/false\n"
                                         "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n").encode()),
               ImageFile("/etc/group", f"root:x:0:\ngitops:x:{OIDC_UID}:\nnogroup:x:65534:\n".encode())),
        labels=(("org.opencontainers.image.description", "gitops OIDC provider (lab build of this gitops)"),))


def etcd_versions(kubernetes_versions: Iterable[str]) -> tuple[str, ...]:
    """The etcd version ("3.7.3") each of `kubernetes_versions` runs by default, each once, oldest first."""
    return tuple(sorted({versions.etcd_for(v) for v in kubernetes_versions}, key=versions.parse))


def lab_recipes(kubernetes_versions: Iterable[str] = DEFAULT_KUBERNETES_VERSIONS,
                etcd: Iterable[str] = ()) -> dict[str, ImageRecipe]:
    """role -> recipe: pause, haproxy, keepalived, busybox, agent, jumphost, `<component>/v<version>` for each
    Kubernetes version and `etcd/<version>` for each etcd version (`etcd`, or those the Kubernetes versions
    run by default). Every Kubernetes and etcd image holds real binaries: a version that is not built is a
    LabError naming the build step."""
    kube = tuple(dict.fromkeys(normalize_version(v) for v in kubernetes_versions))
    recipes = base_recipes()
    recipes["agent"] = agent_recipe()
    recipes["jumphost"] = jumphost_recipe()
    for version in dict.fromkeys((*(e.strip().removeprefix("v") for e in etcd), *etcd_versions(kube))):
        recipes[f"etcd/{version}"] = kubebin.etcd_recipe(version)
    for version in kube:
        for component in COMPONENTS:
            recipes[f"{component}/{version}"] = kubebin.real_recipe(component, version)
    return recipes


def controlplane_roles(roles: Iterable[str]) -> set[str]:
    """Of `roles` (a `lab_recipes` dict, or a lab's images by role), the versioned images (`etcd/<version>`,
    `<component>/v<version>`): only control-plane Nodes run them, and those sit on private hypervisors
    (validation refuses one on a public one)."""
    return {role for role in roles if "/" in role}


def upstream_aliases(recipes: dict[str, ImageRecipe]) -> dict[str, str]:
    """alias (an image name a default Cluster uses) -> lab image ref."""
    aliases = {
        UPSTREAM_HAPROXY: recipes["haproxy"].ref,
        COMPONENT_REGISTRY[KEEPALIVED].default_image: recipes["keepalived"].ref,
        DEFAULT_AGENT_IMAGE: recipes["agent"].ref,
        jumphost.DEFAULT_JUMPHOST_IMAGE: recipes["jumphost"].ref,
    }
    if "gitops-oidc" in recipes:
        aliases[COMPONENT_REGISTRY[OIDC].default_image] = recipes["gitops-oidc"].ref
    for role, recipe in sorted(recipes.items()):
        name, _, version = role.partition("/")
        if version:  # etcd/3.7.3 -> registry.k8s.io/etcd:3.7.3-0 (upstream's tag); kube-*/v1.37.2 as it is
            aliases[f"registry.k8s.io/{name}:{version}-0" if name == "etcd" else f"registry.k8s.io/{name}:{version}"] \
                = recipe.ref
    return aliases
