"""Outages of Redis and PostgreSQL mid-stream, on private server instances.

Redis down: live readers follow the Store and lose nothing; when Redis returns, readers use
it again. PostgreSQL down: `turnkit worker` waits the outage out and claims again; the API
answers 503 with `Retry-After` meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.faults._table import FaultTable, seq_faults, tool_effects
from tests.support.services import (
    PrivatePostgres,
    PrivateRedis,
    private_postgres,
    private_redis,
)
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import DurableEvent, MessageDeltaEvent, StreamEvent
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.ids import TurnId
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.replay.redis import RedisReplayBuffer
from turnkit.testing import ModelStep, ScriptedModel, call

pytestmark = [pytest.mark.slow, pytest.mark.faults]
ROOT = Path(__file__).parent.parent.parent
__all__ = ("private_postgres", "private_redis")  # fixtures, re-exported for pytest


@tool
async def slow_step(n: int) -> int:
    """Take a while."""
    await asyncio.sleep(1.5)
    return n


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            ModelStep.tool_call_reply(call("slow_step", n=1), text="Working on it."),
            ModelStep.text_reply("All done after the outage."),
        ]
    )


async def test_readers_ride_out_a_redis_outage(
    private_redis: PrivateRedis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    buffer = RedisReplayBuffer.from_url(private_redis.url)
    runtime = SessionRuntime(
        agent=Agent(model=_script(), tools=[slow_step]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
        replay=buffer,
    )
    await runtime.open()
    try:
        submission = await runtime.start("s1", "go")
        received: list[StreamEvent] = []

        async def read() -> None:
            async for event in runtime.reader(keepalive_s=0.2).events(submission.turn_id):
                received.append(event)
                if event.type == "tool.started":
                    private_redis.kill()  # Redis dies while the tool runs

        await asyncio.wait_for(read(), timeout=30)
        durable = [e for e in received if isinstance(e, DurableEvent)]
        record = await runtime.turn(submission.turn_id)
        lost, duplicated = seq_faults([e.seq for e in durable], record.last_seq)
        FaultTable(
            trials=1,
            lost=lost,
            duplicated=duplicated,
            stuck=int(record.status != "succeeded"),
            extra={"outage": "Redis killed while the tool ran"},
        ).show("Redis outage (a live reader follows the Store)", capsys)
        assert [e.seq for e in durable] == list(range(1, len(durable) + 1))  # no gap, no dup
        assert durable[-1].type == "done"
        stored = [e async for e in runtime.events(submission.turn_id)]
        assert [e.seq for e in durable] == [e.seq for e in stored]  # type: ignore[union-attr]
        assert "replay buffer unavailable" in caplog.text

        # Redis is back: the next turn's reader follows the buffer again (deltas arrive).
        private_redis.start()
        runtime.agent = Agent(model=_script(), tools=[slow_step])
        again = await runtime.start("s2", "go")
        after = [e async for e in runtime.reader().events(again.turn_id)]
        assert any(isinstance(e, MessageDeltaEvent) for e in after)
        assert after[-1].type == "done"
    finally:
        await runtime.close()
        await buffer.close()


def _worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "turnkit.cli", "worker",
        "--agent", "tests.support.worker_agent:agent", "--database-url", url,
        "--lease-ttl", "3", "--poll-interval", "0.05", "--sweep-interval", "3600",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TK_TEST_LOG": str(log)}
    with open(log.with_suffix(".err"), "wb") as err:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)


async def _finished(runtime: SessionRuntime, turn_id: str, limit_s: float = 60) -> str:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status = (await runtime.turn(turn_id)).status
        if status in ("succeeded", "failed", "timed_out", "cancelled"):
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"turn {turn_id} did not finish within {limit_s:g} s")


async def test_a_worker_and_the_api_ride_out_a_postgres_outage(
    private_postgres: PrivatePostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.worker_agent import agent

    url = private_postgres.url
    runtime = SessionRuntime(agent=agent(), config=RuntimeConfig(database_url=url))
    await runtime.open()
    app = FastAPI()
    app.include_router(create_turnkit_router(runtime))
    install_problem_handlers(app)
    worker = _worker(url, tmp_path / "calls.jsonl")
    try:
        first = await runtime.submit("pg-1", "double 21 please")
        assert await _finished(runtime, first.turn_id) == "succeeded"

        private_postgres.kill()  # the database goes away for a few seconds
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            down = await http.get("/api/harness/sessions")
        assert down.status_code == 503
        assert down.headers["Retry-After"] == "2"
        assert down.json()["code"] == "store-unavailable"
        await asyncio.sleep(3)
        assert worker.poll() is None, "the worker must not exit on a database outage"
        private_postgres.start()

        second = await _submit_when_back(runtime, "pg-2")
        assert await _finished(runtime, second) == "succeeded"
        assert worker.poll() is None
        await _pg_table(runtime, [first.turn_id, second], tmp_path / "calls.jsonl", capsys)
        err = (tmp_path / "calls.err").read_text()
        assert "the database is unavailable" in err
        assert "the database is back" in err
    finally:
        worker.kill()
        worker.wait(timeout=10)
        await runtime.close()


async def _pg_table(
    runtime: SessionRuntime, turn_ids: list[str], log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fault table of the PostgreSQL outage, counted on the stored logs."""
    lost = duplicated = stuck = 0
    for turn_id in turn_ids:
        record = await runtime.turn(turn_id)
        seqs = [e.seq async for e in runtime.events(turn_id)]  # type: ignore[union-attr]
        gone, twice = seq_faults(seqs, record.last_seq)
        lost, duplicated = lost + gone, duplicated + twice
        stuck += record.status != "succeeded"
    reruns, applied_twice = tool_effects(log)
    table = FaultTable(
        trials=1,
        lost=lost,
        duplicated=duplicated,
        stuck=stuck,
        tool_reruns=reruns,
        applied_twice=applied_twice,
        extra={"turns": len(turn_ids), "outage": "PostgreSQL killed for 3 s"},
    )
    table.show("PostgreSQL outage (a worker and the API wait it out)", capsys)
    assert table.failures == (0, 0, 0, 0), table


