"""The files agent's protocol: the scripts run through CRI ExecSync in a node's `files` container.

Every node's pod has a `files` container whose host directory is mounted read-write at /node
(and read-only at /etc/gitops in the components; names in `gitops.pods`). CRI has no file API,
so everything goes through ExecSync into that agent:
* private keys are generated **on the hypervisor** (openssl, umask 077) and never
  leave it: the agent prints only a certificate signing request or a public key;
* the controller signs requests with the authority it holds and writes the
  certificates back; public files (CA certificates, kubeconfigs that point at
  certificate files, haproxy.cfg) are written the same way;
* observation lists digests of public files, names of keys, certificate PEMs and
  the public half of the service-account key.
So no private key ever appears in a container's arguments, environment, labels or
annotations, or in a CRI request; node keys never even reach the controller's memory.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import re
from typing import TYPE_CHECKING, BinaryIO

from gitops.cri.errors import CRIError
from gitops.errors import GitopsError
from gitops.pods import NodeFiles

if TYPE_CHECKING:
    from gitops.cri.client import CRIClient

log = logging.getLogger(__name__)

#: lists the node's files: digests of public ones, names of keys, certificate PEMs,
#: and the public half of the service-account key. Private keys are never printed.
OBSERVE_FILES_SCRIPT = r"""
cd /node/files 2>/dev/null || exit 0
for f in *; do
  [ -f "$f" ] || continue
  case "$f" in
    *.key) echo "key $f" ;;
    *) echo "file $f $(sha256sum "$f" | cut -c1-12)" ;;
  esac
done
for f in *.crt; do
  [ -f "$f" ] && { echo "begin cert $f"; cat "$f"; echo "end"; }
done
[ -f sa.key ] && { echo "begin pub sa"; openssl pkey -in sa.key -pubout; echo "end"; }
exit 0
"""


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
#: writes every file of a batch under a temporary name, syncs, then renames them all: a failure while
#: writing leaves the node's old set whole (the temporary files go); args: NAME CONTENT NAME CONTENT ...
WRITE_FILES = r"""
set -e
umask 022
mkdir -p /node/files
cd /node/files
trap 'rm -f .*.batch' EXIT
names=""
while [ "$#" -gt 1 ]; do
  printf '%s' "$2" > ".$1.batch"
  names="$names $1"
  shift 2
done
sync 2>/dev/null || true
for name in $names; do mv ".$name.batch" "$name"; done
"""
WIPE = r"""
rm -rf /node/files /node/etcd /node/restore /node/etcd.before-restore /node/etcd.restore-token
"""
#: a restore's snapshot arrives in pieces (CRI has no file transfer; an argument holds at most 128 KiB):
#: RESTORE_BEGIN starts /node/restore/snapshot.db afresh, each RESTORE_APPEND (args: BASE64 BASE64 ...)
#: adds pieces to it
RESTORE_BEGIN = r"""
set -e
rm -rf /node/restore
mkdir -p /node/restore
: > /node/restore/snapshot.db
"""
RESTORE_APPEND = r"""
set -e
for piece in "$@"; do printf '%s' "$piece" | openssl base64 -d -A >> /node/restore/snapshot.db; done
"""
RESTORE_DIGEST = r"""
sha256sum /node/restore/snapshot.db | cut -c1-64
"""
#: the restored data directory takes the place of the member's (the old one kept beside it), once per
#: cluster token: a run repeated after a crash leaves a member already swapped as it is. args: TOKEN
RESTORE_SWAP = r"""
set -e
if [ "$(cat /node/etcd.restore-token 2>/dev/null)" = "$1" ]; then rm -rf /node/restore; exit 0; fi
[ -d /node/restore/etcd/member ] || { echo "no restored data directory" >&2; exit 1; }
rm -rf /node/etcd.before-restore
if [ -d /node/etcd ]; then mv /node/etcd /node/etcd.before-restore; fi
mv /node/restore/etcd /node/etcd
printf '%s' "$1" > /node/etcd.restore-token
rm -rf /node/restore
sync 2>/dev/null || true
"""
#: the last lines of the one-shot restore container's log. args: LOG NAME
RESTORE_LOG = r"""
tail -n 20 "/node/logs/$1" 2>/dev/null || true
"""
#: bytes of the snapshot per piece (base64: a third more) and pieces per call
PIECE = 64 * 1024
PIECES_PER_CALL = 8


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


def write_files(client: CRIClient, agent_id: str, files: dict[str, str]) -> None:
    """Replace public files (never a private key) as one batch: all written, then all renamed into place."""
    for name in files:
        if name.endswith(".key"):
            raise AgentError(f"refusing to send private key {name} over CRI")
    args = [part for name, content in sorted(files.items()) for part in (_check(name), content)]
    _run(client, agent_id, f"write {', '.join(sorted(files))}", WRITE_FILES, *args)


def wipe(client: CRIClient, agent_id: str) -> None:
    """Delete the node's files and etcd data (the node left this hypervisor)."""
    _run(client, agent_id, "wipe", WIPE)


