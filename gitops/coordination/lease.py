"""One Lease: client-go's leader-election record and its optimistic-concurrency updates.

Semantics follow client-go's `leaderelection` (LeaseLock): a Lease is free when it has
no holder, or when its record has not changed for `leaseDurationSeconds` as timed by
the *observer's* monotonic clock since it first saw that record (never by comparing
the holder's `renewTime` with the local clock, so clock skew between machines does
not matter). Every write carries the `resourceVersion` read: a 409 Conflict (or
AlreadyExists on create) means another replica wrote first, a lost race, not an error.
Acquiring a Lease from another holder bumps `leaseTransitions` and sets `acquireTime`;
renewing sets `renewTime`; releasing clears the holder and sets the duration to 1 s.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gitops.errors import GitopsError
from gitops.kubeapi import KubeAPI, KubeAPIError

GROUP_PATH = "/apis/coordination.k8s.io/v1"
#: label on every Lease gitops writes; its value is the role (`work`: leader or shard, `replica`: heartbeat)
ROLE_LABEL = "gitops.infra/lease-role"
#: client-go's JitterFactor: retryPeriod * this must stay below renewDeadline
JITTER = 1.2


class CoordinationError(GitopsError):
    """The coordination settings or the API answer are unusable."""


@dataclass(frozen=True)
class Timing:
    """client-go's three durations, in seconds: leaseDuration > renewDeadline > retryPeriod * 1.2."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise CoordinationError(f"leaseDurationSeconds ({self.lease_duration:g}) must be greater than "
                                    f"renewDeadlineSeconds ({self.renew_deadline:g})")
        if not self.renew_deadline > JITTER * self.retry_period:
            raise CoordinationError(f"renewDeadlineSeconds ({self.renew_deadline:g}) must be greater than "
                                    f"{JITTER} x retryPeriodSeconds ({self.retry_period:g})")
        if self.retry_period <= 0:
            raise CoordinationError("retryPeriodSeconds must be positive")


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease object as read: its spec and the `resourceVersion` a write must carry."""

    name: str
    holder: str = ""
    duration: int = 0  # leaseDurationSeconds
    acquire_time: str = ""  # RFC 3339 MicroTime, as the API stores it
    renew_time: str = ""
    transitions: int = 0
    resource_version: str = ""
    role: str = ""

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> "LeaseRecord":
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return cls(name=meta.get("name", ""), holder=spec.get("holderIdentity") or "",
                   duration=int(spec.get("leaseDurationSeconds") or 0), acquire_time=spec.get("acquireTime") or "",
                   renew_time=spec.get("renewTime") or "", transitions=int(spec.get("leaseTransitions") or 0),
                   resource_version=meta.get("resourceVersion", ""),
                   role=(meta.get("labels") or {}).get(ROLE_LABEL, ""))

    def body(self, namespace: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": namespace, "labels": {ROLE_LABEL: self.role}}
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration,
                                "leaseTransitions": self.transitions}
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    @property
    def identity(self) -> tuple:
        """What "the record changed" compares (client-go compares the whole record)."""
        return (self.holder, self.duration, self.acquire_time, self.renew_time, self.transitions)


def micro_time(now: dt.datetime | None = None) -> str:
    """A MicroTime: RFC 3339 with microseconds, UTC."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseAPI:
    """The Leases of one namespace."""

    def __init__(self, api: KubeAPI, namespace: str):
        self.api = api
        self.namespace = namespace
        self.collection = f"{GROUP_PATH}/namespaces/{quote(namespace)}/leases"

    def get(self, name: str) -> LeaseRecord | None:
        obj = self.api.get(f"{self.collection}/{quote(name)}")
        return LeaseRecord.from_object(obj) if obj is not None else None

    def list(self) -> dict[str, LeaseRecord]:
        """Every gitops Lease of the namespace (one request), by name."""
        records = (LeaseRecord.from_object(o) for o in self.api.list(self.collection, ROLE_LABEL))
        return {r.name: r for r in records}

    def write(self, record: LeaseRecord) -> LeaseRecord | None:
        """Create (no resourceVersion) or update (with it); None when another writer got there first."""
        try:
            if record.resource_version:
                obj = self.api.request("PUT", f"{self.collection}/{quote(record.name)}", record.body(self.namespace))
            else:
                obj = self.api.create(self.collection, record.body(self.namespace))
        except KubeAPIError as err:
            if err.status == 409:  # Conflict on update, AlreadyExists on create: a lost race
                return None
            raise
        return LeaseRecord.from_object(obj)


@dataclass
class Observation:
    """When this process first saw a Lease's current record (monotonic seconds)."""

    record: LeaseRecord
    since: float


class Observer:
    """client-go's observedRecord/observedTime, for many Leases: expiry by the local monotonic clock."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.seen: dict[str, Observation] = {}

    def update(self, record: LeaseRecord, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        old = self.seen.get(record.name)
        if old is None or old.record.identity != record.identity:
            self.seen[record.name] = Observation(record, now)
        else:
            old.record = record  # same record, newer resourceVersion possible: keep the time first seen

    def forget(self, name: str) -> None:
        self.seen.pop(name, None)

    def free(self, name: str, identity: str, now: float | None = None) -> bool:
        """No holder, ours, or unchanged for its lease duration since first seen."""
        seen = self.seen.get(name)
        if seen is None or not seen.record.holder or seen.record.holder == identity:
            return True
        now = self.clock() if now is None else now
        return now >= seen.since + max(seen.record.duration, 1)

    def live(self, name: str, now: float | None = None) -> bool:
        """Held by someone, and not expired."""
        seen = self.seen.get(name)
        return seen is not None and bool(seen.record.holder) and not self.free(name, "", now)


def acquire_or_renew(leases: LeaseAPI, current: LeaseRecord | None, name: str, identity: str, duration: float,
                     role: str, now: dt.datetime | None = None) -> LeaseRecord | None:
    """Write `identity` as holder of `name` (the caller checked it is free or ours): create it, renew it,
    or take it over. Returns the written record, or None on a lost race."""
    stamp = micro_time(now)
    seconds = math.ceil(duration)
    if current is None:
        return leases.write(LeaseRecord(name, identity, seconds, stamp, stamp, 0, "", role))
    if current.holder == identity:
        new = dataclasses.replace(current, duration=seconds, renew_time=stamp, role=role)
    else:
        new = dataclasses.replace(current, holder=identity, duration=seconds, acquire_time=stamp, renew_time=stamp,
                                  transitions=current.transitions + 1, role=role)
    return leases.write(new)


def release(leases: LeaseAPI, current: LeaseRecord, identity: str) -> LeaseRecord | None:
    """Give `current` up (client-go's ReleaseOnCancel: no holder, 1 s duration); None if it was not ours
    any more or another writer got there first."""
    if current.holder != identity:
        return None
    return leases.write(dataclasses.replace(current, holder="", duration=1, renew_time=micro_time()))
