"""The jump host: a real sshd (Debian's openssh-server) in a host-network pod (pure).

How it runs (issue #5):

* the public files -- `authorized_keys` (the declared keys) and `sshd_config` --
  are written into a host directory by gitops' files agent and mounted
  read-only at /etc/gitops (`jumphost_files`);
* the host key is born on the hypervisor: the image's entrypoint generates
  /var/lib/jumphost/ssh_host_ed25519_key (a writable host directory) at first
  start and keeps it afterwards, so its fingerprint is stable across restarts;
  no private key ever appears in a container's arguments or environment;
* the entrypoint checks the authorized keys against the SHA-256 the container
  was created with (a stale files directory fails loudly), installs them as
  ~jump/.ssh/authorized_keys with the modes sshd's StrictModes demands, and
  execs `sshd -D -e` listening only on the hypervisor's IP and the allocated port.

Only `jump` may log in, with a declared key; password and keyboard-interactive
logins are off, root is refused, TCP forwarding (ssh -J / ProxyJump) is allowed.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import posixpath
import re
import struct

from gitops.cri.types import ContainerSpec, Mount
from gitops.hostport import host_port
from gitops.model.components import DEFAULT_JUMPHOST_IMAGE
from gitops.sip import SIPError

#: where the public files are mounted (read-only), and their names
FILES_DIR = "/etc/gitops"
AUTHORIZED_KEYS = "authorized_keys"
SSHD_CONFIG = "sshd_config"
#: where the host key lives (a writable host directory): generated there at first start
STATE_DIR = "/var/lib/jumphost"
HOST_KEY = f"{STATE_DIR}/ssh_host_ed25519_key"
#: the image's entrypoint (see `entrypoint_script`)
ENTRYPOINT = "/usr/local/bin/gitops-jumphost"
SSHD = "/usr/sbin/sshd"  # sshd re-executes itself: it must be started by absolute path
#: the login user (unprivileged) and sshd's privilege-separation user and directory
LOGIN_USER = "jump"
LOGIN_UID = 1000
LOGIN_HOME = f"/home/{LOGIN_USER}"
LOGIN_SHELL = "/bin/sh"
PRIVSEP_USER = "sshd"
PRIVSEP_UID = 100
PRIVSEP_DIR = "/run/sshd"  # Debian's build: must exist, owned by root, not group/world-writable

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_KEY_TYPE = re.compile(r"^(ssh|ecdsa|sk)-[A-Za-z0-9@.+-]+$")

#: written to every jump host: its bytes (first line included, which names the module's first home)
#: stay as they are, so that moving code does not rewrite a running jump host's files
SSHD_CONFIG_TEXT = f"""\
# gitops jump host (gitops.sip.jumphost). The listen address comes from sshd's command line.
HostKey {HOST_KEY}
PidFile none
LogLevel INFO
UseDNS no

# who: only {LOGIN_USER}, only with a declared key (installed from {FILES_DIR}/{AUTHORIZED_KEYS} at start)
AllowUsers {LOGIN_USER}
PermitRootLogin no
AuthorizedKeysFile .ssh/{AUTHORIZED_KEYS}
StrictModes yes
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
PermitEmptyPasswords no
KbdInteractiveAuthentication no
HostbasedAuthentication no
GSSAPIAuthentication no
UsePAM no
LoginGraceTime 30
MaxAuthTries 3