def send_snapshot(client: CRIClient, agent_id: str, data: BinaryIO) -> None:
    """Copy the snapshot in `data` (from its start) to the node's restore directory, then check its digest."""
    data.seek(0)
    digest = hashlib.sha256()
    _run(client, agent_id, "restore: start the snapshot copy", RESTORE_BEGIN)
    while True:
        pieces = [piece for piece in (data.read(PIECE) for _ in range(PIECES_PER_CALL)) if piece]
        if not pieces:
            break
        for piece in pieces:
            digest.update(piece)
        _run(client, agent_id, "restore: copy the snapshot", RESTORE_APPEND,
             *(base64.b64encode(piece).decode() for piece in pieces))
    copied = _run(client, agent_id, "restore: digest the snapshot copy", RESTORE_DIGEST).strip()
    if copied != digest.hexdigest():
        raise AgentError(f"hypervisor {client.name}: the snapshot copy's digest {copied[:12]} is not the "
                         f"snapshot's {digest.hexdigest()[:12]}")


def swap_restored(client: CRIClient, agent_id: str, token: str) -> None:
    """Put the restored data directory in place of the member's (see RESTORE_SWAP)."""
    _run(client, agent_id, "restore: put the restored data directory in place", RESTORE_SWAP, token)


def restore_log(client: CRIClient, agent_id: str, log_name: str) -> str:
    """The last lines of a container's log in the node's log directory ("" when unreadable)."""
    try:
        return _run(client, agent_id, "read a log", RESTORE_LOG, _check(log_name)).strip()
    except (AgentError, CRIError):
        return ""


def parse_files_listing(text: str) -> NodeFiles:
    digests: dict[str, str] = {}
    keys: list[str] = []
    blocks: dict[tuple[str, str], list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if current is not None:
            if line == "end":
                current = None
            else:
                current.append(line)
            continue
        parts = line.split()
        if len(parts) == 3 and parts[0] == "file":
            digests[parts[1]] = parts[2]
        elif len(parts) == 2 and parts[0] == "key":
            keys.append(parts[1].removesuffix(".key"))
        elif len(parts) == 3 and parts[0] == "begin":
            current = blocks.setdefault((parts[1], parts[2]), [])
    certs = {name.removesuffix(".crt"): "\n".join(lines) + "\n" for (kind, name), lines in blocks.items()
             if kind == "cert"}
    pubs = {name: "\n".join(lines) + "\n" for (kind, name), lines in blocks.items() if kind == "pub"}
    return NodeFiles(dict(sorted(digests.items())), dict(sorted(certs.items())), tuple(sorted(keys)), pubs)


def read_node_files(client: CRIClient, agent_id: str) -> NodeFiles | None:
    try:
        code, out, err = client.exec_sync(agent_id, ["sh", "-c", OBSERVE_FILES_SCRIPT], timeout=20)
    except CRIError as error:
        log.warning("cannot read node files: %s", error)
        return None
    if code != 0:
        log.warning("files agent %s exited %d: %s", agent_id[:12], code, err.decode(errors="replace").strip())
        return None
    return parse_files_listing(out.decode(errors="replace"))
