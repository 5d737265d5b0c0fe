"""Kinds of backup target, by how their restic repository is written: one registry entry each.

A target (`gitops.model.config.BackupTarget`) names a restic repository; its kind decides the
options restic needs beyond the repository and password. The schema's `repository` pattern
accepts exactly the prefixes listed here (tests/test_backup.py checks they agree).
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


def _no_options(_target: BackupTarget) -> list[str]:
    return []


def _sftp_options(target: BackupTarget) -> list[str]:
    return ["-o", f"sftp.command={shlex.join(target.ssh_command)}"] if target.ssh_command else []


KINDS: dict[str, TargetKind] = {k.name: k for k in (
    TargetKind("local", "/", _no_options, "a directory on the controller's machine"),
    TargetKind("sftp", "sftp:", _sftp_options, "a directory over ssh (sshCommand: how restic runs ssh)"),
    TargetKind("rest", "rest:", _no_options, "a restic REST server (rest-server, `rclone serve restic`)"),
)}


def kind_of(target: BackupTarget) -> TargetKind:
    for kind in KINDS.values():
        if target.repository.startswith(kind.prefix):
            return kind
    raise GitopsError(f"backup target {target.name}: repository {target.repository!r} is none of "
                      f"{', '.join(k.prefix + '...' for k in KINDS.values())}")
