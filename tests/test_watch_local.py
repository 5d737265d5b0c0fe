"""`gitops watch` on a local working copy when the kernel gives it no inotify instance: it says so and
polls the refs, and a commit still reconciles within seconds. Real inotify, real git, real limits: the
helper runs as another user (nobody, keeping root's file access), spends every inotify instance that user
may have (fs.inotify.max_user_instances) and runs the watch beside them; root's own count is untouched, so
nothing else running on the machine is starved. No lab."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

HELPER = textwrap.dedent('''
    import ctypes, logging, subprocess, sys, threading, time
    from pathlib import Path
    from gitops.cli.controller import _watch_local

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    held = []
    while (fd := libc.inotify_init1(0)) >= 0:
        held.append(fd)
    print("held", len(held), flush=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    work = Path(sys.argv[1])
    trigger, stop = threading.Event(), threading.Event()
    threading.Thread(target=_watch_local, args=(work, trigger, stop), daemon=True).start()
    time.sleep(2)
    trigger.clear()
    (work / "README.md").write_text("edited\\n")
    subprocess.run(["git", "-C", str(work), "commit", "-qam", "edit"], check=True)
    began = time.monotonic()
    print("fired" if trigger.wait(10) else "not fired", round(time.monotonic() - began, 1), flush=True)
    stop.set()
''')


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a helper as another user")
def test_a_watch_without_inotify_instances_polls_the_refs_and_sees_a_commit() -> None:
    home = Path(tempfile.mkdtemp(prefix="gitops-watch-"))  # not under pytest's tmp (root's, mode 0700): git as
    try:                                                  # another user will not look inside it
        home.chmod(0o755)
        _run_watch(home)
    finally:
        shutil.rmtree(home)


def _run_watch(home: Path) -> None:
    work = home / "work"
    work.mkdir()
    git = ["git", "-C", str(work)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "config", "user.name", "t"], check=True)  # for the helper's commit too
    subprocess.run([*git, "config", "user.email", "t@example.org"], check=True)
    (work / "README.md").write_text("first\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    subprocess.run(["chown", "-R", "65534:65534", str(work)], check=True)
    caps = "+dac_override,+dac_read_search"
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps={caps}",
         f"--ambient-caps={caps}", sys.executable, "-c", HELPER, str(work)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[1])})
    out = done.stdout
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "held " in out and int(out.split("held ")[1].split()[0]) > 0, out
    assert "WARNING cannot watch the working copy with inotify; polling its refs instead" in out, out
    assert "fired" in out.split("\n")[-2] and "not fired" not in out, out
