"""The example repo wired to a running lab: the embedded default `gitops` runs on."""
from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import yaml

from gitops.lab.errors import LabError
from gitops.lab.lab import LabHypervisor, LabInfo, _Dumper, hypervisor_document


def example_source() -> Path:
    """The example repo shipped inside the package (a link to `example-repo/` in a checkout)."""
    return Path(str(resources.files("gitops").joinpath("example_repo")))


def write_example_repo(lab: LabInfo, target: Path, source: Path | None = None) -> list[str]:
    """Copy the example repo to `target`, its Hypervisors replaced by the lab's.

    Each example Hypervisor keeps its name (Nodes pin them) and takes the next
    lab hypervisor of the same kind (public/private); a remote example
    hypervisor uses the lab's mTLS front when the lab has one. Returns the
    `example name -> lab name` lines for the user.
    """
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
        path.write_text(header + yaml.dump(hypervisor_document(renamed), Dumper=_Dumper, sort_keys=False))
        mapping.append(f"{doc['metadata']['name']} -> {hv.name} ({'mTLS ' + hv.remote_uri if remote else hv.socket})")
    return mapping
