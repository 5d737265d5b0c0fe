"""Recorded state against what runs (pure): never plan new authorities or placements over a live cluster.

The recorded state holds each cluster's certificate authorities and each node's placement,
decided once. A state dir that is empty, another team's, or an old copy does not know the
clusters that run: planning against it would issue new CAs and restart every component with
certificates nobody trusts. So before planning, every managed control-plane pod found on a
hypervisor must belong to a cluster and node the state records, and the cluster CA its
files agent reports (`ca.crt`) must share a certificate with the recorded ones (a CA
rotation under way trusts two). Otherwise the plan is refused, naming the clusters and the
way back. Replacing a cluster's CAs on purpose is the CA rotation, never a lost state.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes

from gitops.errors import GitopsError
from gitops.model.components import CONTROLPLANE, INGRESS
from gitops.observe.types import ObservedState
from gitops.pki import PKIError, load_certs_pem
from gitops.state.records import State


@dataclass(frozen=True)
class Mismatch:
    """One live cluster the recorded state does not match."""

    cluster: str
    why: str
    nodes: tuple[str, ...]

    def line(self) -> str:
        return f"cluster {self.cluster}: {self.why} (live nodes: {', '.join(self.nodes)})"


class StateMismatch(GitopsError):
    """The recorded state does not know clusters that run: refuse before planning."""

    def __init__(self, mismatches: list[Mismatch], where: str = ""):
        self.mismatches = mismatches
        names = ", ".join(m.cluster for m in mismatches)
        super().__init__(
            f"the recorded state{f' ({where})' if where else ''} does not match what runs on the hypervisors; "
            f"refusing to plan new certificate authorities or placements for live cluster(s) {names}:\n"
            + "".join(f"  {m.line()}\n" for m in mismatches)
            + "The way back: use the state these clusters were applied with — `gitops state pull REPO "
              "--status-repo URL --state-dir DIR` (the controller's, sealed on the status branch), or the "
              "state dir of the machine that applied them (`--state-dir`, $GITOPS_STATE_DIR). To replace a "
              "cluster's CAs on purpose, rotate them (spec.certificates.caGeneration) once its state is back.")


def mismatches(state: State, observed: ObservedState) -> list[Mismatch]:
    """Live control-plane clusters that `state` does not record, or records with other authorities."""
    by_cluster: dict[str, list] = {}
    for pod in observed.pods():
        if pod.role in (CONTROLPLANE, INGRESS) and pod.cluster:
            by_cluster.setdefault(pod.cluster, []).append(pod)
    found = []
    for cluster, pods in sorted(by_cluster.items()):
        nodes = tuple(sorted({p.node for p in pods}))
        record = state.clusters.get(cluster)
        if record is None or "cluster" not in record.authorities:
            found.append(Mismatch(cluster, "no certificate authority recorded for it", nodes))
            continue
        unplaced = sorted({p.node for p in pods if p.node not in state.nodes})
        if unplaced:
            found.append(Mismatch(cluster, f"node(s) {', '.join(unplaced)} run but their placement is not recorded",
                                  nodes))
            continue
        bundle = record.trust_bundle("cluster").strip()  # what compile writes as ca.crt: the usual answer
        differ = [p for p in pods if p.files is not None and "ca" in p.files.certificates
                  and p.files.certificates["ca"].strip() != bundle]
        trusted = _certificates([bundle]) if differ else set()
        foreign = sorted(p.node for p in differ if not _certificates([p.files.certificates["ca"]]) & trusted)
        if foreign:
            found.append(Mismatch(cluster, f"the cluster CA on node(s) {', '.join(foreign)} (ca.crt) is not the "
                                  "recorded one", nodes))
    return found


def check(state: State, observed: ObservedState, where: str = "") -> None:
    """Raise StateMismatch when `state` does not match the live clusters."""
    found = mismatches(state, observed)
    if found:
        raise StateMismatch(found, where)


def _certificates(pems: Iterable[str]) -> set[bytes]:
    """The SHA-256 fingerprints of the certificates in PEM bundles (none for one that does not parse)."""
    out: set[bytes] = set()
    for pem in pems:
        try:
            out.update(c.fingerprint(hashes.SHA256()) for c in load_certs_pem(pem))
        except PKIError:
            pass
    return out
