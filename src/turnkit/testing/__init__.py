"""Test helpers: deterministic fake models and event collection.

`ScriptedModel` is the default fake for unit tests and runs the offline demo; `TestModel`
calls an agent's tools with arguments made from their schemas and answers, with no
script. Neither touches the network.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from turnkit.testing._clock import FakeClock
from turnkit.testing._scripted import ModelStep, ScriptedModel, UnexpectedModelCall, call, raw_call
from turnkit.testing._test_model import TestModel

__all__ = (
    "FakeClock",
    "ModelStep",
    "ScriptedModel",
    "TestModel",
    "UnexpectedModelCall",
    "call",
    "collect_events",
    "raw_call",
)


E = TypeVar("E")


async def collect_events(
    stream: AsyncIterator[E], *, limit: int = 10_000, timeout_s: float | None = 60.0
) -> list[E]:
    """Drain an event stream into a list: at most `limit` events, within `timeout_s` seconds.

    Past either it fails (`AssertionError`, saying how far the stream got) instead of
    hanging the test; `timeout_s=None` waits as long as the stream runs. The stream is
    closed either way (for `execute_message`: a turn still running is stopped).
    """
    events: list[E] = []
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            async for event in stream:
                events.append(event)
                if len(events) > limit:
                    raise AssertionError(f"the stream produced more than {limit} events")
    except TimeoutError:
        if not deadline.expired():
            raise  # the stream's own
        last = getattr(events[-1], "type", type(events[-1]).__name__) if events else None
        raise AssertionError(
            f"the stream did not end within {timeout_s} s: {len(events)} event(s) so far"
            + (f", the last {last!r}" if last else "")
        ) from None
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    return events
