"""Notifications: each commit's outcome POSTed to `spec.notifications.targets` (a generic JSON webhook, or a
Slack-compatible payload), from a background thread with retries and backoff, so that a receiver that is
slow or down never blocks a reconcile (I/O). With a spool directory (the controller's workdir), each queued
event is a file until it is sent or given up, so a controller killed meanwhile sends it after its restart:
delivery is at least once (a receiver may see an event twice, same `commit` and `statusCommit`).

What an event says comes from the repo (a commit's file names, its errors): untrusted text. Slack's `text`
escapes it (`&`, `<`, `>`) so it never becomes a mention or a link; the webhook JSON carries it raw. The
spool is read without following a link or opening anything but a regular file (`safeio.read_regular`)."""
from __future__ import annotations

import json
import logging
import os
import queue
import random
import stat
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from gitops.model.config import NotificationTarget
from gitops.printable import printable
from gitops.safeio import FileRefused, read_regular, write_atomic

log = logging.getLogger(__name__)

#: the outcomes a target may ask for (`events`)
EVENTS = ("Applied", "Failed", "Refused", "Incomplete", "UntrustedStatus", "Halted")
#: events waiting at most (beyond: dropped with a log line), and the size read of one spooled event
MAX_QUEUED = 1000
MAX_SPOOLED_BYTES = 1 << 20


@dataclass(frozen=True)
class Event:
    """One commit's outcome, as sent: `result` is Applied, Failed, Refused, Incomplete (applied, but some
    source could not be observed: `incomplete` names them), Halted (a rollout wave breached its SLO) or
    UntrustedStatus."""

    commit: str
    result: str
    message: str
    actions_done: int = 0
    actions_failed: int = 0
    actions_planned: int = 0
    errors: tuple[str, ...] = ()
    incomplete: tuple[str, ...] = ()
    status_commit: str = ""
    time: str = ""


def webhook_payload(event: Event) -> dict:
    """gitops's own JSON: every field of the event, camelCase."""
    data = asdict(event)
    return {"source": "gitops", "commit": data["commit"], "result": data["result"], "message": data["message"],
            "actions": {"done": event.actions_done, "failed": event.actions_failed, "planned": event.actions_planned},
            "errors": list(event.errors), "incomplete": list(event.incomplete), "statusCommit": event.status_commit,
            "time": event.time}


_ICON = {"Applied": ":white_check_mark:", "Failed": ":x:", "Refused": ":no_entry:", "Incomplete": ":warning:",
         "UntrustedStatus": ":rotating_light:", "Halted": ":octagonal_sign:"}


