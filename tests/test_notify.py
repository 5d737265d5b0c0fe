"""Notifications (issue #30.2) to a real local HTTP receiver: retried with backoff, never blocking; the
controller's events for an applied-but-incomplete commit and a refused one, with an age-encrypted URL."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ports import free_port
from repo_helpers import EXAMPLE_REPO
from test_controller_status import git as status_git

from gitops.model.config import NotificationTarget
from gitops.notify import Event, Notifier

GITOPS = str(Path(sys.executable).parent / "gitops")


class Receiver:
    """A loopback HTTP server that answers 503 to its first `failures` POSTs, then 200; keeps the bodies."""

    def __init__(self, failures: int = 0):
        self.failures, self.bodies, self.tries = failures, [], 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.tries += 1
                ok = receiver.tries > receiver.failures
                if ok:
                    receiver.bodies.append((self.path, json.loads(body)))
                self.send_response(200 if ok else 503)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_receiver_that_fails_first_gets_the_event_after_retries_and_send_never_waits():
    receiver = Receiver(failures=2)
    try:
        notifier = Notifier(attempts=4, backoff=0.1)
        hook = NotificationTarget("hook", "webhook", receiver.url + "/hook")
        slack = NotificationTarget("chat", "slack", receiver.url + "/slack", events=("Failed",))
        event = Event("a" * 40, "Failed", "action 3/7 failed", actions_done=2, actions_failed=1, actions_planned=7,
                      errors=("action 3/7 failed: ...",), status_commit="b" * 40, time="2026-11-26T08:00:00+00:00")
        started = time.monotonic()
        notifier.send((hook, slack), event)
        assert time.monotonic() - started < 0.05  # queued, not sent inline
        assert notifier.flush(30)
        assert receiver.tries == 4  # two refused, then one per target
        by_path = dict(receiver.bodies)
        assert by_path["/hook"] == {"source": "gitops", "commit": "a" * 40, "result": "Failed",
                                    "message": "action 3/7 failed", "actions": {"done": 2, "failed": 1, "planned": 7},
                                    "errors": ["action 3/7 failed: ..."], "incomplete": [], "statusCommit": "b" * 40,
                                    "time": "2026-11-26T08:00:00+00:00"}
        assert by_path["/slack"]["text"].startswith(":x: gitops *Failed* `aaaaaaaaaaaa`: action 3/7 failed")
        notifier.send((slack,), Event("c" * 40, "Applied", "applied"))  # not one of its events
        assert notifier.flush(5) and receiver.tries == 4
    finally:
        receiver.close()


def git(cwd: Path, *args: str) -> str:
    return status_git(cwd, *args).stdout.strip()


def test_the_controller_notifies_an_incomplete_apply_and_a_refusal_with_an_encrypted_url(tmp_path: Path):
    receiver = Receiver()
    try:
        origin, work, workdir = tmp_path / "origin.git", tmp_path / "work", tmp_path / "controller"
        key = tmp_path / "controller.key"
        recipient = subprocess.run(["age-keygen", "-o", str(key)], capture_output=True, text=True,
                                   check=True).stderr.split("Public key:")[1].strip()
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
        shutil.copytree(EXAMPLE_REPO, work)
        config = work / "gitops.yaml"
        text = config.read_text().replace("  secrets:\n    recipients:\n", f"  secrets:\n    recipients:\n      - {recipient}\n", 1)
        config.write_text(text + f"  notifications:\n    targets:\n      - name: hook\n        url: {receiver.url}/hook\n")
        encrypted = subprocess.run([GITOPS, "secrets", "encrypt", str(config)], capture_output=True, text=True)
        assert encrypted.returncode == 0, encrypted.stdout + encrypted.stderr
        assert receiver.url not in config.read_text() and "BEGIN AGE ENCRYPTED FILE" in config.read_text()
        git(work, "init", "-q", "-b", "main")
        git(work, "remote", "add", "origin", str(origin))
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", "the example, notifying")
        git(work, "push", "-q", "origin", "HEAD:main")
        good = git(work, "rev-parse", "HEAD")

        def reconcile() -> subprocess.CompletedProcess:
            return subprocess.run([GITOPS, "reconcile", "--repo", str(origin), "--workdir", str(workdir),
                                   "--identity", str(key), "--log-format", "text"],
                                  capture_output=True, text=True, timeout=180)

        applied = reconcile()
        assert applied.stdout.startswith("Applied: "), applied.stdout + applied.stderr
        (work / "clusters" / "team-a" / "typo.yaml").write_text("kind: Node\n")
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", "a typo")
        git(work, "push", "-q", "origin", "HEAD:main")
        bad = git(work, "rev-parse", "HEAD")
        refused = reconcile()
        assert refused.stdout.startswith("Refused: "), refused.stdout + refused.stderr
        events = [body for _, body in receiver.bodies]
        assert [(e["commit"], e["result"]) for e in events] == [(good, "Incomplete"), (bad, "Refused")], events
        first, second = events
        assert first["actions"]["done"] == first["actions"]["planned"] > 0  # the SIPCluster's host labels
        assert any("hv-private-1" in source for source in first["incomplete"]), first["incomplete"]
        assert any("clusters/team-a/typo.yaml" in e for e in second["errors"]), second["errors"]
        assert receiver.url not in applied.stderr + refused.stderr  # the URL is a secret: never logged
    finally:
        receiver.close()


_SPOOLING = """
import sys, time
from pathlib import Path
from gitops.model.config import NotificationTarget
from gitops.notify import Event, Notifier
notifier = Notifier(attempts=1000, backoff=5.0, spool=Path(sys.argv[1]))
hooks = (NotificationTarget("hook", "webhook", sys.argv[2]), NotificationTarget("gone", "webhook", sys.argv[2]))
notifier.send(hooks, Event("a" * 40, "Failed", "action 3/7 failed", actions_done=2, actions_failed=1,
                           actions_planned=7, errors=("action 3/7 failed: ...",), status_commit="b" * 40))
