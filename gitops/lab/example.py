"""The example repo wired to a running lab: the embedded default `gitops` runs on."""
from __future__ import annotations

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
                       recipients: Sequence[str] = (), ingress_nodes: int = 1) -> list[str]:
    """Copy the example repo to `target`, its Hypervisors replaced by the lab's.

    Each example Hypervisor keeps its name (Nodes pin them) and takes the next
    lab hypervisor of the same kind (public/private); a remote example
    hypervisor uses the lab's mTLS front when the lab has one; the lab's hypervisors left over join as
    hv-private-N / hv-public-N after the example's. The lab's mTLS client keys are written in plaintext (the example's gitops.yaml allows it,
    for labs), or, given age `recipients`, encrypted to them, with gitops.yaml
    listing them and refusing plaintext. With `ingress_nodes` of 2 or more, each
    example cluster gets that many ingress nodes (a virtual IP of the lab's pool).
    Returns the `example name -> lab name` lines for the user.
    """
    if recipients:
        encrypt(b"", recipients)  # every recipient parses, before anything is written
    source = source or example_source()
    if target.exists() and any(target.iterdir()):
        raise LabError(f"{target} exists and is not empty")
    shutil.copytree(source, target, dirs_exist_ok=True)
    free = {True: [hv for hv in lab.hypervisors if hv.public], False: [hv for hv in lab.hypervisors if not hv.public]}
    mapping = []
    for path in sorted((target / "hypervisors").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        public = bool(doc["spec"].get("public", False))
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
    if ingress_nodes > 1:
        public = sum(1 for hv in lab.hypervisors if hv.public)
        if public < ingress_nodes:
            raise LabError(f"--ingress-nodes {ingress_nodes}: a cluster's ingress nodes sit on distinct public "
                           f"machines and the lab has {public} (gitops lab up --public N)")
        for nodes in sorted((target / "clusters").glob("*/nodes.yaml")):
            _more_ingress_nodes(nodes, ingress_nodes)
            mapping.append(f"{nodes.parent.name}: {ingress_nodes} ingress nodes (a virtual IP)")
    return mapping


def _more_ingress_nodes(path: Path, count: int) -> None:
    """Append ingress Nodes to the cluster's nodes.yaml up to `count` (NAME-2, NAME-3...), comments kept."""
    docs = [d for d in load_yaml_documents(path.read_text())]
    ingress = [d.data for d in docs if d.data.get("spec", {}).get("role") == "controlplane-ingress"]
    if not ingress:
        return
    first = ingress[0]
    extra = []
    for n in range(len(ingress) + 1, count + 1):
        extra.append(yaml.safe_dump({
            "apiVersion": first["apiVersion"], "kind": "Node", "metadata": {"name": f"{first['metadata']['name']}-{n}"},
            "spec": {"cluster": first["spec"]["cluster"], "role": "controlplane-ingress"}}, sort_keys=False))
    text = path.read_text().rstrip("\n") + "\n"
    for doc in extra:
        text += "---\n# added by gitops lab example-repo --ingress-nodes: on another public machine\n" + doc
    path.write_text(text)


def _virtual_ip_pool(path: Path, pool: str) -> None:
    """In the copied gitops.yaml: spec.ingress.virtualIPs is the lab's pool (a cluster with two ingress nodes
    takes its virtual IP there). Appended as text: `spec` is the example's last key."""
    text = path.read_text()
    [doc] = load_yaml_documents(text, spans=True)
    if "ingress" in doc.data.get("spec", {}):
        raise LabError(f"{path}: spec.ingress is already set")
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
