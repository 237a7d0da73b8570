"""`ProgressStamps`: at most one activity stamp per turn in a tenth of its idle window.

A progress report from outside a turn's driver stamps the turn's row (so the driver's idle
window restarts). A reporter that reports many times a second would write the row as
often; the driver only needs to know the turn was heard from within its window. So a
process stamps a turn again only once a tenth of the window has passed since it last did:
a turn then ends at most that much before a full window after its last report.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from turnkit.clock import Clock
from turnkit.ids import TurnId

__all__ = ("ProgressStamps",)

_KEPT: Final = 4096
"""Turns whose last stamp is remembered; forgetting one costs at most one more write."""


class ProgressStamps:
    """When this process last stamped each turn, to skip stamps the driver cannot tell apart."""

    __slots__ = ("_clock", "_every_s", "_last")

    def __init__(self, clock: Clock, idle_window_s: float) -> None:
        self._clock = clock
        self._every_s = idle_window_s / 10
        self._last: OrderedDict[TurnId, float] = OrderedDict()

    def due(self, turn_id: TurnId) -> bool:
        """Whether a report for `turn_id` should stamp its row now."""
        last = self._last.get(turn_id)
        return last is None or self._clock.monotonic() - last >= self._every_s

    def stamped(self, turn_id: TurnId) -> None:
        """The row of `turn_id` was stamped just now."""
        self._last[turn_id] = self._clock.monotonic()
        self._last.move_to_end(turn_id)
        while len(self._last) > _KEPT:
            self._last.popitem(last=False)
