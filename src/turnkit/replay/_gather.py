"""Let a producer that is still streaming add a little more before a batch is taken."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

__all__ = ("gather",)

GATHER_ROUNDS: Final = 8
"""At most this many loop iterations…"""
GATHER_S: Final = 0.002
"""…and at most this long (an iteration is long when many turns share the loop)."""


async def gather(size: Callable[[], int]) -> None:
    """Yield to the event loop while `size()` keeps growing, within the bounds above.

    A model that suspends once per chunk sends one event per loop iteration: waiting a
    few iterations lets one write (or one round trip) carry several. Something that
    arrives alone waits one iteration.
    """
    deadline = time.monotonic() + GATHER_S
    for _ in range(GATHER_ROUNDS):
        before = size()
        await asyncio.sleep(0)  # noqa: TID251 - one loop iteration, not a timed wait
        if size() == before or time.monotonic() >= deadline:
            return
