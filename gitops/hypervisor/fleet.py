"""The fleet's side of onboarding (`gitops hypervisor ca-hash`, `gitops hypervisor add`), where gitops runs.

The fleet's hypervisor CA lives in the recorded state (`State.hypervisor_ca`; its key sealed on the status
branch like the clusters' CA keys). `add` checks the new Hypervisor against the repo first (name, address,
port range), then fetches the machine's request (pinned by its key's fingerprint), signs the machine's
key for its address and makes gitops's client certificate. It writes `hypervisors/NAME.yaml` (the client
key age-encrypted to the repo's recipients: a file ready for a pull request) before it hands the machine its
certificate, and removes it again if the machine refuses or cannot be reached. Last it checks that the CRI
answers through the new front with that client certificate.

A run killed part way is resumed by running the same `add` again: the state holding a new CA is saved
before anything is signed; a file this command wrote for the same machine key is taken as unfinished work,
and if the machine already took its certificate (killed after the delivery) the re-run only checks the
front with a short-lived client certificate of the same CA and keeps the file.
"""
from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from gitops.cri.client import CRIClient
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError
from gitops.errors import GitopsError
from gitops.hostport import host_port
from gitops.hypervisor.enroll import EnrollError, deliver, fetch_request
from gitops.model.resources import DATA_DIR_ANNOTATION, DEFAULT_DATA_DIR, Hypervisor
from gitops.pki import CertKey, cert_to_pem, create_ca, issue_cert, key_hash, sign_public_key
from gitops.secrets import encrypt
from gitops.state.records import CertRecord, State

#: the front's and gitops's certificates; the fleet re-runs `add` (or, later, a rotation) before then
CERT_DAYS = 3650
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def fleet_ca(state: State) -> tuple[State, CertKey]:
    """The fleet's hypervisor CA from `state`, made (and added to a copy of the state) if there is none."""
    if state.hypervisor_ca is not None and state.hypervisor_ca.key_pem:
        return state, CertKey.from_pem(state.hypervisor_ca.cert_pem, state.hypervisor_ca.key_pem)
    if state.hypervisor_ca is not None:
        raise GitopsError("the recorded state holds the fleet's hypervisor CA without its key (a sealed state "
                          "read without the controller's identity?)")
    ca = create_ca("gitops-hypervisor-ca", organizations=["gitops"])
    new = state.copy()
    new.hypervisor_ca = CertRecord(ca.cert_pem, ca.key_pem)
    return new, ca


def ca_hash(ca: CertKey) -> str:
    return key_hash(ca.cert.public_key())


@dataclass(frozen=True)
class NewHypervisor:
    """What `gitops hypervisor add` was told."""

    name: str
    address: str
    cri_port: int
    fingerprint: str
    public: bool
    port_low: int
    port_high: int
    labels: tuple[tuple[str, str], ...] = ()


def _header(new: NewHypervisor) -> str:
    return f"# {new.name}: onboarded with `gitops hypervisor add` (machine key {new.fingerprint});\n"


def unfinished(new: NewHypervisor, repo: Path) -> bool:
    """hypervisors/NAME.yaml is one an earlier `add` for this very machine key wrote (it may have been killed)."""
    path = repo / "hypervisors" / f"{new.name}.yaml"
    try:
        return path.read_text().startswith(_header(new))
    except OSError:
        return False


def check_new(new: NewHypervisor, hypervisors: dict[str, Hypervisor], repo: Path) -> None:
    """Refuse a name, address or port range the repo's Hypervisors already use (GitopsError naming it); the
    file of an unfinished `add` for the same machine key does not count."""
    if not _NAME.match(new.name):
        raise GitopsError(f"--name {new.name!r}: a Hypervisor's name is a DNS label (lowercase letters, digits, -)")
    path = repo / "hypervisors" / f"{new.name}.yaml"
    if unfinished(new, repo):
        hypervisors = {name: hv for name, hv in hypervisors.items() if name != new.name}
    elif new.name in hypervisors or path.exists():
        raise GitopsError(f"a Hypervisor named {new.name} is already in the repo ({path if path.exists() else 'hypervisors/'})")
    try:
        ipaddress.ip_address(new.address)
    except ValueError:
        raise GitopsError(f"--address {new.address!r} is not an IP address") from None
    for hv in hypervisors.values():
        if hv.ip_address == new.address:
            raise GitopsError(f"address {new.address} is Hypervisor {hv.name}'s already: that machine is in the "
                              "fleet (one Hypervisor per machine)")
    if not 1 <= new.port_low <= new.port_high <= 65535:
        raise GitopsError(f"--port-range {new.port_low}-{new.port_high}: LOW-HIGH with 1 <= LOW <= HIGH <= 65535")
    if new.port_low <= new.cri_port <= new.port_high:
        raise GitopsError(f"--port-range {new.port_low}-{new.port_high} holds the CRI front's port {new.cri_port}")
    for hv in hypervisors.values():
        if new.port_low <= hv.port_range.high and hv.port_range.low <= new.port_high:
            raise GitopsError(f"--port-range {new.port_low}-{new.port_high} overlaps Hypervisor {hv.name}'s "
                              f"{hv.port_range.low}-{hv.port_range.high}")


