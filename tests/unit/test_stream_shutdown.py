"""`until_shutdown`: a stream's last words when its server shuts down, and only then."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from turnkit.protocols._ai_sdk_stream import DONE_LINE, line
from turnkit.protocols.ai_sdk import _farewell
from turnkit.runtime.stream_shutdown import until_shutdown


async def _items(*items: str, then_wait: asyncio.Event | None = None) -> AsyncIterator[str]:
    for item in items:
        yield item
    if then_wait is not None:
        await then_wait.wait()  # a turn waiting for its model


def _bye(last: str | None) -> list[str]:
    return [f"bye after {last}"]


async def _read(stream: AsyncIterator[str], into: list[str]) -> None:
    async for item in stream:
        into.append(item)


async def test_a_stream_waiting_for_its_turn_says_goodbye_at_once() -> None:
    shutdown, never = anyio.Event(), asyncio.Event()
    got: list[str] = []
    reading = asyncio.create_task(
        _read(until_shutdown(_items("a", "b", then_wait=never), shutdown, _bye), got)
    )
    await asyncio.sleep(0.05)
    shutdown.set()
    async with asyncio.timeout(5):
        await reading
    assert got == ["a", "b", "bye after b"]
    assert not reading.cancelled()


async def test_a_stream_that_ended_adds_nothing() -> None:
    shutdown = anyio.Event()
    got: list[str] = []
    await _read(until_shutdown(_items("a", "b"), shutdown, _bye), got)
    shutdown.set()
    assert got == ["a", "b"]


async def test_a_cancellation_of_its_own_is_not_taken_for_the_shutdown() -> None:
    shutdown, never = anyio.Event(), asyncio.Event()
    got: list[str] = []
    reading = asyncio.create_task(
        _read(until_shutdown(_items("a", then_wait=never), shutdown, _bye), got)
    )
    await asyncio.sleep(0.05)
    reading.cancel()  # the client went away, and the server stops in the same instant
    shutdown.set()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await reading
    assert got == ["a"]


def test_an_ai_sdk_stream_whose_finish_went_out_says_no_error() -> None:
    finish = line({"type": "finish", "messageMetadata": {"status": "succeeded"}})
    assert _farewell(DONE_LINE) == ()
    assert _farewell(finish) == (DONE_LINE,)
    [error] = _farewell(line({"type": "text-delta", "id": "t", "delta": "half"}))
    assert b'"type":"error"' in error
    assert b"server-shutting-down" in error
    assert error.endswith(DONE_LINE)
    assert _farewell(None) == _farewell(line({"type": "start"}))
