"""What each page shows, built from the status branch's documents (pure: documents in, dataclasses out)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from gitops.plan.actions import KINDS, Kind, Plan
from gitops.plan.render import Section, describe, headline, sections
from gitops.printable import shorten
from gitops.status.reader import SourceStatus
from gitops.units import human_age, human_size

Doc = Mapping[str, Any]


def _status(doc: Doc | None) -> dict[str, Any]:
    status = doc.get("status") if isinstance(doc, Mapping) else None
    return status if isinstance(status, dict) else {}


def _when(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def _ago(when: dt.datetime | None, now: dt.datetime) -> str:
    return f"{human_age((now - when).total_seconds())} ago" if when is not None else ""


def _ready(status: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    """The condition of type `kind` (or the first one)."""
    conditions = status.get("conditions") or [{}]
    return next((c for c in conditions if c.get("type") == kind), conditions[0])


# ------------------------------------------------------------------------------ the fleet


@dataclass(frozen=True)
class ClusterRow:
    name: str
    phase: str
    message: str
    version: str
    controlplane: str  # "3/3": controlplane nodes running / desired
    workers: str  # "2/2" ready / joined, "?" when the cluster's API was not read
    cert_expiry: str  # the earliest certificate's expiry, "in 364d"
    cert_expiry_soon: bool
    backup: str  # "3m ago", "none", "" (no spec.backup)
    backup_failed: bool
    applied_sha: str


@dataclass(frozen=True)
class HypervisorRow:
    name: str
    phase: str
    message: str
    pods: int
    ports: str  # "12 of 1,000 ports"


@dataclass(frozen=True)
class Fleet:
    source: SourceStatus
    applied_at: str
    clusters: tuple[ClusterRow, ...]
    hypervisors: tuple[HypervisorRow, ...]
    phases: tuple[str, ...]  # every phase seen, for the filter


def fleet(source: SourceStatus, clusters: Mapping[str, Doc], nodes: Mapping[str, Doc], hypervisors: Mapping[str, Doc],
          backups: Mapping[str, Doc], now: dt.datetime, phase: str = "", query: str = "",
          applied_at: dt.datetime | None = None) -> Fleet:
    """Every Cluster (those of `phase`, whose name holds `query`) and every Hypervisor."""
    roles = {name: (doc.get("spec") or {}).get("role", "") for name, doc in nodes.items()}
    rows = []
    for name, doc in sorted(clusters.items()):
        status = _status(doc)
        if (phase and status.get("phase") != phase) or (query and query.lower() not in name.lower()):
            continue
        planes = {n: p for n, p in (status.get("nodes") or {}).items() if roles.get(n) == "controlplane"}
        workers = status.get("workers") or {}
        expiry = _when((status.get("certificates") or {}).get("earliestExpiry"))
        backup = _status(backups.get(name))
        last = _when((backup.get("lastSnapshot") or {}).get("time"))
        failed = any(c.get("type") == "BackedUp" and c.get("status") == "False" for c in backup.get("conditions", ()))
        rows.append(ClusterRow(
            name=name, phase=str(status.get("phase", "?")), message=str(_ready(status).get("message", "")),
            version=str(status.get("version", "")),
            controlplane=f"{sum(p == 'Ready' for p in planes.values())}/{len(planes)}",
            workers=f"{workers.get('ready', 0)}/{workers.get('total', 0)}" if workers.get("observed") else "?",
            cert_expiry=(f"in {human_age((expiry - now).total_seconds())}" if expiry and expiry > now
                         else ("expired" if expiry else "")),
            cert_expiry_soon=bool(expiry and (expiry - now) < dt.timedelta(days=30)),
            backup=_ago(last, now) if last else ("none" if backup else ""), backup_failed=failed,
            applied_sha=str(status.get("runningSHA") or status.get("observedSourceSHA", ""))))
    hvs = []
    for name, doc in sorted(hypervisors.items()):
        status = _status(doc)
        ports = status.get("ports") or {}
        hvs.append(HypervisorRow(name, str(status.get("phase", "?")), str(_ready(status, "Reachable").get("message", "")),
                                 len(status.get("pods") or ()),
                                 f"{ports.get('used', 0):,} of {ports.get('total', 0):,}" if ports else ""))
    phases = tuple(sorted({str(_status(d).get("phase", "?")) for d in clusters.values()}))
    return Fleet(source, _ago(applied_at, now), tuple(rows), tuple(hvs), phases)


@dataclass(frozen=True)
class WaveRow:
    wave: str
    phase: str
    cluster: str
    probed: str
    failed: str
    success: str
    workers: str  # "2 -> 2": Ready at the wave's start, then the fewest during it


@dataclass(frozen=True)
class RolloutView:
    """The last rollout through spec.rollout.waves (status/rollout.yaml)."""

    commit: str
    phase: str  # Rolling, Soaked (every wave started so far) or Halted
    halted: str  # "wave canary, cluster team-a: ..." ("" when it did not halt)
    rows: tuple[WaveRow, ...]


def rollout_view(status: dict[str, Any] | None) -> RolloutView | None:
    if not status:
        return None
    halted = _map(status.get("halted"))
    rows = []
    for wave in _list(status.get("waves")):
        wave = _map(wave)
        for name, figures in sorted(_map(wave.get("clusters")).items()):
            f = _map(figures)
            before, fewest = _text(f.get("workers_ready_before", "-")), _text(f.get("workers_ready_min", "-"))
            rows.append(WaveRow(_text(wave.get("name")), _text(wave.get("phase")), _text(name),
                                _text(f.get("requests", "-")), _text(f.get("failed", "-")),
                                _text(f.get("success_ratio", "-")), f"{before} -> {fewest}"))
    return RolloutView(_text(status.get("commit")), _text(status.get("phase")),
                       f"wave {_text(halted.get('wave'))}, cluster {_text(halted.get('cluster'))}: "
                       f"{_text(halted.get('reason'))}" if halted else "", tuple(rows))


# ------------------------------------------------------------------------------ one cluster


@dataclass(frozen=True)
class ComponentRow:
    name: str
    state: str
    image: str
    restarts: int


@dataclass(frozen=True)
class NodeRow:
    name: str
    role: str
    phase: str
    message: str
    components: tuple[ComponentRow, ...]


@dataclass(frozen=True)
class HypervisorGroup:
    hypervisor: str
    nodes: tuple[NodeRow, ...]


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    since: str


@dataclass(frozen=True)
class WorkerRow:
    name: str
    ready: bool
    address: str
    kubelet: str


@dataclass(frozen=True)
class ClusterPage:
    name: str
    phase: str
    version: str
    endpoint: str
    groups: tuple[HypervisorGroup, ...]
    members: tuple[str, ...]  # etcd members
    leader: str
    conditions: tuple[Condition, ...]
    workers: tuple[WorkerRow, ...] | None  # None: the cluster's API was not read
    workers_reason: str
    backup: str
    cert_expiry: str


def cluster_page(name: str, doc: Doc, nodes: Mapping[str, Doc], backup: Doc | None, now: dt.datetime) -> ClusterPage:
    status = _status(doc)
    groups: dict[str, list[NodeRow]] = {}
    for node, node_doc in sorted(nodes.items()):
        if (node_doc.get("spec") or {}).get("cluster") != name:
            continue
        st = _status(node_doc)
        details = st.get("containers") or {}
        components = tuple(ComponentRow(c, str(state), str((details.get(c) or {}).get("image", "")),
                                        int((details.get(c) or {}).get("restarts", 0)))
                           for c, state in (st.get("components") or {}).items())
        groups.setdefault(str(st.get("hypervisor", "(not placed)")), []).append(
            NodeRow(node, str((node_doc.get("spec") or {}).get("role", "")), str(st.get("phase", "?")),
                    str(_ready(st).get("message", "")), components))
    etcd = status.get("etcd") or {}
    workers = status.get("workers") or {}
    seen = tuple(WorkerRow(w, bool(d.get("ready")), str(d.get("address", "")), str(d.get("kubeletVersion", "")))
                 for w, d in sorted((workers.get("nodes") or {}).items())) if workers.get("observed") else None
    backup_status = _status(backup)
    last = backup_status.get("lastSnapshot") or {}
    expiry = _when((status.get("certificates") or {}).get("earliestExpiry"))
    return ClusterPage(
        name=name, phase=str(status.get("phase", "?")), version=str(status.get("version", "")),
        endpoint=str((status.get("endpoints") or {}).get("api", "")),
        groups=tuple(HypervisorGroup(hv, tuple(rows)) for hv, rows in sorted(groups.items())),
        members=tuple(etcd.get("members") or ()), leader=str(etcd.get("leader", "")),
        conditions=tuple(Condition(str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason", "")),
                                   str(c.get("message", "")), str(c.get("lastTransitionTime", "")))
                         for c in status.get("conditions") or ()),
        workers=seen, workers_reason=str(workers.get("reason", "")),
        backup=(f"{str(last.get('id', ''))[:8]}, {_ago(_when(last.get('time')), now)}, "
                f"{human_size(int(last.get('bytes', 0)))}" if last else ("none yet" if backup else "")),
        cert_expiry=f"{expiry:%Y-%m-%d %H:%M} UTC ({(status.get('certificates') or {}).get('certificate', '')})"
        if expiry else "")


# ------------------------------------------------------------------------------ applies


@dataclass(frozen=True)
class ActionRow:
    index: int
    symbol: str
    kind: str
    subject: str
    hypervisor: str
    reason: str
    details: tuple[str, ...]
    result: str
    seconds: str


@dataclass(frozen=True)
class ApplyRow:
    """One status commit: an apply, a refusal, a backup or a state hand-over."""

    status_sha: str
    when: str
    at: int  # unix time
    kind: str  # Applied | Failed | Stopped | Refused | Backup | Other
    source_sha: str
    subject: str
    done: int
    failed: int
    planned: int
    duration: str
    errors: tuple[str, ...]
    clusters: tuple[str, ...]  # the clusters its actions touched


def _symbol(kind: str) -> str:
    """The plan's `+ ~ -` of an action kind as apply.yaml writes it (`~` for a kind this gitops does not know)."""
    try:
        return KINDS[Kind(kind)].symbol
    except ValueError:
        return "~"


