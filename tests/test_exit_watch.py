"""The exit watch's backoff (gitops.observe.exits, issue #44.4): a component that exits wakes the controller at
once the first time; each further exit within 10 minutes waits twice as long (10 s, 20 s, ... 5 min); ten
quiet minutes start over. Pure: times are given."""
from __future__ import annotations

from gitops.observe.exits import FIRST_BACKOFF, MAX_BACKOFF, RESET_AFTER, Backoff


def test_the_first_exit_wakes_at_once_and_repeated_ones_back_off_up_to_five_minutes() -> None:
    backoff = Backoff()
    now, waits = 1000.0, []
    for _ in range(8):
        wait = backoff.wait(now)
        waits.append(wait)
        now += wait  # it wakes the controller then, and the component exits again right away
        backoff.exits.append(now)
    assert waits == [0.0, FIRST_BACKOFF, 20.0, 40.0, 80.0, 160.0, MAX_BACKOFF, MAX_BACKOFF]
    assert backoff.wait(now + 1) == MAX_BACKOFF - 1  # counted from the last exit
    assert backoff.wait(now + RESET_AFTER) == 0.0  # ten quiet minutes: at once again
    assert backoff.exits == []
