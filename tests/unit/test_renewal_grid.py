"""Drivers renew on a grid they share, never further apart than a third of the ttl."""

from __future__ import annotations

import random

from turnkit.runtime.driver import renewal_due


def test_renewals_are_less_than_an_interval_apart_and_not_much_less() -> None:
    rng = random.Random(7)
    interval = 8 / 3
    for _ in range(2000):
        last = rng.uniform(0, 100_000)
        gap = renewal_due(last, interval) - last
        assert interval * 3 / 4 - 1e-9 <= gap < interval


def test_drivers_whose_renewals_fall_in_one_tick_renew_at_the_same_instant() -> None:
    interval = 3.0
    dues = {renewal_due(last, interval) for last in (9.8, 10.0, 10.2, 10.5)}
    assert dues == {12.75}
    assert renewal_due(10.51, interval) == 13.5  # the next tick
