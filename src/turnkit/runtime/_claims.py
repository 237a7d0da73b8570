"""Claims under way in this process, so that a Stop can wait for them to land."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from turnkit.store import Lease

__all__ = ("ClaimsInFlight",)


class ClaimsInFlight:
    """Counts a claim as under way until it lands; a Stop waits for all of them.

    The claimer registers the turn it claimed before it awaits anything else, so a Stop
    woken as the claim lands finds that turn's driver here.
    """

    def __init__(self) -> None:
        self._landing: set[asyncio.Future[None]] = set()

    async def claim(self, claim: Awaitable[Lease | None]) -> Lease | None:
        """`claim`, counted as under way until it lands (however it ends)."""
        landed = asyncio.get_running_loop().create_future()
        self._landing.add(landed)
        try:
            return await claim
        finally:
            self._landing.discard(landed)
            landed.set_result(None)

    async def landed(self) -> None:
        """Wait until the claims under way now have landed (a cancelled wait cuts none)."""
        await asyncio.gather(*(asyncio.shield(landing) for landing in list(self._landing)))
