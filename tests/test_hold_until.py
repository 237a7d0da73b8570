"""A detached turn held until its stream has written `turn.started` (`start(hold_until=…)`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

import turnkit.runtime.driver as driver_module
from tests.conftest import RuntimeFactory
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.events import DoneEvent, StreamEvent
from turnkit.http import create_turnkit_router
from turnkit.ids import TurnId
from turnkit.models import ModelRequest
from turnkit.protocols.agui import create_agui_router
from turnkit.protocols.ai_sdk import create_ai_sdk_router
from turnkit.runtime._runner import TurnRunner
from turnkit.runtime.reader import set_once_sent
from turnkit.testing import ModelStep, ScriptedModel


async def _events(runtime: SessionRuntime, turn_id: TurnId) -> list[StreamEvent]:
    async with asyncio.timeout(10):
        return [event async for event in runtime.reader().events(turn_id)]


async def test_a_held_turn_takes_no_step_until_its_event_is_set(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    runtime = runtime_factory(Agent(model=model))
    written = asyncio.Event()
    submission = await runtime.start("s1", "hi", hold_until=written)
    for _ in range(20):  # a turn that is not held is over long before this
        await asyncio.sleep(0.01)
    assert model.calls == []
    assert (await runtime.turn(submission.turn_id)).last_seq == 1  # `turn.started` only
    written.set()
    events = await _events(runtime, submission.turn_id)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert len(model.calls) == 1


async def test_a_held_turn_runs_anyway_once_the_hold_has_lasted_its_longest(
    runtime_factory: RuntimeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that never wrote (its client gone at once) does not strand the turn."""
    monkeypatch.setattr(driver_module, "HOLD_MAX_S", 0.05)
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    runtime = runtime_factory(Agent(model=model))
    submission = await runtime.start("s1", "hi", hold_until=asyncio.Event())
    events = await _events(runtime, submission.turn_id)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


async def test_the_hold_is_shorter_than_a_third_of_the_lease(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    config = RuntimeConfig(database_url=database_url, lease_ttl_s=0.3)
    runtime = runtime_factory(Agent(model=model), config=config)
    submission = await runtime.start("s1", "hi", hold_until=asyncio.Event())
    loop = asyncio.get_running_loop()
    began = loop.time()
    events = await _events(runtime, submission.turn_id)
    assert events[-1].type == "done"
    assert loop.time() - began < driver_module.HOLD_MAX_S  # 0.1 s, not a whole second


async def test_the_lease_is_renewed_through_the_hold_and_a_slow_setup(
    runtime_factory: RuntimeFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held for a third of its TTL, then set up for a whole TTL: the lease never lapses."""
    setup = TurnRunner._setup

    async def slow_setup(self: TurnRunner, *args: Any) -> Any:
        await asyncio.sleep(0.6)  # the app's deps factory, say
        return await setup(self, *args)

    monkeypatch.setattr(TurnRunner, "_setup", slow_setup)
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    config = RuntimeConfig(database_url=database_url, lease_ttl_s=0.6)
    runtime = runtime_factory(Agent(model=model), config=config)
    submission = await runtime.start("s1", "hi", hold_until=asyncio.Event())
    lapsed: list[float] = []
    for _ in range(200):  # every 20 ms until the turn ends (a lapse would last 0.4 s)
        record = await runtime.turn(submission.turn_id)
        if record.status != "running":
            break
        expires = record.lease_expires_at
        if expires is not None and expires < runtime.clock.now():
            lapsed.append((runtime.clock.now() - expires).total_seconds())
        await asyncio.sleep(0.02)
    assert record.status == "succeeded"
    assert lapsed == []


async def test_stop_during_the_hold_ends_the_turn_cancelled(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    runtime = runtime_factory(Agent(model=model))
    submission = await runtime.start("s1", "hi", hold_until=asyncio.Event())
    await asyncio.sleep(0.05)
    assert await runtime.cancel(submission.turn_id) == "cancelled"
    events = await _events(runtime, submission.turn_id)
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "cancelled"
    assert model.calls == []


ROUTES = {
    "execute": (
        create_turnkit_router,
        "/api/harness/sessions/s1/execute",
        {"content": "hi"},
        '"type":"turn.started"',
        '"status":"succeeded"',
    ),
    "ag-ui": (
        create_agui_router,
        "/api/agui/run",
        {
            "threadId": "s1",
            "runId": "r1",
            "messages": [{"id": "u1", "role": "user", "content": "hi"}],
        },
        '"type":"RUN_STARTED"',
        '"type":"RUN_FINISHED"',
    ),
    "ai-sdk": (
        create_ai_sdk_router,
        "/api/chat",
        {
            "id": "s1",
            "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        },
        '"type":"start"',
        '"type":"finish"',
    ),
}


async def test_closing_a_stream_that_sets_its_event_closes_the_stream_under_it() -> None:
    closed = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            for i in range(10):
                yield b"%d" % i
        finally:
            closed.set()

    sent = asyncio.Event()
    outer = set_once_sent(chunks(), sent)
    assert await anext(outer) == b"0"
    assert not sent.is_set()  # the first chunk was handed out, not yet written
    assert await anext(outer) == b"1"
    assert sent.is_set()
    await outer.aclose()  # as sse-starlette does when a write fails
    assert closed.is_set()


@pytest.mark.parametrize("route", sorted(ROUTES))
async def test_a_streaming_route_runs_its_turn_once_the_opening_is_written(
    route: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each front end's route holds the turn it starts until its stream's opening is out."""
    make_router, path, body, opening, closing = ROUTES[route]
    holds: list[asyncio.Event | None] = []
    released_at_call: list[bool] = []

    def reply(request: ModelRequest) -> ModelStep:
        hold = holds[-1]
        released_at_call.append(hold is not None and hold.is_set())
        return ModelStep.text_reply("Hello from the route.")

    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.respond(reply)])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'http.db'}"),
    )
    await runtime.open()
    start = runtime.start

    async def recording_start(*args: Any, **kwargs: Any) -> Any:
        holds.append(kwargs.get("hold_until"))
        return await start(*args, **kwargs)

    monkeypatch.setattr(runtime, "start", recording_start)
    app = FastAPI()
    app.include_router(make_router(runtime))
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            asyncio.timeout(10),
            httpx.AsyncClient(transport=transport, base_url="http://test") as http,
        ):
            response = await http.post(path, json=body)
    finally:
        await runtime.close()
    assert response.status_code == 200, response.text
    data = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert opening in data[0]
    assert any(closing in line for line in data[-2:])
    assert released_at_call == [True]
