"""`gitops hypervisor init` warns when root's inotify instances leave room for few control planes."""
from __future__ import annotations

from pathlib import Path

from gitops.hypervisor.machine import INOTIFY_ADVISED, inotify_note, warn_inotify


def test_the_kernels_default_is_room_for_a_dozen_control_planes_and_says_how_to_raise_it() -> None:
    note = inotify_note(128)
    assert note is not None
    assert "fs.inotify.max_user_instances is 128" in note
    assert "room for about 13 control planes" in note
    assert f"sysctl -w fs.inotify.max_user_instances={INOTIFY_ADVISED}" in note


def test_a_raised_limit_says_nothing_and_a_tiny_one_leaves_no_room() -> None:
    assert inotify_note(INOTIFY_ADVISED) is None
    assert inotify_note(8192) is None
    assert "room for about 0 control planes" in (inotify_note(4) or "")


def test_the_warning_is_read_from_the_kernels_file_and_an_unreadable_one_is_silent(tmp_path: Path) -> None:
    said: list[str] = []
    limit = tmp_path / "max_user_instances"
    limit.write_text("256\n")
    warn_inotify(said.append, limit)
    assert len(said) == 1 and "is 256" in said[0] and "about 27 control planes" in said[0]
    said.clear()
    warn_inotify(said.append, tmp_path / "absent")
    limit.write_text("garbage")
    warn_inotify(said.append, limit)
    assert said == []
