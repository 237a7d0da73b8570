"""Test helpers: a deterministic scripted model and event collection.

`ScriptedModel` is the default fake for unit tests and runs the offline demo; it never
touches the network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

from turnkit.testing._clock import FakeClock
from turnkit.testing._scripted import ModelStep, ScriptedModel, UnexpectedModelCall, call, raw_call

__all__ = (
    "FakeClock",
    "ModelStep",
    "ScriptedModel",
    "UnexpectedModelCall",
    "call",
    "collect_events",
    "raw_call",
)


E = TypeVar("E")


async def collect_events(stream: AsyncIterator[E], *, limit: int = 10_000) -> list[E]:
    """Drain an event stream into a list (at most `limit` events, then fail)."""
    events: list[E] = []
    async for event in stream:
        events.append(event)
        if len(events) > limit:
            raise AssertionError(f"the stream produced more than {limit} events")
    return events