#: libyaml's parser (the applies page reads up to 100 records, each up to hundreds of KiB)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: the longest text of a record shown (a reason, an error): the status branch is untrusted input
TEXT_LIMIT = 4000


def load_record(data: bytes | None) -> dict[str, Any]:
    """The `status` mapping of a status record (`{}` when there is none, or it is not YAML of that shape)."""
    if not data:
        return {}
    try:
        return _status(yaml.load(data, Loader=_LOADER))
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return {}


def _text(value: Any) -> str:
    """A scalar of a record as text ("" for a mapping or a list: an alias of a huge one is never expanded)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, dt.date)):
        return ""
    return shorten(str(value), TEXT_LIMIT)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def aged(row: ApplyRow, now: dt.datetime) -> ApplyRow:
    """`row` with its age at `now` (rows are kept by status commit, without one)."""
    return replace(row, when=_ago(dt.datetime.fromtimestamp(row.at, dt.timezone.utc), now))


def apply_row(sha: str, at: int, subject: str, source: bytes | None, apply: bytes | None, applied_here: bool,
              now: dt.datetime | None = None) -> ApplyRow:
    """One status commit's row, from its records as they were (its age at `now`, "" without one)."""
    src = load_record(source)
    record = load_record(apply) if applied_here else {}
    kind = "Other"
    if subject.startswith("refuse "):
        kind = "Refused"
    elif subject.startswith("backup:"):
        kind = "Backup"
    elif record:
        kind = _text(record.get("result")) or "Applied"
    elif subject.split(" ", 1)[0] in ("applied", "failed", "stopped", "incomplete"):
        kind = subject.split(" ", 1)[0].capitalize()
    summary = _map(record.get("summary"))
    error = _text(record.get("error"))
    subjects = {_text(_map(a).get("subject")).split("/")[0] for a in _list(record.get("actions"))}
    row = ApplyRow(
        status_sha=sha, when="", at=at, kind=kind,
        source_sha=(_text(record.get("sha")) or _text(src.get("lastSeenSHA"))) if kind != "Backup" else "",
        subject=shorten(subject, TEXT_LIMIT), done=_int(summary.get("executed")), failed=1 if error else 0,
        planned=_int(summary.get("planned")), duration=_seconds(record.get("durationSeconds")),
        errors=tuple(_text(e) for e in _list(src.get("errors"))[:50]) if kind == "Refused" else
        ((error,) if error else ()),
        clusters=tuple(sorted(subjects - {""})))
    return aged(row, now) if now is not None else row


