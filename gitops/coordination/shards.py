"""Clusters to shards, and shards to Lease names.

`shard_of(name, n)` is the first 8 bytes of SHA-256 of the UTF-8 cluster name, big-endian,
modulo `n`. It depends on nothing but the name and `n` (no Python `hash()`, no seed,
no version), so every replica and every gitops version agrees. Changing the shard count
moves clusters between shards; replicas with different counts use different Lease names
(`gitops-shard-<i>-of-<n>`), so they never fence each other by mistake.
"""
from __future__ import annotations

import hashlib
import math
import re

LEADER = "gitops-leader"
#: a replica's own heartbeat Lease: how replicas learn how many of them are alive
REPLICA_PREFIX = "gitops-replica-"


def shard_of(cluster: str, shards: int) -> int:
    digest = hashlib.sha256(cluster.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def shard_lease(index: int, shards: int) -> str:
    return f"gitops-shard-{index}-of-{shards}"


def shard_leases(shards: int) -> tuple[str, ...]:
    return tuple(shard_lease(i, shards) for i in range(shards))


def fair_share(leases: int, live_replicas: int) -> int:
    """At most this many Leases per replica: ceil(leases / live replicas)."""
    return math.ceil(leases / max(live_replicas, 1))


def replica_lease(identity: str) -> str:
    """A DNS-1123 name for `identity`'s heartbeat Lease (a digest keeps distinct identities apart)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", identity.lower()).strip("-")[:32].strip("-")
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return f"{REPLICA_PREFIX}{slug}-{digest}" if slug else f"{REPLICA_PREFIX}{digest}"