# what: a jump host forwards TCP (ssh -J); no terminals (no utmp/lastlog in the image), agents, X11, tunnels
AllowTcpForwarding yes
GatewayPorts no
AllowAgentForwarding no
AllowStreamLocalForwarding no
X11Forwarding no
PermitTunnel no
PermitTTY no
PermitUserEnvironment no
PermitUserRC no
PrintMotd no
PrintLastLog no
ClientAliveInterval 30
ClientAliveCountMax 4
"""


class JumphostError(SIPError):
    """An invalid jump host declaration (key, address, port, path)."""


def _check_key(key: str) -> str:
    """One authorized_keys line (`[options] type base64 [comment]`), validated; surrounding blanks removed."""
    line = key.strip()
    if not line:
        raise JumphostError("empty authorized key")
    if "\n" in line or "\r" in line or "\0" in line:
        raise JumphostError(f"an authorized key must be one line: {line[:40]!r}...")
    if "PRIVATE KEY" in line:
        raise JumphostError("an authorized key must be a public key, not a private key")
    tokens = line.split()
    for i, token in enumerate(tokens[:-1]):
        if not _KEY_TYPE.match(token):
            continue
        try:
            blob = base64.b64decode(tokens[i + 1], validate=True)
        except (binascii.Error, ValueError):
            break
        if len(blob) < 4:
            break
        (length,) = struct.unpack(">I", blob[:4])
        if blob[4:4 + length] != token.encode():
            raise JumphostError(f"authorized key says {token} but its data is not a {token} key: {line[:60]!r}")
        return line
    raise JumphostError(f"not an OpenSSH public key ([options] type base64 [comment]): {line[:60]!r}")


def authorized_keys_text(authorized_keys: tuple[str, ...]) -> str:
    """The authorized_keys file: each declared key on its own line (validated, duplicates dropped)."""
    if isinstance(authorized_keys, str):
        raise JumphostError("authorized_keys must be a tuple of keys, not one string")
    keys = list(dict.fromkeys(_check_key(k) for k in authorized_keys))
    if not keys:
        raise JumphostError("a jump host needs at least one authorized key")
    return "".join(k + "\n" for k in keys)


def jumphost_files(authorized_keys: tuple[str, ...]) -> dict[str, str]:
    """The PUBLIC files to write into the directory mounted at /etc/gitops: name -> content."""
    return {AUTHORIZED_KEYS: authorized_keys_text(authorized_keys), SSHD_CONFIG: SSHD_CONFIG_TEXT}


def listen_address(ip: str, port: int) -> str:
    """sshd's ListenAddress for ip:port ([ip]:port for IPv6)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise JumphostError(f"not an IP address: {ip!r}") from None
    if addr.is_unspecified:
        raise JumphostError(f"the jump host must listen on one address, not {ip}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise JumphostError(f"not a TCP port: {port!r}")
    return host_port(str(addr), port)


def jumphost_container(name: str, ip: str, port: int, authorized_keys: tuple[str, ...], files_dir_host: str,
                       image: str = DEFAULT_JUMPHOST_IMAGE, *, state_dir_host: str = "") -> ContainerSpec:
    """The jump host container: sshd in the foreground on `ip:port` only (host-network pod).

    `files_dir_host` (absolute, on the hypervisor) must hold `jumphost_files(authorized_keys)`;
    it is mounted read-only at /etc/gitops. `state_dir_host` (default: `host-keys` next to
    `files_dir_host`) is mounted writable at /var/lib/jumphost and keeps the host key the
    entrypoint generates there. The SHA-256 of the authorized keys is an argument, so the
    spec changes with the keys and the entrypoint refuses a files directory that lags behind.
    """
    if not _NAME.match(name):
        raise JumphostError(f"not a container name (lowercase letters, digits, '-', at most 63): {name!r}")
    if not image:
        raise JumphostError("the jump host image must not be empty")
    files_dir_host = files_dir_host.rstrip("/")
    state_dir_host = (state_dir_host or posixpath.join(posixpath.dirname(files_dir_host), "host-keys")).rstrip("/")
    for what, path in (("files_dir_host", files_dir_host), ("state_dir_host", state_dir_host)):
        if not posixpath.isabs(path) or posixpath.normpath(path) != path:
            raise JumphostError(f"{what} must be a normalized absolute path: {path!r}")
    if files_dir_host == state_dir_host:
        raise JumphostError("the files directory (read-only) and the host-key directory must differ")
    keys_sha256 = hashlib.sha256(authorized_keys_text(authorized_keys).encode()).hexdigest()
    return ContainerSpec(
        name=name,
        image=image,
        command=(ENTRYPOINT,),
        args=(f"--authorized-keys-sha256={keys_sha256}", "--",
              "-D", "-e", "-f", f"{FILES_DIR}/{SSHD_CONFIG}", "-o", f"ListenAddress={listen_address(ip, port)}"),
        mounts=(Mount(FILES_DIR, files_dir_host, readonly=True), Mount(STATE_DIR, state_dir_host)),
    )


def entrypoint_script() -> str:
    """The image's entrypoint (POSIX sh): host key, authorized keys, then `exec sshd ARGS`.

    Usage: gitops-jumphost [--authorized-keys-sha256=HEX] -- SSHD-ARGS...
    Needs sh, sha256sum, ssh-keygen, mkdir, cp, mv, rm, chmod, chown in the image.
    """
    return f"""#!/bin/sh
# gitops jump host entrypoint (gitops.compile.jumphost): the host key is born here, on the
# hypervisor; the declared keys are installed for {LOGIN_USER}; then sshd runs in the foreground.
set -eu
PROG=gitops-jumphost
die() {{ echo "$PROG: $*" >&2; exit 1; }}
want=
while [ $# -gt 0 ]; do
  case $1 in
    --authorized-keys-sha256=*) want=${{1#*=}}; shift ;;
    --) shift; break ;;
    *) die "unexpected argument: $1 (usage: $PROG [--authorized-keys-sha256=HEX] -- SSHD-ARGS...)" ;;
  esac
done
keys={FILES_DIR}/{AUTHORIZED_KEYS}
for f in "$keys" {FILES_DIR}/{SSHD_CONFIG}; do
  [ -f "$f" ] && [ -r "$f" ] || die "$f: missing (gitops writes it before starting the jump host)"
done
if [ -n "$want" ]; then
  got=$(sha256sum < "$keys") || die "cannot read $keys"
  got=${{got%% *}}
  [ "$got" = "$want" ] || die "$keys: sha256 $got, but this container was created for $want (stale files?)"
fi

umask 077
key={HOST_KEY}
mkdir -p {STATE_DIR}
if [ ! -s "$key" ]; then
  rm -f "$key.new" "$key.new.pub"
  ssh-keygen -q -t ed25519 -N '' -C "$PROG" -f "$key.new" || die "cannot generate a host key in {STATE_DIR}"
  mv -f "$key.new.pub" "$key.pub"
  mv -f "$key.new" "$key"
  echo "$PROG: generated the host key $key"
elif [ ! -s "$key.pub" ]; then
  ssh-keygen -y -f "$key" > "$key.pub.new" || die "$key: unreadable host key"
  mv -f "$key.pub.new" "$key.pub"
fi
chmod 600 "$key"
chmod 644 "$key.pub"
echo "$PROG: host key $(ssh-keygen -l -f "$key.pub")"

ssh_dir={LOGIN_HOME}/.ssh
mkdir -p "$ssh_dir"
cp "$keys" "$ssh_dir/{AUTHORIZED_KEYS}.new"
chmod 600 "$ssh_dir/{AUTHORIZED_KEYS}.new"
chown {LOGIN_USER}:{LOGIN_USER} "$ssh_dir" "$ssh_dir/{AUTHORIZED_KEYS}.new"
chmod 700 "$ssh_dir"
mv -f "$ssh_dir/{AUTHORIZED_KEYS}.new" "$ssh_dir/{AUTHORIZED_KEYS}"
exec {SSHD} "$@"
"""


def passwd_text() -> str:
    """/etc/passwd of a jump host image: root, sshd's privilege-separation user, the login user."""
    return (f"root:x:0:0:root:/root:/bin/sh\n"
            f"{PRIVSEP_USER}:x:{PRIVSEP_UID}:65534:sshd privilege separation:{PRIVSEP_DIR}:/usr/sbin/nologin\n"
            f"{LOGIN_USER}:x:{LOGIN_UID}:{LOGIN_UID}:gitops jump host:{LOGIN_HOME}:{LOGIN_SHELL}\n"
            f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")


def group_text() -> str:
    """/etc/group of a jump host image."""
    return f"root:x:0:\n{LOGIN_USER}:x:{LOGIN_UID}:\nnogroup:x:65534:\n"