def apply_rows(items: Iterable[tuple[str, int, str, bytes | None, bytes | None, bool]]) -> list[ApplyRow]:
    """`apply_row` of each (sha, time, subject, source, apply, applied here), without their ages."""
    return [apply_row(*item) for item in items]


def unreadable_row(sha: str, at: int, subject: str, why: str) -> ApplyRow:
    """The row of a status commit whose records are not read (`why`)."""
    return ApplyRow(sha, "", at, "Other", "", shorten(subject, TEXT_LIMIT), 0, 0, 0, "", (why,), ())


@dataclass(frozen=True)
class ApplyPage:
    row: ApplyRow
    time: str
    actions: tuple[ActionRow, ...]
    follow_up: tuple[ActionRow, ...]
    follow_up_why: tuple[str, ...]


def _action_rows(rows: Iterable[Any]) -> tuple[ActionRow, ...]:
    out = []
    for a in map(_map, rows):
        kind = _text(a.get("kind"))
        out.append(ActionRow(_int(a.get("index")), _symbol(kind), kind, _text(a.get("subject")),
                             _text(a.get("hypervisor")), _text(a.get("reason")),
                             tuple(_text(d) for d in _list(a.get("details"))), _text(a.get("result")),
                             _seconds(a.get("seconds"))))
    return tuple(out)