def slack_escape(text: str) -> str:
    """`text` as Slack reads it literally: its control characters `&`, `<` and `>` as `&amp;`, `&lt;` and
    `&gt;`, so `<!channel>` or `<https://evil.example|log in>` from a commit is shown, never acted on."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(event: Event) -> dict:
    """A Slack incoming-webhook message (`text`, Slack's mrkdwn), which Mattermost and others also take.
    Every value of the event is escaped (`slack_escape`); only the icon, `*`s and backquotes are gitops's."""
    e = slack_escape
    lines = [f"{_ICON.get(event.result, '')} gitops *{e(event.result)}* `{e(event.commit[:12])}`: "
             f"{e(event.message)}".strip(),
             f"actions: {event.actions_done} done, {event.actions_failed} failed of {event.actions_planned} planned"]
    lines += [f"• {e(error)}" for error in event.errors[:10]]
    lines += [f"• not observed: {e(source)}" for source in event.incomplete[:10]]
    return {"text": "\n".join(lines)}


def payload(target: NotificationTarget, event: Event) -> bytes:
    body = slack_payload(event) if target.kind == "slack" else webhook_payload(event)
    return json.dumps(body, sort_keys=True).encode()


class Notifier:
    """Sends events from one daemon thread: each POST retried `attempts` times, waiting `backoff` seconds,
    then twice that, and so on (with jitter). `send` only queues; `flush` waits for the queue (a one-shot
    `gitops reconcile` before it exits). `spool`: where queued events are kept until sent or given up (the
    target by name, never its URL, which may be a decrypted secret); `resume` queues what an earlier
    process left there."""

    def __init__(self, attempts: int = 5, backoff: float = 1.0, timeout: float = 10.0, spool: Path | None = None):
        self.attempts, self.backoff, self.timeout = attempts, backoff, timeout
        self.spool = spool
        self._queue: queue.Queue[tuple[NotificationTarget, Event, Path | None]] = queue.Queue(maxsize=MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._resumed = False
        self._serial = 0

    def send(self, targets: tuple[NotificationTarget, ...], event: Event) -> None:
        """Queue `event` for every target that asks for its result (dropped, with a log line, when the queue
        is full: receivers down for long)."""
        for target in targets:
            if event.result in target.events:
                self._put(target, event, self._keep(target, event))

    def resume(self, targets: tuple[NotificationTarget, ...]) -> None:
        """Once per process: queue the events an earlier process spooled and did not finish, oldest first,
        for the targets still configured under their names (others are dropped with a log line). Never
        raises: a spool that cannot be read is logged and left alone, and so is an entry in it that is not a
        regular file (a link, a FIFO, a directory, a device: never followed nor opened)."""
        if self._resumed or self.spool is None:
            return
        self._resumed = True
        by_name = {t.name: t for t in targets}
        try:
            names = _spool_files(self.spool)
        except FileNotFoundError:
            return
        except OSError as err:
            log.error("notification spool unreadable: nothing resumed", extra={"spool": str(self.spool),
                                                                                "error": str(err)})
            return
        for name in names:
            path = self.spool / name
            if not name.endswith(".json"):  # a write cut short by a crash (`.tmp`): its event was never queued
                _remove(path)
                continue
            try:
                target, event = _spooled(path, by_name)
            except FileRefused as err:  # too large for one of gitops's, or put in its place since listed
                log.warning(f"spooled notification {printable(name)} skipped: {err.reason}; left alone",
                            extra={"file": str(path), "error": err.reason})
                continue
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                log.warning("spooled notification unreadable: dropped", extra={"file": str(path), "error": str(err)})
                _remove(path)
                continue
            if target is None:
                log.warning("spooled notification dropped: its target is no longer configured",
                            extra={"file": str(path), "commit": event.commit[:12]})
                _remove(path)
                continue
            log.info("spooled notification queued again", extra={"target": target.name, "commit": event.commit[:12]})
            self._put(target, event, path)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued event was sent or given up (True), or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _keep(self, target: NotificationTarget, event: Event) -> Path | None:
        """The event written to the spool (whole or not at all: a temporary file renamed), or None."""
        if self.spool is None:
            return None
        self._serial += 1
        path = self.spool / f"{time.time_ns():020d}-{os.getpid()}-{self._serial:06d}.json"
        try:
            self.spool.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(path, json.dumps({"target": target.name, "event": asdict(event)}, sort_keys=True))
        except OSError as err:
            log.warning("notification not spooled: sent from memory only", extra={"error": str(err)})
            return None
        return path

    def _put(self, target: NotificationTarget, event: Event, path: Path | None) -> None:
        try:
            self._queue.put_nowait((target, event, path))
        except queue.Full:
            log.warning("notification dropped: too many waiting", extra={"target": target.name})
            if path is not None:
                _remove(path)
            return
        self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            target, event, path = self._queue.get()
            try:
                self._deliver(target, event)
            except Exception as err:  # noqa: BLE001 - the thread goes on; the text may hold the URL: not logged
                log.error("notification given up", extra={"target": target.name, "commit": event.commit[:12],
                                                          "error": type(err).__name__})
            finally:
                if path is not None:  # sent or given up: done with it
                    _remove(path)
                self._queue.task_done()
    def _deliver(self, target: NotificationTarget, event: Event) -> None:
        body = payload(target, event)
        if not target.url.startswith(("http://", "https://")):
            log.error("notification not sent: its url is not http(s) (still encrypted? give the controller "
                      "its identity)", extra={"target": target.name})
            return
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(target.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "User-Agent": "gitops-notifier"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    answer.read()
                log.info("notification sent", extra={"target": target.name, "result": event.result,
                                                     "commit": event.commit[:12], "attempt": attempt})
                return
            except (urllib.error.URLError, OSError) as err:
                error = getattr(err, "code", None) or getattr(err, "reason", None) or err
                if attempt == self.attempts:
                    log.error("notification given up", extra={"target": target.name, "commit": event.commit[:12],
                                                              "attempts": attempt, "error": str(error)})
                    return
                time.sleep(self.backoff * 2 ** (attempt - 1) * random.uniform(0.8, 1.2))


def _spool_files(spool: Path) -> list[str]:
    """The names of the regular files in `spool`, sorted (oldest first); every other entry (a link, a FIFO,
    a directory, a device) is logged with its name and left alone, never followed nor opened."""
    names = []
    with os.scandir(spool) as entries:
        for entry in entries:
            try:
                regular = entry.is_file(follow_symlinks=False)
            except OSError:
                regular = False
            if regular:
                names.append(entry.name)
                continue
            kind = _kind(entry)
            log.warning(f"notification spool entry {printable(entry.name)} skipped: it is {kind}, not a regular "
                        "file; left alone", extra={"file": entry.path, "error": f"is {kind}"})
    return sorted(names)


def _kind(entry: os.DirEntry) -> str:
    """What a spool entry that is no regular file is, as a log line says it (its own, never a link's target)."""
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return "gone or unreadable"
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _spooled(path: Path, targets: dict[str, NotificationTarget]) -> tuple[NotificationTarget | None, Event]:
    """A spool file's target (None: not configured) and event; `FileRefused` when it is no regular file (or
    too large), ValueError and the like when it is not one."""
    data = json.loads(read_regular(path, MAX_SPOOLED_BYTES, name=path.name))
    known = {f.name for f in fields(Event)}
    raw = data["event"]
    if not isinstance(raw, dict) or not isinstance(data["target"], str):
        raise ValueError("not a spooled event")
    values = {k: tuple(str(x) for x in v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
    event = Event(**values)
    if not all(isinstance(getattr(event, k), str) for k in ("commit", "result", "message", "status_commit", "time")):
        raise ValueError("not a spooled event")
    return targets.get(data["target"]), event


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        log.warning("notification spool file not removed", extra={"file": str(path), "error": str(err)})
