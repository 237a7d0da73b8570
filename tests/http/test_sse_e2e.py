"""End to end over a real uvicorn server and an SSE client: reconnects, detached turns, Stop."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse
from tests.conftest import REDIS_URL, require_service
from tests.support.server import serve

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, Usage
from turnkit.quickstart import create_app
from turnkit.replay import ReplayBuffer
from turnkit.replay.memory import InMemoryReplayBuffer

API = "/api/harness"
ANSWER = [f"word{i} " for i in range(12)]


class SlowModel:
    """Streams the answer a word every 10 ms (or hangs, for the Stop test)."""

    model = "slow"
    provider = "test"

    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for word in ANSWER:
            await asyncio.sleep(0.01)
            yield TextDelta(word)
            if self.hang:
                await asyncio.Event().wait()
        yield Finish("end_turn", Usage(input_tokens=5, output_tokens=12))


@pytest.fixture(params=["memory", "redis"])
def replay(request: pytest.FixtureRequest) -> Iterator[ReplayBuffer]:
    if request.param == "memory":
        yield InMemoryReplayBuffer()
        return
    require_service("Redis", "127.0.0.1", 6379)
    from turnkit.replay.redis import RedisReplayBuffer

    yield RedisReplayBuffer.from_url(REDIS_URL, prefix=f"tk-e2e-{uuid.uuid4().hex[:8]}")


@contextmanager
def _server(tmp_path: Path, replay: ReplayBuffer, *, hang: bool = False) -> Iterator[str]:
    runtime = SessionRuntime(
        agent=Agent(model=SlowModel(hang=hang)),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'e2e.db'}"),
        replay=replay,
    )
    with serve(create_app(runtime)) as url:
        yield url


@pytest.fixture
def base_url(tmp_path: Path, replay: ReplayBuffer) -> Iterator[str]:
    with _server(tmp_path, replay) as url:
        yield url


async def _read(
    http: httpx.AsyncClient, method: str, url: str, *, stop_after: int | None = None, **kw: object
) -> tuple[str, list[dict[str, object]]]:
    """Durable events received (up to `stop_after` of them), and the turn id header."""
    got: list[dict[str, object]] = []
    async with aconnect_sse(http, method, url, **kw) as source:  # type: ignore[arg-type]
        source.response.raise_for_status()
        turn_id = source.response.headers["x-turn-id"]
        async for sse in source.aiter_sse():
            event = json.loads(sse.data)
            if "seq" in event:  # durable (SSE ids are sticky, so test the event itself)
                assert sse.id == str(event["seq"])
                got.append(event)
            if stop_after is not None and len(got) >= stop_after:
                break
            if event["type"] == "done":
                break
    return turn_id, got


async def test_every_reconnect_point_yields_the_log_exactly_once(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        # A first full turn tells us how many durable events a turn has.
        turn_id, full = await _read(
            http, "POST", f"{API}/sessions/probe/execute", json={"content": "go"}
        )
        total = len(full)
        assert full[-1]["type"] == "done"
        for k in range(1, total):
            session = f"k{k}"
            turn_id, first = await _read(
                http, "POST", f"{API}/sessions/{session}/execute",
                json={"content": "go"}, stop_after=k,
            )  # fmt: skip
            assert len(first) == k
            _, rest = await _read(
                http, "GET", f"{API}/turns/{turn_id}/stream",
                headers={"Last-Event-ID": str(first[-1]["seq"])},
            )  # fmt: skip
            union = first + rest
            assert [e["seq"] for e in union] == list(range(1, len(union) + 1)), k
            assert union[-1]["type"] == "done"
            history = (await http.get(f"{API}/sessions/{session}/history")).json()
            committed = [turn for turn in history if turn["turnId"] == turn_id]
            assert committed[0]["answer"] == "".join(ANSWER)
            assert len(union) == total


async def test_a_turn_keeps_running_after_its_only_client_leaves(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        turn_id, first = await _read(
            http, "POST", f"{API}/sessions/gone/execute", json={"content": "go"}, stop_after=1
        )
        assert len(first) == 1  # the client disconnected right away
        for _ in range(200):
            turn = (await http.get(f"{API}/turns/{turn_id}")).json()
            if turn["status"] != "running":
                break
            await asyncio.sleep(0.05)
        assert turn["status"] == "succeeded"
        history = (await http.get(f"{API}/sessions/gone/history")).json()
        assert history[0]["answer"] == "".join(ANSWER)


async def test_stop_cancels_a_detached_turn(tmp_path: Path) -> None:
    with _server(tmp_path, InMemoryReplayBuffer(), hang=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            received: list[dict[str, object]] = []

            async def listen(turn_holder: list[str]) -> None:
                async with aconnect_sse(
                    http, "POST", f"{API}/sessions/stop/execute", json={"content": "go"}
                ) as source:
                    turn_holder.append(source.response.headers["x-turn-id"])
                    async for sse in source.aiter_sse():
                        received.append(json.loads(sse.data))
                        if received[-1]["type"] == "done":
                            return

            holder: list[str] = []
            listener = asyncio.create_task(listen(holder))
            for _ in range(200):
                if any(e["type"] == "message.delta" for e in received):
                    break
                await asyncio.sleep(0.02)
            stopped = await http.post(f"{API}/turns/{holder[0]}/cancel")
            assert stopped.json()["status"] == "cancelled"
            await asyncio.wait_for(listener, 10)
            assert received[-1]["type"] == "done"
            assert received[-1]["status"] == "cancelled"
            audit = (await http.get(f"{API}/turns/{holder[0]}/audit")).json()["rows"]
            assert audit[-1]["call"]["outcome"] == "user-aborted"