async def _submit_when_back(runtime: SessionRuntime, session: str) -> str:
    """The API process's own pool reconnects too (bounded wait)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return (await runtime.submit(session, "double 21 please")).turn_id
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_buffer_down_at_start_up_is_reported_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.services import free_port

    buffer = RedisReplayBuffer.from_url(f"redis://127.0.0.1:{free_port()}/0")
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("Still answering.")])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'b.db'}"),
        replay=buffer,
    )
    try:
        await runtime.open()  # the warning comes now, not at the first stream
        [warned] = [r for r in caplog.records if "replay buffer cannot be reached" in r.message]
        assert (warned.name, warned.levelno) == ("turnkit.replay", logging.WARNING)
        submission = await runtime.start("s1", "hi")
        events = [e async for e in runtime.reader().events(submission.turn_id)]
        record = await runtime.turn(submission.turn_id)
        seqs = [e.seq for e in events if isinstance(e, DurableEvent)]
        lost, duplicated = seq_faults(seqs, record.last_seq)
        table = FaultTable(
            trials=1,
            lost=lost,
            duplicated=duplicated,
            stuck=int(record.status != "succeeded"),
            extra={"outage": "no Redis at start-up"},
        )
        table.show("Redis down at start-up (readers follow the Store)", capsys)
        assert table.failures == (0, 0, 0, 0), table
        assert events[-1].type == "done"  # readers follow the Store
    finally:
        await runtime.close()
        await buffer.close()


class _LossyBuffer(InMemoryReplayBuffer):
    """Drops the first published `tool.completed` (a lost notification)."""

    dropped = 0

    def publish_now(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        kept = [e for e in entries if b'"tool.completed"' not in e[1] or self.dropped]
        self.dropped += len(entries) - len(kept)
        super().publish_now(turn_id, kept)


async def test_a_lost_buffer_message_reaches_the_reader_within_a_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    @tool
    async def quick(n: int) -> int:
        """Answer, then leave the turn quiet for a while."""
        return n

    model = ScriptedModel([ModelStep.tool_call_reply(call("quick", n=1)), ModelStep.hang("")])
    buffer = _LossyBuffer()
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[quick]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'l.db'}"),
        replay=buffer,
    )
    await runtime.open()
    try:
        submission = await runtime.start("s1", "go")
        started = time.monotonic()
        seqs: list[int] = []
        async for event in runtime.reader(keepalive_s=30).events(submission.turn_id):
            if isinstance(event, DurableEvent):
                seqs.append(event.seq)
            if event.type == "tool.completed":
                break
            assert time.monotonic() - started < 5
        waited = time.monotonic() - started
        lost, duplicated = seq_faults(seqs, max(seqs))
        table = FaultTable(
            trials=1,
            lost=lost,
            duplicated=duplicated,
            extra={"messages dropped": buffer.dropped, "caught up after s": round(waited, 2)},
        )
        table.show("a lost buffer message (the reader catches up from the Store)", capsys)
        # The driver is hanging in its next model call: nothing else would wake the reader.
        assert buffer.dropped == 1
        assert table.failures == (0, 0, 0, 0), table
        assert waited < 2.5
        await runtime.cancel(submission.turn_id)
    finally:
        await runtime.close()
