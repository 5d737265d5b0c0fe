"""The image tests' build (scripts/build-image.sh), started as the session starts.

Building both images takes minutes of apt, pip and layer compression, mostly one core and the
network. Without pytest-xdist, `conftest.py` starts it right after collection when an `image` test is
selected, and puts the modules that run only Python first (they use the other core meanwhile), then
the image tests, then the other lab groups. Under xdist the image tests' group starts it, on its worker,
beside whatever the other worker runs. `tests/test_image.py` waits for it (`wait`), printing its steps as they come. Nothing is left but the layer cache
the script keeps (`~/.cache/gitops/image-build`): the build runs in its own process group and temp directory, both
gone at the end of the module that used it or of the session.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("buildah", "mmdebstrap", "unshare", "age-keygen")


class Build:
    """One run of scripts/build-image.sh into `dir/images`, its output in `dir/build.log`."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gitops-image-build-", dir="/tmp"))
        self.images = self.dir / "images"
        self.log = self.dir / "build.log"
        (self.dir / "tmp").mkdir()  # the script's own temp dir goes here: stop() removes it
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(["bash", str(ROOT / "scripts/build-image.sh"), str(self.images), "local"],
                                         cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "TMPDIR": str(self.dir / "tmp")})

    def wait(self, say: Callable[[str], None]) -> dict:
        """build.json once the build ended (an AssertionError with its last lines if it failed); its
        `build-image:` and `STEP` lines passed to `say` as they come."""
        shown = 0
        while True:
            ended = self.proc.poll() is not None
            lines = self.log.read_text(errors="replace").split("\n")
            complete = lines if ended else lines[:-1]  # (the last one may still be written)
            for line in complete[shown:]:
                if line.startswith("build-image:") or "STEP" in line:
                    say(line.rstrip())
            shown = max(shown, len(complete))
            if ended:
                break
            time.sleep(1)
        assert self.proc.returncode == 0, "\n".join(lines[-60:])
        return json.loads((self.images / "build.json").read_text())

    def stop(self) -> None:
        """Kill the build if it still runs (its whole process group: buildah, unshare) and remove its files."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_CURRENT: list[Build] = []


def can_build() -> bool:
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in TOOLS)


def start() -> Build:
    """The session's build, started now if it has not been. It runs in a session of its own (so that
    `stop` can kill all of it), which a signal to pytest's process group does not reach: a SIGTERM or
    SIGHUP then interrupts pytest as Ctrl-C does, and the session's end stops the build."""
    if not _CURRENT:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _interrupt)
        _CURRENT.append(Build())
    return _CURRENT[0]


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop() -> None:
    while _CURRENT:
        _CURRENT.pop().stop()