print("queued", flush=True)
time.sleep(600)
"""


def test_events_queued_by_a_killed_process_are_sent_after_its_restart(tmp_path: Path):
    """Issue #26 (nothing lost): a controller SIGKILLed while its receiver is down loses no notification: each
    queued event is a spool file (the target's name, not its URL, a secret) until sent or given up; the next
    process queues them again for the targets still configured, and removes each once sent."""
    spool, down = tmp_path / "notifications", f"http://127.0.0.1:{free_port()}/hook?token=secret"
    proc = subprocess.Popen([sys.executable, "-c", _SPOOLING, str(spool), down], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "queued"
    finally:
        proc.kill()
        proc.wait(10)
    left = sorted(spool.iterdir())
    assert len(left) == 2 and all(p.suffix == ".json" for p in left), left
    assert not any(b"secret" in p.read_bytes() for p in left)
    receiver = Receiver()
    try:
        notifier = Notifier(attempts=3, backoff=0.1, spool=spool)
        hook = NotificationTarget("hook", "webhook", receiver.url + "/hook")
        notifier.resume((hook,))  # "gone" is no longer configured: dropped
        notifier.resume((hook,))  # once per process
        assert notifier.flush(30)
        assert [(path, body["commit"], body["result"], body["actions"], body["errors"], body["statusCommit"])
                for path, body in receiver.bodies] == [
            ("/hook", "a" * 40, "Failed", {"done": 2, "failed": 1, "planned": 7}, ["action 3/7 failed: ..."],
             "b" * 40)]
        assert list(spool.iterdir()) == []
        notifier.send((hook,), Event("c" * 40, "Applied", "applied"))  # sent, then its file removed too
        assert notifier.flush(30) and len(receiver.bodies) == 2 and list(spool.iterdir()) == []
    finally:
        receiver.close()


def test_a_spool_that_cannot_be_read_or_holds_junk_never_stops_the_sender(tmp_path: Path, caplog):
    """What `resume` finds that is not a spooled event (a write cut short, junk, a hand edit, a spool that is a
    file) is logged and removed or left alone, never raised; a target whose URL urllib cannot even send to is
    given up without its URL in the log, and its file removed."""
    as_file = tmp_path / "not-a-dir"
    as_file.write_text("x")
    Notifier(spool=as_file).resume(())  # logged, not raised
    spool = tmp_path / "notifications"
    spool.mkdir()
    (spool / "00000000000000000001-1-000001.tmp").write_text('{"target": "hook", "ev')  # cut short by a kill
    (spool / "00000000000000000002-1-000001.json").write_text("{not json")
    (spool / "00000000000000000003-1-000001.json").write_text('{"target": "hook", "event": ["a list"]}')
    (spool / "00000000000000000004-1-000001.json").write_text('{"target": "hook", "event": {"commit": 7, '
                                                              '"result": "Failed", "message": "m"}}')
    bad = NotificationTarget("hook", "webhook", "http://127.0.0.1:1/services/SECRET TOKEN")  # a space: InvalidURL
    notifier = Notifier(attempts=1, backoff=0.01, spool=spool)
    notifier.resume((bad,))
    assert list(spool.iterdir()) == []
    notifier.send((bad,), Event("d" * 40, "Failed", "failed"))
    assert notifier.flush(10) and list(spool.iterdir()) == []
    assert "SECRET" not in caplog.text and "notification given up" in caplog.text
    receiver = Receiver()  # the sender thread is still there for the next event
    try:
        notifier.send((NotificationTarget("ok", "webhook", receiver.url + "/ok"),), Event("e" * 40, "Failed", "f"))
        assert notifier.flush(10) and [b["commit"] for _, b in receiver.bodies] == ["e" * 40]
    finally:
        receiver.close()
