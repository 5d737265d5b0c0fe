"""The example repo wired to a running lab: the embedded default `gitops` runs on."""
from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import yaml

from gitops.lab.errors import LabError
from gitops.hypervisor.fleet import LiteralDumper
from gitops.lab.lab import LabHypervisor, LabInfo, hypervisor_document
from gitops.lab.network import LabNetwork
from gitops.model.config import CONFIG_FILE
from gitops.model.yamlload import load_yaml_documents
from gitops.secrets import encrypt


def example_source() -> Path:
    """The example repo shipped inside the package (a link to `example-repo/` in a checkout)."""
    return Path(str(resources.files("gitops").joinpath("example_repo")))


def write_example_repo(lab: LabInfo, target: Path, source: Path | None = None,
                       recipients: Sequence[str] = (), ingress_nodes: int | None = None) -> list[str]:
    """Copy the example repo to `target`, its Hypervisors replaced by the lab's.

    Each example Hypervisor keeps its name (Nodes pin them) and takes the next
    lab hypervisor of the same kind (public/private); a remote example
    hypervisor uses the lab's mTLS front when the lab has one; the lab's hypervisors left over join as
    hv-private-N / hv-public-N after the example's. The lab's mTLS client keys are written in plaintext
    (the example's gitops.yaml allows it, for labs), or, given age `recipients`, encrypted to them, with gitops.yaml
    listing them and refusing plaintext. Each example cluster gets `ingress_nodes` ingress nodes (default:
    as many as the example has, two; with two or more, a virtual IP of the lab's pool); an example public
    hypervisor the lab has no machine for is left out when no Node is pinned to it any more.
    Returns the `example name -> lab name` lines for the user.
    """
    if recipients:
        encrypt(b"", recipients)  # every recipient parses, before anything is written
    source = source or example_source()
    if target.exists() and any(target.iterdir()):
        raise LabError(f"{target} exists and is not empty")
    wanted = ingress_nodes if ingress_nodes is not None else max(
        (len(_ingress_chunks(path.read_text())) for path in source.glob("clusters/*/nodes.yaml")), default=1)
    public = sum(1 for hv in lab.hypervisors if hv.public)
    if wanted > max(public, 1):
        raise LabError(f"{wanted} ingress nodes per cluster sit on distinct public machines and the lab has {public} "
                       f"(gitops lab up --public {wanted}, or gitops lab example-repo --ingress-nodes {max(public, 1)})")
    shutil.copytree(source, target, dirs_exist_ok=True)
    mapping, ingress_lines = [], []
    node_files = sorted((target / "clusters").glob("*/nodes.yaml"))
    for path in node_files:
        if _set_ingress_nodes(path, wanted):
            ingress_lines.append(f"{path.parent.name}: {wanted} ingress node(s)"
                                 + (" (a virtual IP)" if wanted > 1 else ""))
    pinned = {doc.data.get("spec", {}).get("hypervisor") for path in node_files
              for doc in load_yaml_documents(path.read_text())}
    free = {True: [hv for hv in lab.hypervisors if hv.public], False: [hv for hv in lab.hypervisors if not hv.public]}
    for path in sorted((target / "hypervisors").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        public = bool(doc["spec"].get("public", False))
        if not free[public] and public and doc["metadata"]["name"] not in pinned:
            path.unlink()
            mapping.append(f"{doc['metadata']['name']}: left out (no lab machine for it, and no Node pinned to it)")
            continue
        if not free[public]:
            kind = "public" if public else "private"
            raise LabError(f"the example needs more {kind} hypervisors than the lab has "
                           f"(gitops lab up --hypervisors N --public M)")
        hv: LabHypervisor = free[public].pop(0)
        remote = "remoteCRIEndpoint" in doc["spec"] and bool(hv.remote_uri)
        renamed = LabHypervisor(**{**hv.__dict__, "name": doc["metadata"]["name"],
                                   "remote_uri": hv.remote_uri if remote else ""})
        header = f"# {doc['metadata']['name']} is lab hypervisor {hv.name} ({'mTLS' if remote else 'unix socket'})\n"
        document = hypervisor_document(renamed)
        if remote and recipients:
            client = document["spec"]["remoteCRIEndpoint"]["clientCertificate"]  # type: ignore[index]
            client["privateKey"] = encrypt(client["privateKey"].encode(), recipients)
        path.write_text(header + yaml.dump(document, Dumper=LiteralDumper, sort_keys=False))
        mapping.append(f"{doc['metadata']['name']} -> {hv.name} ({'mTLS ' + hv.remote_uri if remote else hv.socket})")
    # the lab's other machines join the fleet too, named on after the example's (hv-private-3, hv-public-2, ...):
    # over their mTLS front when the lab has one
    taken = {p.stem for p in (target / "hypervisors").glob("*.yaml")}
    for hv in free[True] + free[False]:
        kind = "public" if hv.public else "private"
        number = 1
        while f"hv-{kind}-{number}" in taken:
            number += 1
        name = f"hv-{kind}-{number}"
        taken.add(name)
        document = hypervisor_document(LabHypervisor(**{**hv.__dict__, "name": name}))
        if hv.remote_uri and recipients:
            client = document["spec"]["remoteCRIEndpoint"]["clientCertificate"]  # type: ignore[index]
            client["privateKey"] = encrypt(client["privateKey"].encode(), recipients)
        header = (f"# {name} is lab hypervisor {hv.name} ({'mTLS' if hv.remote_uri else 'unix socket'}), beyond the "
                  "example's own\n")
        (target / "hypervisors" / f"{name}.yaml").write_text(header + yaml.dump(document, Dumper=LiteralDumper,
                                                                                  sort_keys=False))
        mapping.append(f"{name} -> {hv.name} ({'mTLS ' + hv.remote_uri if hv.remote_uri else hv.socket})")
    if recipients:
        _encrypted_secrets_policy(target / CONFIG_FILE, recipients)
    if lab.subnet:
        _virtual_ip_pool(target / CONFIG_FILE, LabNetwork.for_subnet(lab.subnet).virtual_ips)
    return mapping + ingress_lines


def _chunks(text: str) -> list[str]:
    """The text of each YAML document of `text` (the part before the first `---` first), comments kept."""
    chunks, current = [], []
    for line in text.splitlines(keepends=True):
        if line.rstrip() == "---":
            chunks.append("".join(current))
            current = []
        else:
            current.append(line)
    return chunks + ["".join(current)]


def _ingress_chunks(text: str) -> list[int]:
    """The indexes (in `_chunks`) of the ingress Nodes."""
    return [i for i, chunk in enumerate(_chunks(text))
            if ((yaml.safe_load(chunk) or {}).get("spec") or {}).get("role") == "controlplane-ingress"]


def _set_ingress_nodes(path: Path, count: int) -> bool:
    """The cluster's nodes.yaml with `count` ingress Nodes: the last ones dropped, or more appended (NAME-2,
    NAME-3..., placed by gitops on distinct public machines); comments kept. Whether it changed."""
    text = path.read_text()
    chunks, ingress = _chunks(text), _ingress_chunks(text)
    if not ingress or len(ingress) == count:
        return False
    if len(ingress) > count:
        dropped = set(ingress[count:])
        path.write_text("---\n".join(c for i, c in enumerate(chunks) if i not in dropped).rstrip("\n") + "\n")
        return True
    first = yaml.safe_load(chunks[ingress[0]])
    base = first["metadata"]["name"].removesuffix("-1")
    names = {((yaml.safe_load(c) or {}).get("metadata") or {}).get("name") for c in chunks}
    text, n = text.rstrip("\n") + "\n", 1
    for _ in range(count - len(ingress)):
        n += 1
        while f"{base}-{n}" in names:
            n += 1
        doc = {"apiVersion": first["apiVersion"], "kind": "Node", "metadata": {"name": f"{base}-{n}"},
               "spec": {"cluster": first["spec"]["cluster"], "role": "controlplane-ingress"}}
        text += ("---\n# added by gitops lab example-repo --ingress-nodes: on another public machine\n"
                 + yaml.safe_dump(doc, sort_keys=False))
    path.write_text(text)
    return True


def _virtual_ip_pool(path: Path, pool: str) -> None:
    """In the copied gitops.yaml: spec.ingress.virtualIPs is the lab's pool (a cluster with two ingress nodes
    takes its virtual IP there). Appended as text: `spec` is the example's last key."""
    text = path.read_text()
    [doc] = load_yaml_documents(text, spans=True)
    if "ingress" in doc.data.get("spec", {}):  # the example's own pool: the lab's instead, comments kept
        line = doc.positions.get(("spec", "ingress", "virtualIPs"))
        if line is None:
            raise LabError(f"{path}: spec.ingress has no virtualIPs to replace")
        lines = text.splitlines(keepends=True)
        indent = lines[line - 1][:len(lines[line - 1]) - len(lines[line - 1].lstrip())]
        lines[line - 1] = f"{indent}virtualIPs: [{pool}]  # the lab's (on its bridge; never on a host interface)\n"
        path.write_text("".join(lines))
        return
    last = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")][-1]
    if not last.startswith(" "):
        raise LabError(f"{path}: expected spec to be the last key")
    path.write_text(text.rstrip("\n") + "\n  # set by gitops lab example-repo: the lab's virtual IPs (on its "
                    "bridge; never on a host interface)\n  ingress:\n"
                    f"    virtualIPs: [{pool}]\n")


def _encrypted_secrets_policy(path: Path, recipients: Sequence[str]) -> None:
    """In the copied gitops.yaml: `secrets.recipients` are `recipients`, `allowPlaintext: false`.

    Edited as text (the example's comments stay), at the lines the loader records.
    """
    text = path.read_text()
    [doc] = load_yaml_documents(text, spans=True)
    base = ("spec", "secrets")
    items = sorted(line for p, line in doc.positions.items() if p[:3] == base + ("recipients",) and len(p) == 4)
    allow = doc.spans.get(base + ("allowPlaintext",))
    if not items or allow is None or text[allow.start:allow.end] != "true":
        raise LabError(f"{path}: expected spec.secrets.recipients and allowPlaintext: true to rewrite")
    text = text[:allow.start] + "false" + text[allow.end:]
    lines = text.splitlines(keepends=True)
    first = lines[items[0] - 1]
    indent = first[:len(first) - len(first.lstrip())]
    new = [f"{indent}- {r}  # set by gitops lab example-repo --encrypt-to\n" for r in recipients]
    lines[items[0] - 1:items[-1]] = new
    path.write_text("".join(lines))


#: the client the example's tenant API servers trust (tenant-1's services.auth.clientID)
EXAMPLE_OIDC_CLIENT = "tenant-1-kubernetes"


def declare_oidc_user(repo: Path, username: str, password_hash: str, *, sip: str = "tenant-1",
                      cluster: str = "team-a", groups: Sequence[str] = ("tenant-1-viewers",)) -> None:
    """In an example repo: SIPCluster `sip`'s provider gets user `username` (email `<username>@example.com`) and
    the client its tenant API servers trust (password and refresh grants: kubectl's plugin in a terminal), served
    at its hypervisor's address (the example's oidcIssuerURL names no machine of the lab); Cluster `cluster`
    trusts that provider by name. The files are edited line by line: the rest of them stays as it was."""
    sip_path = repo / "sip" / f"{sip}.yaml"
    lines = sip_path.read_text().splitlines(keepends=True)
    auth = _block(lines, "    auth:", sip_path)
    client = next((line.split(":", 1)[1].strip() for line in lines[auth] if line.startswith("      clientID:")),
                  EXAMPLE_OIDC_CLIENT)
    if any(line.startswith(("      users:", "      clients:")) for line in lines[auth]):
        raise LabError(f"{sip_path}: services.auth declares users or clients already")
    added = [f"      clientID: {client}\n"] if not any(line.startswith("      clientID:") for line in lines[auth]) else []
    added += ["      users:\n", f"        - username: {username}\n", f"          email: {username}@example.com\n",
              f"          passwordHash: {json.dumps(password_hash)}\n", "          groups:\n",
              *(f"            - {json.dumps(g)}\n" for g in groups),
              "      clients:\n", f"        - id: {client}\n", f"          name: {json.dumps(sip + ' Kubernetes')}\n",
              "          grantTypes: [password, refresh_token]\n"]
    kept = [line for line in lines[auth] if not line.startswith("      oidcIssuerURL:")]
    lines[auth] = kept + added
    _write_checked(sip_path, "".join(lines))
    cluster_path = repo / "clusters" / cluster / "cluster.yaml"
    lines = cluster_path.read_text().splitlines(keepends=True)
    oidc = ["    oidc:\n", f"      sipCluster: {sip}\n", '      usernamePrefix: "oidc:"\n',
            '      groupsPrefix: "oidc:"\n']
    if any(line == "  apiServer:\n" for line in lines):
        where = lines.index("  apiServer:\n") + 1
    else:
        where = lines.index("spec:\n") + 1
        oidc = ["  apiServer:\n", *oidc]
    lines[where:where] = oidc
    _write_checked(cluster_path, "".join(lines))


def _block(lines: list[str], header: str, path: Path) -> slice:
    """The lines of the YAML mapping `header` opens (its deeper-indented lines after it), as a slice."""
    try:
        first = next(i for i, line in enumerate(lines) if line.rstrip("\n") == header) + 1
    except StopIteration:
        raise LabError(f"{path}: no {header.strip()!r} block") from None
    depth = len(header) - len(header.lstrip())
    end = first
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > depth):
        end += 1
    return slice(first, end)


def _write_checked(path: Path, text: str) -> None:
    """Write `text` to `path` once it parses as YAML."""
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise LabError(f"{path}: the edit would not be YAML: {err}") from None
    path.write_text(text)
