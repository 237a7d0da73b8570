from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

__all__ = ("FakeClock",)


class FakeClock:
    """A `Clock` that only moves when told to (`advance`), or when someone sleeps on it.

    `sleep(s)` advances the clock by `s` and yields to the loop once, so code that waits
    for leases, heartbeats or deadlines runs instantly and deterministically in tests.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0

    def now(self) -> datetime:
        """The fake wall time."""
        return self._now

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward."""
        self._now += timedelta(seconds=seconds)
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance by `seconds`, then let other tasks run once."""
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)  # noqa: TID251 - the fake clock's one real yield