def document(new: NewHypervisor, ca_pem: str, client_cert_pem: str, client_key: str, data_dir: str,
             interface: str = "") -> dict:
    """The repo's Hypervisor document for the new machine (its client key already encrypted)."""
    metadata: dict[str, object] = {"name": new.name}
    if new.labels:
        metadata["labels"] = dict(new.labels)
    if data_dir and data_dir != DEFAULT_DATA_DIR:
        metadata["annotations"] = {DATA_DIR_ANNOTATION: data_dir}
    return {"apiVersion": "gitops.infra/v1alpha1", "kind": "Hypervisor", "metadata": metadata,
            "spec": {"public": new.public, "ipAddress": new.address,
                     **({"interface": interface} if interface else {}),
                     "portRange": {"low": new.port_low, "high": new.port_high},
                     "remoteCRIEndpoint": {"criEndpointURI": f"tcp://{host_port(new.address, new.cri_port)}",
                                           "caCertificate": ca_pem,
                                           "clientCertificate": {"certificate": client_cert_pem,
                                                                 "privateKey": client_key}}}}


class LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (PEM, age armour) as literal blocks: Hypervisor documents as people read them."""


LiteralDumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                                   style="|" if "\n" in v else None))


def _front_answers(new: NewHypervisor, ca: CertKey, client: CertKey, timeout: float) -> str:
    """'' once the machine's CRI answers `Version` over mutual TLS with `client`, else the last error."""
    endpoint = CRIEndpoint.tls(new.name, host_port(new.address, new.cri_port), ca.cert_pem, client.cert_pem,
                               client.key_pem)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with CRIClient(endpoint, timeout=3) as cri:
                cri.version()
            return ""
        except CRIError as err:
            if time.monotonic() > deadline:
                return str(err)
            time.sleep(0.5)


def add(new: NewHypervisor, hypervisors: dict[str, Hypervisor], repo: Path, recipients: tuple[str, ...],
        state: State, save: Callable[[State], None], *, plaintext_ok: bool = False,
        ready_timeout: float = 30) -> tuple[State, Path, bool]:
    """Onboard the machine (see the module): returns the state holding the fleet's CA, the file written, and
    whether an earlier run had already done it all but answer (the file kept as it was).
    `save` records a state holding a new CA before anything signed by it leaves this process."""
    check_new(new, hypervisors, repo)
    if not recipients and not plaintext_ok:
        raise GitopsError("gitops.yaml lists no spec.secrets.recipients: the client key gitops uses for the new "
                          "machine must be encrypted to the controller (add its age recipient there)")
    before = state
    state, ca = fleet_ca(state)
    if state is not before:
        save(state)
    path = repo / "hypervisors" / f"{new.name}.yaml"
    resuming = unfinished(new, repo)
    try:
        request, csr = fetch_request(new.address, new.cri_port, new.fingerprint)
    except EnrollError:
        if not resuming:
            raise
        # killed after the delivery last time? then the front runs with a certificate of this CA for this key
        probe = issue_cert(ca, "gitops", organizations=["gitops"], client=True, days=1)
        if _front_answers(new, ca, probe, timeout=5):
            raise
        return state, path, True
    if request.port_high and not request.port_low <= new.port_low <= new.port_high <= request.port_high:
        raise EnrollError(f"--port-range {new.port_low}-{new.port_high} is not inside the ports the machine reserved "
                          f"for gitops's pods ({request.port_low}-{request.port_high}, `init --port-range`)")
    server = sign_public_key(ca, csr.public_key(), f"cri-{new.name}", ip_addresses=[new.address], server=True,
                             days=CERT_DAYS)
    client = issue_cert(ca, "gitops", organizations=["gitops"], client=True, days=CERT_DAYS)
    key = encrypt(client.key_pem.encode(), recipients) if recipients else client.key_pem
    path.parent.mkdir(parents=True, exist_ok=True)
    header = _header(new) + (f"# its CRI front is reached over mutual TLS with the fleet's hypervisor CA "
                             f"({ca_hash(ca)}).\n")
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(header + yaml.dump(document(new, ca.cert_pem, client.cert_pem, key, request.data_dir,
                                                   request.interface),
                                          Dumper=LiteralDumper, sort_keys=False))
    partial.replace(path)  # before the delivery: a machine holding a certificate always has its file
    try:
        deliver(new.address, new.cri_port, new.fingerprint, ca.cert_pem, cert_to_pem(server))
    except BaseException:
        path.unlink(missing_ok=True)  # the machine took nothing: nothing is written
        raise
    error = _front_answers(new, ca, client, ready_timeout)
    if error:
        raise EnrollError(f"the machine took its certificate but its CRI front does not answer over mutual TLS "
                          f"({error}); see `gitops hypervisor init`'s output there. {path} is kept: it is the "
                          f"machine's document; run this `add` again to check the front once more")
    return state, path, False
