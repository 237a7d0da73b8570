"""Idle protocol streams, read by an SSE client on a real server past the keep-alive interval.

While the model holds (half a message written, then nothing), the AG-UI and AI SDK streams
send only `: keep-alive` comment lines. An SSE client (httpx-sse, which turns a comment
followed by a blank line into an empty event) must dispatch nothing for them: every event
it sees is JSON, and the last one is still the text written before the pause.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.protocols import test_agui, test_ai_sdk
from tests.support.server import serve
from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel

pytestmark = pytest.mark.slow

KEEPALIVE_S = 0.2
IDLE_S = 1.5  # several keep-alive intervals with nothing else to send


async def _listen(url: str, body: dict[str, Any]) -> tuple[list[str], str]:
    """The data of every event the client dispatched within `IDLE_S`, and the turn id."""
    dispatched: list[str] = []
    turn_id = ""
    async with httpx.AsyncClient(timeout=10) as http:

        async def listen() -> None:
            nonlocal turn_id
            async with aconnect_sse(http, "POST", url, json=body) as source:
                turn_id = source.response.headers["x-turn-id"]
                async for sse in source.aiter_sse():
                    dispatched.append(sse.data)

        with pytest.raises(TimeoutError):  # the model holds: the stream stays open
            await asyncio.wait_for(listen(), timeout=IDLE_S)
    return dispatched, turn_id


async def test_an_idle_agui_stream_dispatches_no_event(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.hang("Thinking")])
    app = test_agui.build_app(tmp_path, [Agent(model=model)], keepalive_s=KEEPALIVE_S)
    with serve(app) as url:
        dispatched, turn_id = await _listen(
            f"{url}/api/agui/run", test_agui.run_input("t1", "r1", "go")
        )
        async with httpx.AsyncClient(base_url=url) as http:
            await http.post(f"/api/harness/turns/{turn_id}/cancel")
    events = [json.loads(data) for data in dispatched]  # an empty event would fail here
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1] == {**events[-1], "type": "TEXT_MESSAGE_CONTENT", "delta": "Thinking"}


async def test_an_idle_ai_sdk_stream_dispatches_no_event(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.hang("Thinking")])
    app = test_ai_sdk.build_app(tmp_path, model, tools=(), keepalive_s=KEEPALIVE_S)
    with serve(app) as url:
        dispatched, _ = await _listen(
            f"{url}/api/chat", {"id": "c1", "messages": [test_ai_sdk.user("go")]}
        )  # closing the app cancels the held turn
    chunks = [json.loads(data) for data in dispatched]  # an empty event would fail here
    assert chunks[0]["type"] == "start"
    assert chunks[-1] == {**chunks[-1], "type": "text-delta", "delta": "Thinking"}
