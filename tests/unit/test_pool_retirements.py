"""A pool's connections are retired for read-only refusals at most once an interval."""

from __future__ import annotations

from turnkit.store.sql import RETIRE_INTERVAL_S, Retirements


def test_the_first_refusal_retires_at_once_and_later_ones_once_an_interval() -> None:
    now = [100.0]
    retire = Retirements(lambda: now[0])
    assert not retire.due()  # nothing refused: nothing to retire
    assert retire.refused()  # a failover's first refusal: at once
    assert not any(retire.refused() for _ in range(50))  # within the interval: held back
    assert not retire.due()
    now[0] += RETIRE_INTERVAL_S
    assert retire.due()  # the held-back refusals retire the pool once the interval ends
    assert not retire.due()  # once
    now[0] += RETIRE_INTERVAL_S
    assert not retire.due()  # nothing refused since
    assert retire.refused()  # a refusal after the interval: at once


def test_refusals_far_apart_each_retire_at_once() -> None:
    now = [0.0]
    retire = Retirements(lambda: now[0], interval_s=2.0)
    for _ in range(3):
        assert retire.refused()
        now[0] += 2.0
