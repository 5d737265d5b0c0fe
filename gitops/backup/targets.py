"""Kinds of backup target, by how their restic repository is written: one registry entry each.

A target (`gitops.model.config.BackupTarget`) names a restic repository; its kind decides the
options restic needs beyond the repository and password, and which of the controller's environment
variables restic gets besides the few every run has (`gitops.backup.restic.environment`): a kind
reached through a cloud would list its credentials here (`AWS_*`, `RCLONE_*`). The schema's
`repository` pattern accepts exactly the prefixes listed here (tests/test_backup.py checks they agree).
"""
from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from gitops.errors import GitopsError
from gitops.model.config import BackupTarget


@dataclass(frozen=True)
class TargetKind:
    name: str
    #: what the repository starts with
    prefix: str
    #: extra restic options for a target of this kind
    options: Callable[[BackupTarget], list[str]]
    about: str
    #: the controller's environment variables restic also gets for this kind (`NAME`, or `PREFIX*`)
    env: tuple[str, ...] = ()


def _no_options(_target: BackupTarget) -> list[str]:
    return []


def _sftp_options(target: BackupTarget) -> list[str]:
    return ["-o", f"sftp.command={shlex.join(target.ssh_command)}"] if target.ssh_command else []


#: how restic reaches an HTTP(S) server: proxies, and CAs and a client certificate beyond the system's
_HTTP_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE",
             "SSL_CERT_DIR", "RESTIC_CACERT", "RESTIC_TLS_CLIENT_CERT")

KINDS: dict[str, TargetKind] = {k.name: k for k in (
    TargetKind("local", "/", _no_options, "a directory on the controller's machine"),
    # ssh's agent, for a key it holds; ssh itself (restic's child) gets restic's environment, no password
    TargetKind("sftp", "sftp:", _sftp_options, "a directory over ssh (sshCommand: how restic runs ssh)",
               ("SSH_AUTH_SOCK",)),
    # rest-server's HTTP credentials (restic 0.17 on; earlier ones take them in the URL only)
    TargetKind("rest", "rest:", _no_options, "a restic REST server (rest-server, `rclone serve restic`)",
               ("RESTIC_REST_USERNAME", "RESTIC_REST_PASSWORD", *_HTTP_ENV)),
)}


def kind_of(target: BackupTarget) -> TargetKind:
    for kind in KINDS.values():
        if target.repository.startswith(kind.prefix):
            return kind
    raise GitopsError(f"backup target {target.name}: repository {target.repository!r} is none of "
                      f"{', '.join(k.prefix + '...' for k in KINDS.values())}")
