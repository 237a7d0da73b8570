from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta

__all__ = ("FakeClock",)


class FakeClock:
    """A `Clock` whose time moves only when a test says so.

    `advance(s)` moves time forward and wakes every `sleep` whose deadline it passed, so
    code that waits for leases, heartbeats or deadlines runs deterministically and never
    really sleeps. With `autojump=True`, a `sleep` moves time forward by itself instead
    (handy for code that only sleeps to back off).
    """

    def __init__(self, start: datetime | None = None, *, autojump: bool = False) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0
        self.autojump = autojump
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> datetime:
        """The fake wall time."""
        return self._now

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward and wake the sleepers that are due."""
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)

    @property
    def sleepers(self) -> int:
        """How many tasks are waiting on this clock."""
        return sum(1 for _, _, w in self._sleepers if not w.done())

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has advanced by `seconds` (or advance it, with autojump)."""
        if seconds <= 0 or self.autojump:
            self.advance(max(seconds, 0.0))
            await asyncio.sleep(0)  # noqa: TID251 - the fake clock's one real yield
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._order), waiter))
        await waiter
