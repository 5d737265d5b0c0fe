"""The lab's own images, and STAND-INS for Kubernetes versions that cannot be built here.

The one version whose real binaries can be built on these machines (v1.20.2, see
`gitops.lab.kubebin`) runs the real kube-apiserver, kube-controller-manager and
kube-scheduler; every other version gets the stand-ins below. The images:

* the files `agent`: sh (dash), openssl and the coreutils the agent's scripts use;
* `kube-apiserver` STAND-IN: a sh script that parses the real flags it needs and
  runs haproxy serving HTTPS on --bind-address:--secure-port with the real serving
  certificate, requiring a client certificate signed by --client-ca-file; it answers
  /healthz, /livez, /readyz ("ok") and /version (JSON), everything else 404;
* `kube-controller-manager` and `kube-scheduler` STAND-INS: sh scripts that check
  their kubeconfig and the files it names, say what they would do, and sleep;
* the `jumphost`: Debian's real sshd with ssh-keygen, sh and the entrypoint of
  `gitops.compile.jumphost` (not a stand-in: the real daemon, configured by gitops);
* `gitops-oidc`: the interpreter gitops runs on, its standard library, gitops and the
  packages `gitops oidc serve` imports (not a stand-in: the provider SIP's auth pod runs,
  as the controller image would run it). Built on demand (`python_recipe`): only labs
  that run an auth pod import it, on their public hypervisors.

Every stand-in fails loudly (exit 1, message on stderr) when a file a flag names
(`--*-file`, `--*file`, `--*kubeconfig`, `--*-certificate`, `--*-key`) is missing.

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
from gitops.model.components import COMPONENTS as COMPONENT_REGISTRY, DEFAULT_AGENT_IMAGE, KEEPALIVED, OIDC
from gitops.model.resources import DEFAULT_ETCD_VERSION
from gitops.compile import jumphost

#: the real, buildable version first; the others are stand-ins
DEFAULT_KUBERNETES_VERSIONS = ("1.20.2", "1.31.2", "1.30.6")
REAL = "real"
STANDIN = "stand-in"
UPSTREAM_HAPROXY = "docker.io/library/haproxy:2.8"
STANDIN_PLATFORM = "gitops-lab-standin"
COMPONENTS = kubebin.CONTROL_PLANE

#: what the files agent's scripts may call (sh is dash; echo, printf, test, cd, read are builtins)
AGENT_TOOLS = ("sh", "openssl", "sleep", "sha256sum", "cut", "cat", "mv", "rm", "mkdir", "chmod", "ls",
               "printf", "cp", "ln", "touch", "head", "tail", "wc", "tr", "grep", "sed", "env",
               "dirname", "basename", "rmdir", "true", "false", "stat", "date", "sync", "id")
_OPENSSL_DIR = "/usr/lib/ssl"  # OPENSSLDIR of Debian's openssl: openssl.cnf lives there
_MULTIARCH_LIB = "/usr/lib/x86_64-linux-gnu"


def normalize_version(version: str) -> str:
    """"1.31.2" or "v1.31.2" -> "v1.31.2"; LabError unless it is MAJOR.MINOR.PATCH."""
    v = version.strip().removeprefix("v")
    parts = v.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise LabError(f"not a Kubernetes version (want MAJOR.MINOR.PATCH): {version!r}")
    return "v" + v


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


# ---------------------------------------------------------------------------- scripts

_COMMON = r"""
die() { echo "$PROG (gitops lab stand-in $VERSION): $*" >&2; exit 1; }
say() { echo "$PROG (gitops lab stand-in $VERSION): $*"; }
need_file() {  # flag-or-field path
  [ -e "$2" ] || die "$1: $2: no such file"
  [ -f "$2" ] || die "$1: $2: not a regular file"
  [ -r "$2" ] || die "$1: $2: not readable"
}
# Flags come as --name=value or --name value (none of these programs takes arguments).
# Calls on_flag NAME VALUE for each; checks every flag that names a file.
parse_flags() {
  while [ $# -gt 0 ]; do
    arg=$1; shift
    case $arg in
      --*=*) name=${arg%%=*}; value=${arg#*=} ;;
      --*) name=$arg
           case ${1-} in
             --*|'') value=true ;;
             *) value=$1; shift ;;
           esac ;;
      *) die "unexpected argument: $arg" ;;
    esac
    case $name in
      *file|*kubeconfig|*-certificate|*-key)
        [ -z "$value" ] || need_file "$name" "$value" ;;
    esac
    on_flag "$name" "$value"
  done
}
"""

_APISERVER = r"""
bind=0.0.0.0 port=6443 cert= key= ca=
on_flag() {
  case $1 in
    --bind-address) bind=$2 ;;
    --secure-port) port=$2 ;;
    --tls-cert-file) cert=$2 ;;
    --tls-private-key-file) key=$2 ;;
    --client-ca-file) ca=$2 ;;
  esac
}
parse_flags "$@"
[ -n "$cert" ] || die "--tls-cert-file is required"
[ -n "$key" ] || die "--tls-private-key-file is required"
[ -n "$ca" ] || die "--client-ca-file is required (the stand-in only serves clients with certificates)"
case $port in ''|*[!0-9]*) die "--secure-port: not a port: $port" ;; esac
umask 077
mkdir -p /tmp/kube-apiserver || die "cannot create /tmp/kube-apiserver"
pem=/tmp/kube-apiserver/serving.pem
cfg=/tmp/kube-apiserver/haproxy.cfg
{ cat "$cert" && echo && cat "$key"; } > "$pem" || die "cannot write $pem"
cat > "$cfg" <<EOF || die "cannot write $cfg"
# kube-apiserver stand-in $VERSION (gitops lab)
global
    maxconn 1024
    ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s

