"""Time as an injected dependency: the runtime reads time only through a `Clock`."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol

__all__ = ("Clock", "SystemClock")


class Clock(Protocol):
    """Where the runtime gets wall time, monotonic time and sleeps."""

    def now(self) -> datetime:
        """Current UTC wall time, timezone-aware."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait for `seconds`."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """Current UTC wall time."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep(seconds)`."""
        await asyncio.sleep(seconds)
