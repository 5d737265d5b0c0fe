"""Validation = schema + semantics over a whole repo; the model only when all is well."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path
from dataclasses import dataclass, field

from gitops.errors import GitopsError
from gitops.model.build import build_model
from gitops.model.components import INGRESS
from gitops.model.config import CONFIG_FILE, RepoConfig, SecretsPolicy, pool_range, secret_settings
from gitops.model.diagnostics import Diagnostic, capped
from gitops.model.repo import LoadedRepo, load_repo, read_documents, schema_errors
from gitops.model.resources import Hypervisor, RepoModel
from gitops.model.secretfields import IDENTITY_HINT, Opened, open_secrets
from gitops.model.semantics import check_all
from gitops.model.waves import rollout_waves
from gitops.model.yamlload import MAX_FILE_BYTES
from gitops.printable import printable
from gitops.safeio import FileRefused, read_text
from gitops.secrets import load_identities, public_recipient


@dataclass
class Validation:
    repo: LoadedRepo
    diagnostics: list[Diagnostic] = field(default_factory=list)
    model: RepoModel | None = None
    #: not errors: plaintext keys allowed by spec.secrets.allowPlaintext, an identity not among the recipients
    warnings: list[Diagnostic] = field(default_factory=list)
    #: encrypted secret fields left encrypted (no identity given, `sealed_ok`): their armor was checked
    sealed: list[Diagnostic] = field(default_factory=list)
    #: secret fields decrypted into the in-memory documents and model
    decrypted: int = 0

    @property
    def ok(self) -> bool:
        return not self.diagnostics


def validate_repo(root: str | os.PathLike[str], identity: str | None = None, *,
                  sealed_ok: bool = False) -> Validation:
    """Load, schema-check and semantically check the repo at `root`.

    `identity` is the text of an age identity file: encrypted secret fields are decrypted
    with it, in memory only. Without one they stay encrypted and are an error, unless
    `sealed_ok` (validate, plan against a snapshot: their armor is still checked and they
    are listed in `sealed`; the model then holds the armored text, which connects nowhere).
    All problems are collected (sorted by file and line); `model` is set only
    when there are none, so a bad commit is refused as a whole.
    """
    with _no_cycle_collection():  # what loading builds holds no cycles: collecting them while it grows
        return _validate(root, identity, sealed_ok)  # rescans the whole heap again and again (10% at scale)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _validate(root: str | os.PathLike[str], identity: str | None, sealed_ok: bool) -> Validation:
    repo = load_repo(root)
    identities = load_identities(identity) if identity else None
    config_docs = [repo.config_document] if repo.config_document is not None else []
    opened = open_secrets(config_docs + repo.documents, repo.config, identities)
    if config_docs:  # the settings with secret fields again, as decrypted
        repo.config = dataclasses.replace(repo.config, **secret_settings(config_docs[0].spec))
    diagnostics = (list(repo.diagnostics) + opened.errors + check_all(repo.valid, repo.documents)
                   + backup_references(repo) + virtual_ips(repo) + rollout_waves(repo))
    if not sealed_ok:
        diagnostics += [_needs_identity(d) for d in opened.sealed]
    diagnostics = sorted(set(diagnostics))
    model = build_model(repo.documents, repo.config.ingress) if not diagnostics else None
    return Validation(repo=repo, diagnostics=diagnostics, model=model,
                      warnings=sorted(set(opened.warnings + _recipient_warnings(repo, identities, opened))),
                      sealed=opened.sealed if sealed_ok else [], decrypted=opened.decrypted)


#: the most addresses one spec.ingress.virtualIPs entry may hold (a pool is a handful of addresses per cluster)
MAX_POOL_ADDRESSES = 65536


def virtual_ips(repo: LoadedRepo) -> list[Diagnostic]:
    """gitops.yaml's spec.ingress.virtualIPs: each entry an address, CIDR or FIRST-LAST range, overlapping no
    other entry and holding no Hypervisor's address; a Cluster's pinned spec.apiServer.virtualIP is no
    Hypervisor's address nor another Cluster's; a Cluster with two or more ingress Nodes has a virtual IP to
    get (a pin, or a pool to take it from)."""
    out: list[Diagnostic] = []
    hypervisors = {}
    for doc in repo.valid:
        if doc.kind == "Hypervisor":
            try:
                hypervisors[ipaddress.ip_address(doc.spec["ipAddress"])] = doc.name
            except ValueError:
                pass  # (an error of its own)
    doc = repo.config_document
    entries = doc.spec.get("ingress", {}).get("virtualIPs", ()) if doc is not None else ()
    ranges: list[tuple[int, object, object]] = []
    for index, entry in enumerate(entries):
        where = ("spec", "ingress", "virtualIPs", index)
        try:
            first, last = pool_range(entry)
        except ValueError as err:
            out.append(doc.error(where, f"{entry!r} is not an address, a CIDR or a FIRST-LAST range ({err})"))
            continue
        if int(last) - int(first) >= MAX_POOL_ADDRESSES:
            out.append(doc.error(where, f"{entry!r} holds more than {MAX_POOL_ADDRESSES} addresses"))
        for other, o_first, o_last in ranges:
            if o_first.version == first.version and first <= o_last and o_first <= last:
                out.append(doc.error(where, f"{entry!r} overlaps virtualIPs[{other}] ({entries[other]!r})"))
        for address, name in sorted(hypervisors.items(), key=lambda kv: kv[1]):
            if address.version == first.version and first <= address <= last:
                out.append(doc.error(where, f"{entry!r} holds {address}, Hypervisor {name}'s address"))
        ranges.append((index, first, last))
    ingress: dict[str, int] = {}
    for node in repo.valid:
        if node.kind == "Node" and node.spec.get("role") == INGRESS:
            ingress[node.spec.get("cluster")] = ingress.get(node.spec.get("cluster"), 0) + 1
    pinned: dict[str, str] = {}
    for cluster in sorted((d for d in repo.valid if d.kind == "Cluster"), key=lambda d: d.name):
        pin = cluster.get(("spec", "apiServer", "virtualIP"))
        where = ("spec", "apiServer", "virtualIP")
        if pin is None:
            if ingress.get(cluster.name, 0) >= 2 and not entries:
                out.append(cluster.error(("metadata", "name"), f"Cluster {cluster.name!r} has "
                                         f"{ingress[cluster.name]} ingress Nodes, so it is reached through a virtual "
                                         "IP: pin one (spec.apiServer.virtualIP) or give gitops.yaml a pool "
                                         "(spec.ingress.virtualIPs)"))
            continue
        try:
            address = ipaddress.ip_address(pin)
        except ValueError:
            out.append(cluster.error(where, f"{pin!r} is not an IP address"))
            continue
        if address in hypervisors:
            out.append(cluster.error(where, f"{pin} is Hypervisor {hypervisors[address]}'s address"))
        elif str(address) in pinned:
            out.append(cluster.error(where, f"{pin} is Cluster {pinned[str(address)]}'s virtual IP already"))
        pinned.setdefault(str(address), cluster.name)
    return out


def backup_references(repo: LoadedRepo) -> list[Diagnostic]:
    """Each backup target named once; each Cluster's spec.backup.target one of them."""
    out = []
    seen: set[str] = set()
    doc = repo.config_document
    for index, target in enumerate(doc.spec.get("backup", {}).get("targets", ()) if doc else ()):
        if target["name"] in seen:
            out.append(doc.error(("spec", "backup", "targets", index, "name"),
                                 f"backup target {target['name']!r} is named twice"))
        seen.add(target["name"])
    for cluster in repo.valid:
        target = cluster.get(("spec", "backup", "target")) if cluster.kind == "Cluster" else None
        if target is not None and target not in seen:
            known = ", ".join(sorted(seen)) or "none: add spec.backup.targets to gitops.yaml"
            out.append(cluster.error(("spec", "backup", "target"), f"no backup target {target!r} "
                                                                   f"(gitops.yaml's targets: {known})"))
        if cluster.kind == "Cluster" and cluster.get(("spec", "restore")) is not None and target is None:
            out.append(cluster.error(("spec", "restore"), "restores from spec.backup.target: set spec.backup "
                                                          "to the target that holds the snapshot"))
    return out


