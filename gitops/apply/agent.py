"""Talking to a pod's `files` agent over CRI ExecSync.

How certificates reach the components (CRI has no file API):
* every node has a host directory, mounted read-write at /node in the agent
  and read-only at /etc/gitops in the components;
* private keys are generated **on the hypervisor** by the agent (openssl,
  umask 077) and never leave it: the agent prints only a certificate signing
  request or a public key;
* the controller signs the request with the cluster authority it holds and
  writes the certificate back; public files (CA certificates, kubeconfigs that
  point at certificate files, haproxy.cfg) are written the same way.
So no private key ever appears in a container's arguments, environment,
labels or annotations, or in a CRI request; node keys never even reach the
controller's memory.
"""
from __future__ import annotations

import re

from gitops.cri.client import CRIClient
from gitops.errors import GitopsError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_KEY = r"""
set -e
umask 077
mkdir -p /node/files
cd /node/files
if [ ! -s "$1.key" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ".$1.key.tmp" 2>/dev/null
  mv ".$1.key.tmp" "$1.key"
fi
"""
GENERATE_CSR = _KEY + r"""openssl req -new -key "$1.key" -subj "/CN=$1" 2>/dev/null
"""
GENERATE_PUBLIC = _KEY + r"""openssl pkey -in "$1.key" -pubout 2>/dev/null
"""
WRITE_FILE = r"""
set -e
umask 022
mkdir -p /node/files
cd /node/files
printf '%s' "$2" > ".$1.tmp"
mv ".$1.tmp" "$1"
"""
WIPE = r"""
rm -rf /node/files /node/etcd
"""


class AgentError(GitopsError):
    pass


def _check(name: str) -> str:
    if not _NAME.match(name):
        raise AgentError(f"refusing unsafe file name {name!r}")
    return name


def _run(client: CRIClient, agent_id: str, what: str, script: str, *args: str, timeout: int = 30) -> str:
    code, out, err = client.exec_sync(agent_id, ["sh", "-c", script, "sh", *args], timeout=timeout)
    if code != 0:
        detail = err.decode(errors="replace").strip() or f"exit code {code}"
        raise AgentError(f"hypervisor {client.name}: files agent: {what} failed: {detail}")
    return out.decode()


def certificate_request(client: CRIClient, agent_id: str, name: str) -> str:
    """PEM CSR for `<name>.key`, generating the key on the hypervisor if absent."""
    return _run(client, agent_id, f"key {name}", GENERATE_CSR, _check(name))


def public_key(client: CRIClient, agent_id: str, name: str) -> str:
    """PEM public key of `<name>.key`, generating the key on the hypervisor if absent."""
    return _run(client, agent_id, f"key {name}", GENERATE_PUBLIC, _check(name))


def write_file(client: CRIClient, agent_id: str, name: str, content: str) -> None:
    """Atomically replace a public file (never a private key)."""
    if name.endswith(".key"):
        raise AgentError(f"refusing to send private key {name} over CRI")
    _run(client, agent_id, f"write {name}", WRITE_FILE, _check(name), content)


def wipe(client: CRIClient, agent_id: str) -> None:
    """Delete the node's files and etcd data (the node left this hypervisor)."""
    _run(client, agent_id, "wipe", WIPE)
