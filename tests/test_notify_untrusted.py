"""Issue #42.5: what a notification carries from the repo is untrusted. Slack's text escapes it (`<!channel>` and
`<https://evil.example|log in>` stay inert) while the webhook JSON carries it raw, checked on the JSON a real local
HTTP receiver gets; and the spool is read through safe I/O on real files: a FIFO, a symlink, a directory, a device
or an oversized file in it is skipped with its name logged, never hangs, and nothing is read or removed through a
link."""
from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from repo_helpers import EXAMPLE_REPO
from test_notify import Receiver, git

from gitops.model.config import NotificationTarget
from gitops.notify import MAX_SPOOLED_BYTES, Event, Notifier, slack_escape
from gitops.safeio import FileRefused, read_regular

GITOPS = str(Path(sys.executable).parent / "gitops")
CHANNEL, PHISH = "<!channel>", "<https://evil.example|log in>"


@pytest.fixture
def work() -> Iterator[Path]:
    """A private temporary directory, removed with whatever FIFO or link a test put in it."""
    path = Path(tempfile.mkdtemp(prefix="gitops-notify-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_slack_escapes_control_characters_and_nothing_else() -> None:
    assert slack_escape(f"a & b {CHANNEL} {PHISH} &amp;") == (
        "a &amp; b &lt;!channel&gt; &lt;https://evil.example|log in&gt; &amp;amp;")
    assert slack_escape("*bold* `code` :x: é") == "*bold* `code` :x: é"


def test_untrusted_text_reaches_slack_inert_and_the_webhook_raw() -> None:
    receiver = Receiver()
    try:
        event = Event("<!here>" + "a" * 33, "Refused", f"commit refused: {CHANNEL} wants you to {PHISH}",
                      errors=(f"clusters/{CHANNEL}.yaml:1: Node/{PHISH}: invalid & bad",),
                      incomplete=(f"Hypervisor/{CHANNEL}",))
        notifier = Notifier(attempts=2, backoff=0.05)
        notifier.send((NotificationTarget("chat", "slack", receiver.url + "/slack"),
                       NotificationTarget("hook", "webhook", receiver.url + "/hook")), event)
        assert notifier.flush(30)
        by_path = dict(receiver.bodies)
        text = by_path["/slack"]["text"]
        assert "<" not in text and ">" not in text, text  # nothing Slack would parse as a mention or a link
        assert text.splitlines() == [
            ":no_entry: gitops *Refused* `&lt;!here&gt;aaaaa`: commit refused: &lt;!channel&gt; wants you to "
            "&lt;https://evil.example|log in&gt;",
            "actions: 0 done, 0 failed of 0 planned",
            "• clusters/&lt;!channel&gt;.yaml:1: Node/&lt;https://evil.example|log in&gt;: invalid &amp; bad",
            "• not observed: Hypervisor/&lt;!channel&gt;"]
        hook = by_path["/hook"]  # gitops's own JSON: the values as they are
        assert (hook["commit"], hook["message"], hook["errors"], hook["incomplete"]) == (
            event.commit, event.message, list(event.errors), list(event.incomplete))
    finally:
        receiver.close()


def test_a_refused_commit_naming_mentions_and_links_reaches_slack_inert(work: Path) -> None:
    """The controller end to end: a commit whose file name and resource name are Slack markup is refused;
    the Slack receiver gets them escaped, the webhook receiver raw."""
    receiver = Receiver()
    try:
        origin, repo, workdir, key = work / "origin.git", work / "repo", work / "controller", work / "controller.key"
        subprocess.run(["age-keygen", "-o", str(key)], capture_output=True, check=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
        shutil.copytree(EXAMPLE_REPO, repo)
        config = repo / "gitops.yaml"
        config.write_text(config.read_text() + (
            "  notifications:\n    targets:\n"
            f"      - name: chat\n        type: slack\n        url: {receiver.url}/slack\n        events: [Refused]\n"
            f"      - name: hook\n        url: {receiver.url}/hook\n        events: [Refused]\n"))
        git(repo, "init", "-q", "-b", "main")
        git(repo, "remote", "add", "origin", str(origin))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "the example, notifying")
        git(repo, "push", "-q", "origin", "HEAD:main")

        def reconcile() -> subprocess.CompletedProcess:
            return subprocess.run([GITOPS, "reconcile", "--repo", str(origin), "--workdir", str(workdir),
                                   "--identity", str(key), "--log-format", "text"],
                                  capture_output=True, text=True, timeout=180)

        applied = reconcile()
        assert applied.stdout.startswith(("Applied: ", "Incomplete: ")), applied.stdout + applied.stderr
        hostile = f"{CHANNEL} & <!here>.yaml"
        (repo / "clusters" / "team-a" / hostile).write_text(f'kind: Node\nmetadata:\n  name: "{PHISH} {CHANNEL}"\n')
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"{CHANNEL} please {PHISH}")
        git(repo, "push", "-q", "origin", "HEAD:main")
        refused = reconcile()
        assert refused.stdout.startswith("Refused: "), refused.stdout + refused.stderr
        by_path = dict(receiver.bodies)
        assert set(by_path) == {"/slack", "/hook"}, receiver.bodies
        text = by_path["/slack"]["text"]
        assert "<" not in text and ">" not in text, text
        assert "clusters/team-a/&lt;!channel&gt; &amp; &lt;!here&gt;.yaml" in text, text
        assert "Node/&lt;https://evil.example|log in&gt; &lt;!channel&gt;" in text, text
        assert any(f"clusters/team-a/{hostile}" in e and f"Node/{PHISH} {CHANNEL}" in e
                   for e in by_path["/hook"]["errors"]), by_path["/hook"]
    finally:
        receiver.close()


def spooled(target: str, commit: str) -> str:
    return json.dumps({"target": target, "event": asdict(Event(commit, "Failed", "failed"))})


def test_a_spool_of_fifos_links_directories_devices_and_huge_files_never_hangs_nor_reads_through_links(
        work: Path, caplog) -> None:
    spool, outside = work / "notifications", work / "outside"
    spool.mkdir()
    outside.mkdir()
    secret = outside / "event.json"  # a valid spooled event, but not in the spool: never sent nor removed
    secret.write_text(spooled("hook", "f" * 40))
    os.mkfifo(spool / "00000000000000000001-1-000001.json")
    os.mkfifo(spool / "00000000000000000001-1-000002.tmp")
    (spool / "00000000000000000002-1-000001.json").symlink_to(secret)
    (spool / "00000000000000000002-1-000002.tmp").symlink_to(secret)
    (spool / "00000000000000000003-1-000001.json").mkdir()
    (spool / "00000000000000000004-1-000001.json").symlink_to("/dev/zero")
    with open(spool / "00000000000000000005-1-000001.json", "wb") as huge:  # sparse: no disk used
        huge.truncate(MAX_SPOOLED_BYTES + 1)
    (spool / "00000000000000000006-1-000001.json").write_text(spooled("hook", "a" * 40))
    skipped = sorted(p.name for p in spool.iterdir() if not p.name.startswith("00000000000000000006"))
    receiver = Receiver()
    done = threading.Event()
    notifier = Notifier(attempts=2, backoff=0.05, spool=spool)
    hook = NotificationTarget("hook", "webhook", receiver.url + "/hook")

    def resume_and_flush() -> None:
        notifier.resume((hook,))
        if notifier.flush(20):
            done.set()

    thread = threading.Thread(target=resume_and_flush, daemon=True)
    try:
        thread.start()
        thread.join(30)
        hung = thread.is_alive()
        assert not hung and done.is_set(), "resume or flush hung on the spool"
        assert [body["commit"] for _, body in receiver.bodies] == ["a" * 40]  # the one real event only
        assert sorted(p.name for p in spool.iterdir()) == skipped  # each left alone, the sent one removed
        assert secret.read_text() == spooled("hook", "f" * 40)  # not removed through a link
        for name in skipped:
            assert name in caplog.text, name
        assert "is a FIFO" in caplog.text and "is a symlink" in caplog.text and "is a directory" in caplog.text
        assert "file is larger than 1 MiB" in caplog.text
    finally:
        receiver.close()
        if thread.is_alive():  # a reader stuck on a FIFO: give it an end so the thread ends
            for fifo in spool.glob("00000000000000000001-*"):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_read_regular_refuses_what_is_no_regular_file_without_waiting_or_following(work: Path) -> None:
    (work / "file").write_bytes(b"12345")
    os.mkfifo(work / "fifo")
    (work / "link").symlink_to(work / "file")
    (work / "dir").mkdir()
    assert read_regular(work / "file", 5) == b"12345"
    for name, reason in (("fifo", "is a FIFO (named pipe), not a regular file"), ("link", "is a symlink"),
                         ("dir", "is a directory, not a regular file"), ("missing", "no such file")):
        with pytest.raises(FileRefused, match=re.escape(reason)):
            read_regular(work / name, 5, name=name)
    with pytest.raises(FileRefused, match="is a character device"):
        read_regular("/dev/zero", 5)
    with pytest.raises(FileRefused, match="file is larger than 4 bytes"):
        read_regular(work / "file", 4)
