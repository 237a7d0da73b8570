"""Races many tabs produce on one session, over a real uvicorn server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from tests.support.server import serve

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallDelta, Usage
from turnkit.quickstart import create_app

API = "/api/harness"


class RuleModel:
    """`pay …` asks to pay Ada (then says Paid.); anything else says one word and hangs."""

    model = "rule"
    provider = "test"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        messages = list(request.messages)
        last = max(i for i, m in enumerate(messages) if m.role == "user")
        text = str(messages[last].content)
        paid = any(m.role == "tool" for m in messages[last + 1 :])
        if text.startswith("pay") and not paid:
            yield ToolCallDelta(index=0, tool_call_id="c1", name="pay", arguments='{"to": "Ada"}')
            yield Finish("tool_use", Usage(input_tokens=3, output_tokens=3))
            return
        yield TextDelta("Working")
        if not paid:
            await asyncio.Event().wait()  # until the turn is stopped (or its session deleted)
        yield Finish("end_turn", Usage(input_tokens=3, output_tokens=1))


@tool(approval="always")
async def pay(to: str) -> str:
    """Pay someone."""
    return f"paid {to}"


def _app(tmp_path: Path) -> object:
    runtime = SessionRuntime(
        agent=Agent(model=RuleModel(), tools=[pay]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'races.db'}"),
    )
    return create_app(runtime, keepalive_s=0.5)


@pytest.mark.parametrize("content", ["hang", "pay Ada"])
async def test_deleting_a_session_ends_its_open_stream_cleanly(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream of a turn whose session goes ends with a comment, not a cut connection."""
    until = "approval.requested" if content.startswith("pay") else "message.delta"
    with serve(_app(tmp_path)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            async with http.stream(
                "POST", f"{API}/sessions/s1/execute", json={"content": content}
            ) as response:
                assert response.status_code == 200
                turn_id = response.headers["x-turn-id"]
                seen, lines = "", response.aiter_lines()
                async with asyncio.timeout(10):
                    while f'"type":"{until}"' not in seen:
                        seen = await anext(lines)
                deleted = await http.delete(f"{API}/sessions/s1")
                assert deleted.status_code == 204
                async with asyncio.timeout(10):
                    rest = [line async for line in lines]  # a cut connection raises here
            assert not any('"type":"done"' in line for line in rest)
            assert ": the turn is gone: its session was deleted" in rest
            assert not any(line.startswith("retry:") for line in rest)  # nothing to resume
            gone = await http.get(f"{API}/turns/{turn_id}/stream")
            assert gone.status_code == 404
            assert gone.json()["code"] == "turn-not-found"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_two_stops_a_moment_apart_close_the_model_call(tmp_path: Path) -> None:
    """Two tabs press Stop a few loop turns apart: the second never cuts the first short.

    A second cancellation that landed while the driver was stopping its graph left the
    graph's step running: the model's stream was never closed (a real provider's answer
    went on, billed) and its task was only found by the garbage collector.
    """
    open_streams: set[object] = set()

    class Hang:
        model = "hang"
        provider = "test"

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
            me = object()
            open_streams.add(me)
            try:
                yield TextDelta("Working")
                await asyncio.Event().wait()
            finally:
                open_streams.discard(me)
            yield Finish("end_turn", Usage(input_tokens=1, output_tokens=1))  # pragma: no cover

    runtime = SessionRuntime(
        agent=Agent(model=Hang()),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'stops.db'}"),
    )
    left_open: list[int] = []  # how many loop turns apart the Stops were, when they did
    statuses: set[str] = set()
    async with runtime:
        for apart in range(12):  # event-loop turns between the two Stops
            submission = await runtime.start(f"s{apart}", "hang")
            async with asyncio.timeout(10):
                while not open_streams:
                    await asyncio.sleep(0.005)
            first = asyncio.create_task(runtime.cancel(submission.turn_id))
            for _ in range(apart):
                await asyncio.sleep(0)
            second = asyncio.create_task(runtime.cancel(submission.turn_id))
            async with asyncio.timeout(10):
                assert await asyncio.gather(first, second) == ["cancelled", "cancelled"]
            for _ in range(50):  # a Stop has closed the call once it returns; allow a moment
                if not open_streams:
                    break
                await asyncio.sleep(0.01)
            if open_streams:
                left_open.append(apart)
                open_streams.clear()
            statuses.add((await runtime.turn(submission.turn_id)).status)
    assert left_open == []
    assert statuses == {"cancelled"}
