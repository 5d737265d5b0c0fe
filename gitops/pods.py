"""A managed pod's vocabulary (pure): the labels and annotations on its objects, its files agent's
names and paths, and what that agent reports of the node's files.

Every sandbox and container gitops creates carries `managed-by=gitops`, its cluster, node,
role and component, and a spec hash (the container's inputs, annotated in full so a diff can
name the changed fields). Only objects with the managed-by label are ever touched. The files
agent's protocol (the scripts run through ExecSync) is `gitops.agent`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

LABEL = "gitops.infra"
MANAGED = f"{LABEL}/managed-by"
CLUSTER = f"{LABEL}/cluster"
NODE = f"{LABEL}/node"
ROLE = f"{LABEL}/role"
COMPONENT = f"{LABEL}/component"
SPEC_HASH = f"{LABEL}/spec-hash"
#: annotation holding the container's spec (JSON, no secrets) so a diff can name changed fields
SPEC_ANNOTATION = f"{LABEL}/spec"
#: annotation holding the digests of the certificates a component read when it started (JSON
#: {name: digest of name.crt}): a certificate written since (a crash before its readers restarted)
#: is found by the next plan. Public files need none: their digests are in the spec hash.
CERTIFICATES_ANNOTATION = f"{LABEL}/certificates"
MANAGER = "gitops"

#: the files agent: its component name, where it sees the node's directory, where components read it
AGENT = "files"
AGENT_ROOT = "/node"
FILES = "/etc/gitops"

#: a restore (spec.restore) in the node's directory, as the agent and the restore container see it:
#: the snapshot copied there, the data directory `etcdutl snapshot restore` writes (then moved to
#: `etcd`), the old data kept beside it; the one-shot container's name and label
RESTORE_DIR = f"{AGENT_ROOT}/restore"
RESTORE_SNAPSHOT = f"{RESTORE_DIR}/snapshot.db"
RESTORE_DATA = f"{RESTORE_DIR}/etcd"
BEFORE_RESTORE = "etcd.before-restore"
RESTORER = "etcd-restore"
RESTORE_LABEL = f"{LABEL}/restore"


@dataclass(frozen=True)
class NodeFiles:
    """What the files agent saw in the node's /etc/gitops directory."""

    digests: dict[str, str] = field(default_factory=dict)  # public file -> sha256[:12]
    certificates: dict[str, str] = field(default_factory=dict)  # "etcd-server" -> PEM
    keys: tuple[str, ...] = ()  # "etcd-server", "sa", ...
    public_keys: dict[str, str] = field(default_factory=dict)  # "sa" -> public PEM


def file_digest(content: str) -> str:
    """The digest the files agent reports for a file (`OBSERVE_FILES_SCRIPT`: sha256, 12 hex digits)."""
    return hashlib.sha256(content.encode()).hexdigest()[:12]


def reloaded_file(component: str) -> str:
    """The file of the node's directory that says which spec a component reloaded in place runs
    (`gitops.model.components.RELOAD`): written after each reload, read back as its digest."""
    return f"{component}.reloaded"


def reloaded_record(container_id: str, spec_hash: str) -> str:
    """`reloaded_file`'s content once container `container_id` reloaded to `spec_hash`."""
    return f"{container_id} {spec_hash}\n"


def reloaded_to(files: NodeFiles | None, component: str, container_id: str, spec_hash: str) -> bool:
    """Whether running container `container_id` was reloaded to `spec_hash` since it started (its label
    keeps the spec it started with)."""
    return (files is not None
            and files.digests.get(reloaded_file(component)) == file_digest(reloaded_record(container_id, spec_hash)))


def reload_marker(files: NodeFiles | None, component: str, container_id: str,
                  spec_hash: str) -> tuple[str, str] | None:
    """The file (name, content) a reload of running container `container_id` to `spec_hash` writes once
    done; None when `files` say it was reloaded to it already."""
    if reloaded_to(files, component, container_id, spec_hash):
        return None
    return reloaded_file(component), reloaded_record(container_id, spec_hash)
