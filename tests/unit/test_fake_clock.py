"""FakeClock: time moves only when told, and sleepers wake in deadline order."""

from __future__ import annotations

import asyncio

from turnkit.testing import FakeClock


async def test_sleepers_wake_when_the_clock_passes_their_deadline() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(nap("long", 10)), asyncio.create_task(nap("short", 1))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == ["short"]
    clock.advance(9)
    await asyncio.gather(*tasks)
    assert woke == ["short", "long"]


async def test_autojump_moves_time_by_itself() -> None:
    clock = FakeClock(autojump=True)
    before = clock.monotonic()
    await clock.sleep(30)
    assert clock.monotonic() - before == 30
