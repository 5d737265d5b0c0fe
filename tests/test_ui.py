"""`gitops ui` over a real status branch, with nothing reachable (no lab, fast): the pages, their filters, a
refused commit's errors with file:line, the plan of a branch, and no secret anywhere.

The repo is the example's; its hypervisors are not running, so its clusters stay Progressing, and the
controller applies only the SIPCluster's BareMetalHost labels. `tests/test_controller_lab.py` drives the
same pages in Chromium against a lab the controller converged.
"""
from __future__ import annotations

import concurrent.futures
import datetime as dt
import html
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from repo_helpers import EXAMPLE_REPO
from test_controller_status import git as status_git
from test_controller_status import BAD_NODE, push, reconcile

GITOPS = str(Path(sys.executable).parent / "gitops")


def git(cwd: Path, *args: str) -> str:
    return status_git(cwd, *args).stdout.strip()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def text_of(page: str) -> str:
    """The page's main part as text, one line per element."""
    main = page[page.find("<main>"):]
    return html.unescape(re.sub(r"\s*\n\s*", "\n", re.sub(r"<[^>]+>", "\n", main))).strip()


def test_ui_shows_the_fleet_the_applies_a_refusal_and_a_branch_plan(tmp_path: Path):
    origin, work, workdir = tmp_path / "origin.git", tmp_path / "work", tmp_path / "controller"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    shutil.copytree(EXAMPLE_REPO, work)
    git(work, "init", "-q", "-b", "main")
    git(work, "remote", "add", "origin", str(origin))
    good = push(work, "the example")
    applied = reconcile(origin, workdir)
    assert applied.stdout.startswith("Applied: "), applied.stdout + applied.stderr
    (work / "clusters" / "team-a" / "lost.yaml").write_text(BAD_NODE)
    bad = push(work, "a typo")
    refused = reconcile(origin, workdir)
    assert refused.stdout.startswith("Refused: "), refused.stdout + refused.stderr
    # a pull request's branch: one worker host fewer for tenant-1 (its BareMetalHost labels change)
    git(work, "checkout", "-q", "-b", "fewer-workers", good)
    sip = work / "sip" / "tenant-1.yaml"
    sip.write_text(sip.read_text().replace("active: 2", "active: 1", 1))
    branch = push(work, "tenant-1: one worker", "fewer-workers")

    ui = subprocess.Popen([GITOPS, "ui", "--repo", str(origin), "--address", "127.0.0.1:0", "--refresh", "0",
                           "--status-signers", str(workdir / "status-signing-key.pub")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ui.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, line + ui.stderr.read()  # type: ignore[union-attr]
        base = found.group(0)

        code, page = get(base)
        assert code == 200
        fleet = text_of(page)
        assert "team-a\nProgressing\nv1.37.2\n0/3" in fleet and "team-b" in fleet, fleet
        assert "Refused" in fleet and good[:12] in fleet  # the commit in force stays the good one
        assert "hv-private-1\nUnknown\n0\n0 of 1,000" in fleet, fleet
        filtered = text_of(get(base + "?q=TEAM-B")[1])
        assert "team-b" in filtered and "team-a\n" not in filtered
        assert "No cluster matches." in text_of(get(base + "?phase=Ready")[1])

        cluster = text_of(get(base + "clusters/team-a")[1])
        assert "Cluster team-a\nProgressing" in cluster and "team-a-cp-1\ncontrolplane\nPending" in cluster, cluster
        assert get(base + "clusters/nope")[0] == 404

        applies = text_of(get(base + "applies")[1])
        assert f"Refused\n{bad[:12]}" in applies and f"Applied\n{good[:12]}" in applies, applies
        assert "clusters/team-a/lost.yaml:" in applies  # the refusal's errors, with file and line
        rows = re.findall(r'href="/applies/([0-9a-f]{40})"', get(base + "applies")[1])
        assert rows, applies
        last_apply = git(origin, "log", "-n1", "--format=%H", "gitops/status", "--", "status/apply.yaml")
        detail = text_of(get(base + f"applies/{last_apply}")[1])
        assert f"Applied\n{good[:12]}" in detail and "label-host" in detail and "Done" in detail, detail
        assert re.search(r"\n\d+\.\d s\n", detail), detail  # each action's time

        code, plan = get(base + "plan?ref=fewer-workers")
        assert code == 200
        shown = text_of(plan)
        assert f"branch fewer-workers at\n{branch[:12]}" in shown, shown
        assert "~ label host" in shown and "Cluster tenant-1" in shown, shown
        assert 'class="line change"' in plan
        code, missing = get(base + "plan?ref=nope")
        assert code == 404 and "no branch 'nope'" in text_of(missing)

        # pages asked at once (the server's threads share the mirror) all answer the same
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(lambda path: get(base + path), ["applies", "", "clusters/team-a"] * 6))
        assert all(code == 200 for code, _ in pages)
        assert len({re.sub(r"\d+[smhd] ago", "", text_of(body)) for _, body in pages[0::3]}) == 1  # (ages tick)

        for path in ("", "clusters/team-a", "clusters/team-b", "applies", "shards", "plan?ref=fewer-workers"):
            assert "PRIVATE KEY" not in get(base + path)[1], path  # no secret is ever rendered
    finally:
        ui.terminate()
        ui.wait(timeout=30)


def test_an_apply_pages_symbols_are_the_plans():
    """An apply's actions are shown with the plan's own `+ ~ -` of their kind (apply.yaml holds the kind)."""
    from gitops.plan.actions import KINDS
    from gitops.ui.views import apply_page, apply_row

    record = "status:\n  actions:\n" + "".join(f"  - {{index: {i}, kind: {k.value}, subject: c/n}}\n"
                                               for i, k in enumerate(KINDS, 1))
    now = dt.datetime.now(dt.timezone.utc)
    page = apply_page(apply_row("s" * 40, 0, "applied x", None, record.encode(), True, now), record.encode())
    assert [(a.kind, a.symbol) for a in page.actions] == [(k.value, info.symbol) for k, info in KINDS.items()]
    assert ("etcd-member-add", "+") in [(a.kind, a.symbol) for a in page.actions]  # (once shown as ~)


def test_sigterm_stops_the_ui_whichever_of_its_threads_receives_it(tmp_path: Path):
    """A signal sent to the process goes to any thread of it that does not block it; Python runs the handler in
    the main thread, which must not sleep in a wait only that signal could end. Sent here to a serving thread
    (tgkill): the UI stops within seconds, as with SIGTERM on the main thread."""
    import ctypes
    import os
    import signal
    import time

    origin, work = tmp_path / "origin.git", tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    shutil.copytree(EXAMPLE_REPO, work)
    git(work, "init", "-q", "-b", "main")
    git(work, "remote", "add", "origin", str(origin))
    push(work, "the example")
    ui = subprocess.Popen([GITOPS, "ui", "--repo", str(origin), "--address", "127.0.0.1:0", "--refresh", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ui.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, line + ui.stderr.read()  # type: ignore[union-attr]
        assert get(found.group(0) + "healthz")[0] == 200
        time.sleep(0.5)  # (the signal handler is set right after the line is printed)
        threads = sorted(int(t) for t in os.listdir(f"/proc/{ui.pid}/task") if int(t) != ui.pid)
        assert threads, "the UI serves from threads of its own"
        tgkill = {"x86_64": 234, "aarch64": 131}[os.uname().machine]  # (the syscall's number)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(tgkill, ui.pid, threads[0], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
        began = time.monotonic()
        ui.wait(timeout=20)
        assert time.monotonic() - began < 15 and ui.returncode == 0, ui.stderr.read()  # type: ignore[union-attr]
    finally:
        if ui.poll() is None:
            ui.kill()
            ui.wait()