def _needs_identity(sealed: Diagnostic) -> Diagnostic:
    return dataclasses.replace(sealed, message=f"age-encrypted, and no identity to decrypt it ({IDENTITY_HINT})")


def _recipient_warnings(repo: LoadedRepo, identities: list | None, opened: Opened) -> list[Diagnostic]:
    """The identity decrypts today, but `secrets encrypt`/`rekey` would not encrypt to it."""
    recipients = repo.config.secrets.recipients
    if not identities or not recipients or not opened.decrypted:
        return []
    if any(public_recipient(i) in recipients for i in identities):
        return []
    return [Diagnostic(CONFIG_FILE, _line_of(repo.root / CONFIG_FILE, "recipients:"), "GitopsConfig",
                       "spec.secrets.recipients",
                       f"the identity's recipient {public_recipient(identities[0])} is not listed: values "
                       "re-encrypted by `gitops secrets encrypt` or `rekey` will not be readable with it")]


class InvalidRepo(GitopsError):
    """The repo does not validate; carries every diagnostic."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        lines = "\n".join(capped(diagnostics))
        super().__init__(f"repo is invalid ({len(diagnostics)} error(s)):\n{lines}")


def _line_of(path: Path, needle: str) -> int:
    try:
        lines = read_text(path, MAX_FILE_BYTES).splitlines()
    except FileRefused:
        return 1
    return next((number for number, line in enumerate(lines, 1) if line.strip().startswith(needle)), 1)


def load_model(root: str | os.PathLike[str], identity: str | None = None) -> RepoModel:
    """The validated model of the repo at `root` (secret fields decrypted with `identity`), or `InvalidRepo`."""
    result = validate_repo(root, identity)
    if result.model is None:
        raise InvalidRepo(result.diagnostics)
    return result.model


def load_hypervisors(path: str | os.PathLike[str], identity: str | None = None) -> dict[str, Hypervisor]:
    """The validated Hypervisors of a repo directory, or of one YAML file of Hypervisor documents
    (such as `gitops lab hypervisors` prints; plaintext keys allowed there, as no repo settings
    apply). Raises `InvalidRepo` with every error."""
    target = Path(path)
    if target.is_dir():
        return load_model(target, identity).hypervisors
    if not os.path.lexists(target):
        raise GitopsError(f"{printable(str(path))}: no such file or directory")
    real = Path(os.path.realpath(target))
    diagnostics: list[Diagnostic] = []
    docs = [d for d in read_documents(real.parent, real.name, diagnostics)]
    for doc in docs:
        if doc.kind != "Hypervisor":
            diagnostics.append(doc.error(("kind",), "only Hypervisor documents are expected in this file"))
        else:
            diagnostics.extend(schema_errors(doc))
    opened = open_secrets(docs, RepoConfig(secrets=SecretsPolicy(allow_plaintext=True)),
                          load_identities(identity) if identity else None)
    diagnostics += opened.errors + [_needs_identity(d) for d in opened.sealed]
    if not diagnostics:
        diagnostics = check_all(docs, docs)
    if diagnostics:
        raise InvalidRepo(sorted(set(diagnostics)))
    return build_model(docs).hypervisors
