"""`TurnSlots`: a bound on running turns, with fair waiting and nothing leaked."""

from __future__ import annotations

import asyncio

import pytest

from turnkit.runtime._slots import TurnSlots


async def test_a_bound_lets_waiters_in_in_arrival_order() -> None:
    slots = TurnSlots(2)
    first, second = slots.try_take(), slots.try_take()
    assert first is not None
    assert second is not None
    assert slots.try_take() is None
    order: list[str] = []

    async def wait(name: str) -> None:
        slot = await slots.take()
        order.append(name)
        slot.release()

    waiters = [asyncio.create_task(wait(n)) for n in ("a", "b", "c")]
    await asyncio.sleep(0)
    assert slots.waiting == 3
    assert slots.try_take() is None  # nobody jumps the queue
    first.release()
    first.release()  # releasing twice gives back one slot
    await asyncio.gather(*waiters)
    assert order == ["a", "b", "c"]
    assert slots.running == 1
    second.release()
    assert slots.running == 0


async def test_a_cancelled_waiter_keeps_no_slot() -> None:
    slots = TurnSlots(1)
    held = slots.try_take()
    assert held is not None
    gone = asyncio.create_task(slots.take())
    kept = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    gone.cancel()
    held.release()
    slot = await kept
    assert gone.cancelled()
    assert slots.running == 1
    slot.release()
    assert slots.running == 0


async def test_a_turn_claimed_elsewhere_is_counted_but_never_refused() -> None:
    slots = TurnSlots(1)
    taken, extra = await slots.take(), slots.hold()
    assert slots.running == 2
    assert slots.try_take() is None
    taken.release()
    assert slots.try_take() is None  # still one over the bound
    extra.release()
    assert slots.try_take() is not None


def test_without_a_bound_every_take_succeeds() -> None:
    slots = TurnSlots(None)
    assert all(slots.try_take() is not None for _ in range(10_000))


def test_a_bound_of_nothing_is_refused() -> None:
    from turnkit import RuntimeConfig
    from turnkit.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_running_turns"):
        RuntimeConfig(max_running_turns=0)
