"""An etcd snapshot stored in a backup target (data only: `gitops.backup.restic` lists and stores them)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    """One etcd snapshot in a target."""

    id: str
    time: dt.datetime
    cluster: str
    revision: int
    bytes: int
    member: str

    @property
    def short_id(self) -> str:
        return self.id[:8]

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "time": self.time.isoformat(), "cluster": self.cluster, "revision": self.revision,
                "bytes": self.bytes, "member": self.member}

    @classmethod
    def from_json(cls, data: dict) -> "Snapshot":
        return cls(str(data["id"]), dt.datetime.fromisoformat(str(data["time"])), str(data["cluster"]),
                   int(data["revision"]), int(data["bytes"]), str(data["member"]))
