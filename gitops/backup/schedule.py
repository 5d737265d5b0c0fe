"""When a cluster's next scheduled snapshot is due (pure: the controller asks, then takes it)."""
from __future__ import annotations

import datetime as dt

from gitops.model.resources import ClusterBackup

#: after a failed snapshot the next try waits at least this long (a dead target is not hammered every poll)
RETRY_AFTER = dt.timedelta(minutes=5)


def due(spec: ClusterBackup, last_snapshot: dt.datetime | None, last_failure: dt.datetime | None,
        now: dt.datetime) -> bool:
    """Whether the cluster needs a snapshot now: none yet, or the newest is `intervalMinutes` old;
    never sooner than RETRY_AFTER (or the interval, when shorter) after a failure."""
    if last_failure is not None and now - last_failure < min(RETRY_AFTER, dt.timedelta(minutes=spec.interval_minutes)):
        return False
    return last_snapshot is None or now - last_snapshot >= dt.timedelta(minutes=spec.interval_minutes)
