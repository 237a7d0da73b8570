"""`/readyz`: not ready while the Store cannot be reached; ready but degraded while only the
replay buffer is down (readers follow the Store, the source of truth)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from tests.conftest import require_service
from tests.support.services import free_port

from turnkit import Agent, ConfigurationError, RuntimeConfig, SessionRuntime
from turnkit.http import create_health_router
from turnkit.replay.redis import RedisReplayBuffer
from turnkit.store.sql import SqlStore
from turnkit.testing import ScriptedModel


async def _probe(runtime: SessionRuntime) -> httpx.Response:
    app = FastAPI()
    app.include_router(create_health_router(runtime))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}  # the process is up
        ready = await http.get("/readyz")
        for probe, status in (("/healthz", 200), ("/readyz", ready.status_code)):
            head = await http.head(probe)  # load balancers probe with HEAD too
            assert (head.status_code, head.content) == (status, b""), probe
        return ready


def _unreachable_store() -> SqlStore:
    # Nothing listens on the port: every connection is refused at once.
    return SqlStore.from_url(f"postgresql://turnkit@127.0.0.1:{free_port()}/turnkit")


async def test_readyz_is_not_ready_while_the_store_is_unreachable() -> None:
    store = _unreachable_store()
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), store=store)
    try:
        readyz = await _probe(runtime)
    finally:
        await store.close()
    assert readyz.status_code == 503
    assert readyz.headers["content-type"].startswith("application/problem+json")
    assert readyz.headers["Retry-After"] == "2"
    body = readyz.json()
    assert body["code"] == "not-ready"
    assert body["status"] == 503
    # Why, in class names (the probe is public: no host, port or URL).
    assert "store: unavailable: StoreUnavailableError (ConnectionRefusedError)" in body["detail"]
    assert "127.0.0.1" not in body["detail"]
    assert "replay: ok" in body["detail"]  # only the Store is down


async def test_readyz_stays_ready_while_only_the_replay_buffer_is_down(tmp_path: Path) -> None:
    """A Redis outage must not take every API process out of rotation."""
    buffer = RedisReplayBuffer.from_url(f"redis://127.0.0.1:{free_port()}/0")  # refused
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
        replay=buffer,
    )
    await runtime.open()
    try:
        readyz = await _probe(runtime)
    finally:
        await runtime.close()
        await buffer.close()
    assert readyz.status_code == 200
    assert readyz.json() == {
        "status": "ready",
        "store": "ok",
        "replay": "degraded: ConnectionError; readers follow the Store",
    }


async def test_a_redis_that_refuses_the_url_s_database_stops_the_opening(tmp_path: Path) -> None:
    """A database number Redis lacks is a mistake in the URL, not an outage to ride out."""
    require_service("Redis", "127.0.0.1", 6379)
    buffer = RedisReplayBuffer.from_url("redis://127.0.0.1:6379/99")  # 16 databases by default
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
        replay=buffer,
    )
    try:
        with pytest.raises(ConfigurationError, match="DB index is out of range") as caught:
            await runtime.open()
        assert "check the database number" in str(caught.value)
        assert not (tmp_path / "r.db").exists()  # refused before anything was opened
        readyz = await _probe(runtime)  # a probe meanwhile says why, not "ConnectionError"
    finally:
        await runtime.close()
        await buffer.close()
    detail = readyz.json()["detail"]
    assert "replay: degraded: Redis refused this replay buffer's connection" in detail


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a hung Redis)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield int(server.getsockname()[1])


async def test_a_hung_replay_buffer_does_not_hang_the_probe(
    tmp_path: Path, silent_port: int
) -> None:
    buffer = RedisReplayBuffer.from_url(f"redis://127.0.0.1:{silent_port}/0")
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'h.db'}")
    await store.setup()
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), store=store, replay=buffer)
    started = time.monotonic()
    try:
        readyz = await _probe(runtime)
    finally:
        await store.close()
        await buffer.close()
    assert time.monotonic() - started < 5
    assert readyz.status_code == 200
    assert readyz.json()["replay"] == "degraded: TimeoutError; readers follow the Store"


async def test_readyz_names_both_when_the_store_and_the_buffer_are_down() -> None:
    store = _unreachable_store()
    buffer = RedisReplayBuffer.from_url(f"redis://127.0.0.1:{free_port()}/0")
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), store=store, replay=buffer)
    try:
        readyz = await _probe(runtime)
    finally:
        await store.close()
        await buffer.close()
    assert readyz.status_code == 503
    detail = readyz.json()["detail"]
    assert "store: unavailable: StoreUnavailableError" in detail
    assert "replay: degraded: ConnectionError" in detail


async def test_a_hung_database_makes_the_process_not_ready_instead_of_hanging_the_probe(
    silent_port: int,
) -> None:
    """A database that accepts connections and never answers (a frozen server)."""
    store = SqlStore.from_url(f"postgresql://turnkit@127.0.0.1:{silent_port}/turnkit")
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), store=store)
    try:
        async with asyncio.timeout(15):  # the probe answers; it does not wait on the database
            readyz = await _probe(runtime)
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await store.close()
    assert readyz.status_code == 503
    assert readyz.json()["code"] == "not-ready"
    assert "store: unavailable: no answer within 1.5 s" in readyz.json()["detail"]


async def test_the_probe_does_not_wait_for_a_hung_call_to_be_cancelled(tmp_path: Path) -> None:
    """Cancelling a call on a connection that hangs can take seconds; the answer cannot."""
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'c.db'}")
    await store.setup()
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), store=store)

    async def hangs(**_: object) -> list[object]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.sleep(30))  # a driver slow to give the call up
            raise
        return []

    store.list_sessions = hangs  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(10):  # well before the 30 s the cancellation takes
            readyz = await _probe(runtime)
    finally:
        await store.close()
    assert readyz.status_code == 503
    assert "store: unavailable: no answer within 1.5 s" in readyz.json()["detail"]


async def test_readyz_reuses_a_replay_buffer_that_answered_never_one_that_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes every second from several load balancers ask Redis once per
    `READY_REPLAY_KEPT_S` while it answers; a failure is never reused, so the first probe
    after Redis is back says `ok`, and while it is down each probe asks again."""
    from turnkit.replay.memory import InMemoryReplayBuffer

    class Counted(InMemoryReplayBuffer):
        asked = 0
        down = False

        async def ping(self) -> None:
            self.asked += 1
            if self.down:
                raise ConnectionError("Redis is down")

    buffer = Counted()
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
        replay=buffer,
    )
    monkeypatch.setattr(
        "turnkit.http.READY_REPLAY_KEPT_S", 3600.0, raising=False
    )  # no probe outlives it
    app = FastAPI()
    app.include_router(create_health_router(runtime))
    async with (
        runtime,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):

        async def replay() -> str:
            ready = await http.get("/readyz")
            assert ready.status_code == 200  # the Store answers: ready, whatever Redis says
            return str(ready.json()["replay"])

        buffer.down, buffer.asked = True, 0  # (opening the runtime asked it once)
        assert [await replay() for _ in range(3)] == ["degraded: ConnectionError; readers "
                                                      "follow the Store"] * 3  # fmt: skip
        assert buffer.asked == 3  # a failure is not reused
        buffer.down = False
        assert [await replay() for _ in range(5)] == ["ok"] * 5
        assert buffer.asked == 4  # asked once, then reused
        monkeypatch.setattr(
            "turnkit.http.READY_REPLAY_KEPT_S", 0.0, raising=False
        )  # its time is up
        assert await replay() == "ok"
        assert buffer.asked == 5