def apply_page(row: ApplyRow, apply: bytes | None) -> ApplyPage:
    record = load_record(apply)
    follow = _map(record.get("followUp"))
    return ApplyPage(row, _text(record.get("time")), _action_rows(_list(record.get("actions"))),
                     _action_rows(_list(follow.get("actions"))), tuple(_text(w) for w in _list(follow.get("why"))))


# ------------------------------------------------------------------------------ a timeline picture


@dataclass(frozen=True)
class Mark:
    x: float
    kind: str
    title: str
    href: str


@dataclass(frozen=True)
class Timeline:
    """An SVG strip: one mark per apply that touched the cluster (or per status commit), by time."""

    width: int
    height: int
    marks: tuple[Mark, ...]
    start: str
    end: str


def timeline(rows: Iterable[ApplyRow], cluster: str = "", width: int = 720, height: int = 36) -> Timeline:
    mine = [r for r in rows if r.kind not in ("Other",) and (not cluster or cluster in r.clusters
                                                                or r.kind == "Refused")]
    if not mine:
        return Timeline(width, height, (), "", "")
    first, last = min(r.at for r in mine), max(r.at for r in mine)
    span = max(last - first, 1)
    pad = 8
    marks = tuple(Mark(round(pad + (r.at - first) * (width - 2 * pad) / span, 1), r.kind,
                       f"{r.kind} {r.source_sha[:12]} ({r.when}): {r.done} done, {r.failed} failed",
                       f"/applies/{r.status_sha}") for r in sorted(mine, key=lambda r: r.at))
    stamp = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")  # noqa: E731
    return Timeline(width, height, marks, stamp(first), stamp(last))


# ------------------------------------------------------------------------------ a branch's plan


@dataclass(frozen=True)
class PlanLine:
    symbol: str
    text: str
    details: tuple[str, ...]


@dataclass(frozen=True)
class PlanGroup:
    title: str
    hypervisor: str
    lines: tuple[PlanLine, ...]


@dataclass(frozen=True)
class PlanCluster:
    name: str
    groups: tuple[PlanGroup, ...]


@dataclass(frozen=True)
class PlanPage:
    ref: str
    commit: str
    headline: str
    source: str
    unknowns: tuple[str, ...]
    notes: tuple[str, ...]
    clusters: tuple[PlanCluster, ...]
    warnings: tuple[str, ...]
    error: str = ""
    branches: tuple[str, ...] = field(default=())


def plan_page(ref: str, commit: str, plan: Plan, branches: tuple[str, ...] = ()) -> PlanPage:
    """The plan of a branch, grouped as `gitops plan` prints it (`gitops.plan.render.sections`)."""
    clusters: dict[str, list[PlanGroup]] = {}
    for section in sections(plan):
        clusters.setdefault(section.cluster, []).append(_group(section))
    return PlanPage(ref, commit, headline(plan), plan.source, tuple(u.describe() for u in plan.unknowns),
                    tuple(plan.notes), tuple(PlanCluster(n, tuple(g)) for n, g in clusters.items()),
                    tuple(plan.warnings), branches=branches)


def _group(section: Section) -> PlanGroup:
    return PlanGroup(section.title, section.hypervisor,
                     tuple(PlanLine(a.symbol, describe(a), a.details) for a in section.actions))


def plan_error(ref: str, error: str, branches: tuple[str, ...]) -> PlanPage:
    return PlanPage(ref, "", "", "", (), (), (), (), error=error, branches=branches)


__all__ = ["ApplyPage", "ApplyRow", "ClusterPage", "Fleet", "PlanPage", "Timeline", "aged", "apply_page",
           "apply_row", "apply_rows", "cluster_page", "fleet", "load_record", "plan_error", "plan_page", "timeline",
           "unreadable_row"]
