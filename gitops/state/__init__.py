"""Recorded state: what the controller decided once and must remember.

Certificate authorities, node placements and port allocations are generated
once and kept here, so that a new commit never moves a healthy node or
rotates a CA by accident. `LocalDirStore` keeps it in a directory; the
status-branch store (git-backed, encrypted) implements the same interface.
"""
from gitops.state.records import CertRecord, ClusterRecord, NodeRecord, State
from gitops.state.store import LocalDirStore, StateStore

__all__ = ["CertRecord", "ClusterRecord", "NodeRecord", "State", "LocalDirStore", "StateStore"]