frontend kube-apiserver
    bind $bind:$port ssl crt $pem ca-file $ca verify required alpn h2,http/1.1
    http-request return status 200 content-type text/plain string ok if { path /healthz /livez /readyz }
    http-request return status 200 content-type application/json string '$VERSION_JSON' if { path /version /version/ }
    http-request return status 404 content-type application/json string '$NOT_FOUND_JSON'
EOF
say "serving https://$bind:$port (/healthz /livez /readyz /version; client certificates signed by $ca required)"
exec haproxy -W -db -f "$cfg"
"""

_CONTROLLER = r"""
kubeconfig=
on_flag() {
  case $1 in
    --kubeconfig) kubeconfig=$2 ;;
  esac
}
parse_flags "$@"
[ -n "$kubeconfig" ] || die "--kubeconfig is required"
need_file --kubeconfig "$kubeconfig"
server= cert= keyfile= certdata= keydata=
trim() { t=$1; t=${t#"${t%%[! ]*}"}; t=${t%"${t##*[! ]}"}; t=${t#\"}; t=${t%\"}; printf %s "$t"; }
while IFS= read -r line || [ -n "$line" ]; do
  case $line in *:*) ;; *) continue ;; esac
  field=$(trim "${line%%:*}"); field=${field#- }
  value=$(trim "${line#*:}")
  case $field in
    certificate-authority|client-certificate|client-key)
      case $value in /*) ;; *) value=${kubeconfig%/*}/$value ;; esac
      need_file "$kubeconfig: $field" "$value"
      case $field in client-certificate) cert=$value ;; client-key) keyfile=$value ;; esac ;;
    client-certificate-data) certdata=1 ;;
    client-key-data) keydata=1 ;;
    server) server=$value ;;
  esac
done < "$kubeconfig"
[ -n "$server" ] || die "$kubeconfig: no server"
[ -n "$cert$certdata" ] || die "$kubeconfig: no client-certificate"
[ -n "$keyfile$keydata" ] || die "$kubeconfig: no client-key"
say "would $WORK against $server as ${cert:-the embedded client certificate} (kubeconfig $kubeconfig); sleeping instead"
exec sleep infinity
"""

_WORK = {"kube-controller-manager": "run the controllers", "kube-scheduler": "schedule pods"}


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def version_json(version: str) -> str:
    v = normalize_version(version)
    major, minor, _ = v[1:].split(".")
    return json.dumps({"major": major, "minor": minor, "gitVersion": v, "platform": STANDIN_PLATFORM},
                      separators=(",", ":"))


def standin_script(component: str, version: str) -> str:
    """The POSIX sh script installed as /usr/local/bin/<component> in the stand-in image."""
    v = normalize_version(version)
    head = (f"#!/bin/sh\n# {component} STAND-IN for the gitops lab: not Kubernetes.\n"
            f"PROG={component}\nVERSION={v}\n")
    if component == "kube-apiserver":
        not_found = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "message": "the gitops lab kube-apiserver stand-in serves only "
                                           "/healthz, /livez, /readyz and /version",
                                "reason": "NotFound", "code": 404}, separators=(",", ":"))
        head += f"VERSION_JSON={_sh_quote(version_json(v))}\nNOT_FOUND_JSON={_sh_quote(not_found)}\n"
        body = _APISERVER
    elif component in _WORK:
        head += f"WORK={_sh_quote(_WORK[component])}\n"
        body = _CONTROLLER
    else:
        raise LabError(f"no stand-in for {component}")
    return head + _COMMON + body


def standin_recipe(component: str, version: str, base: ImageRecipe) -> ImageRecipe:
    """`gitops.lab/<component>-standin:v<version>`: the script as /usr/local/bin/<component> over `base`.

    `base` provides the programs the script runs: haproxy's image for the apiserver,
    the agent (sh, sleep, cat...) for the others.
    """
    v = normalize_version(version)
    path = f"/usr/local/bin/{component}"
    tools = ("sh", "cat", "mkdir") if component == "kube-apiserver" else ()
    return ImageRecipe(
        f"{component}-standin", v, tuple(_which(t) for t in tools), (path,),
        files=(ImageFile(path, standin_script(component, v).encode(), 0o755),), base=base,
        # sleep (the controller stand-ins' PID 1) ignores SIGTERM
        stop_signal="" if component == "kube-apiserver" else "SIGKILL",
        labels=(("org.opencontainers.image.description", f"gitops lab {component} stand-in {v}"),))


def kinds(kubernetes_versions: Iterable[str]) -> dict[str, str]:
    """version -> "real" (the cached binaries of the one buildable version) or "stand-in"."""
    return {v: REAL if kubebin.buildable(v) else STANDIN
            for v in dict.fromkeys(normalize_version(v) for v in kubernetes_versions)}


def lab_recipes(kubernetes_versions: Iterable[str] = DEFAULT_KUBERNETES_VERSIONS) -> dict[str, ImageRecipe]:
    """role -> recipe: pause, etcd, haproxy, agent, jumphost and `<component>/v<version>` images.

    The buildable version (v1.20.2) gets the real binaries (LabError naming the build
    step if they are not built); every other version gets stand-ins.
    """
    recipes = base_recipes()
    recipes["agent"] = agent_recipe()
    recipes["jumphost"] = jumphost_recipe()
    for version, kind in kinds(kubernetes_versions).items():
        for component in COMPONENTS:
            if kind == REAL:
                recipes[f"{component}/{version}"] = kubebin.real_recipe(component, version)
                continue
            base = recipes["haproxy"] if component == "kube-apiserver" else recipes["agent"]
            recipes[f"{component}/{version}"] = standin_recipe(component, version, base)
    return recipes


def upstream_aliases(recipes: dict[str, ImageRecipe], kubernetes_versions: Iterable[str] = DEFAULT_KUBERNETES_VERSIONS,
                     etcd_version: str = DEFAULT_ETCD_VERSION) -> dict[str, str]:
    """alias (an image name a default Cluster uses) -> lab image ref."""
    aliases = {
        f"registry.k8s.io/etcd:{etcd_version.strip().removeprefix('v')}-0": recipes["etcd"].ref,
        UPSTREAM_HAPROXY: recipes["haproxy"].ref,
        COMPONENT_REGISTRY[KEEPALIVED].default_image: recipes["keepalived"].ref,
        DEFAULT_AGENT_IMAGE: recipes["agent"].ref,
        jumphost.DEFAULT_JUMPHOST_IMAGE: recipes["jumphost"].ref,
    }
    if "gitops-oidc" in recipes:
        aliases[COMPONENT_REGISTRY[OIDC].default_image] = recipes["gitops-oidc"].ref
    for version in dict.fromkeys(normalize_version(v) for v in kubernetes_versions):
        for component in COMPONENTS:
            aliases[f"registry.k8s.io/{component}:{version}"] = recipes[f"{component}/{version}"].ref
    return aliases
