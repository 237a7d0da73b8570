"""DESIGN §5.4: a real `turnkit worker` is SIGKILLed mid-turn; another one finishes the turn.

The committed log afterwards has no duplicate or missing seq, each tool_call_id has one
result, the answer is written once, and the tool saw the same idempotency key twice. The
workers run with a checkpoint per step written before the next step (`sync`) or while it
runs (`async`), and with one only when the run stops (`exit`), where the next attempt
starts over and replays the committed log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.worker_agent import agent, read_log

from turnkit import RuntimeConfig, SessionRuntime
from turnkit.events import (
    MessageCompleteEvent,
    RunFinishedEvent,
    StepEndEvent,
    StepStartEvent,
    StreamEvent,
    ToolCompletedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
)
from turnkit.ids import TurnId

ROOT = Path(__file__).parent.parent.parent
pytestmark = pytest.mark.slow
DB = tuple[str, str | None]


class Workers:
    """Start and kill real `turnkit worker` processes; all are killed at the end."""

    def __init__(self, db: DB, log: Path, durability: str) -> None:
        self.db = db
        self.log = log
        self.durability = durability
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        url, schema = self.db
        cmd = [
            sys.executable, "-m", "turnkit.cli", "worker",
            "--agent", "tests.support.worker_agent:agent",
            "--database-url", url,
            "--lease-ttl", "1.5",
            "--poll-interval", "0.05",
            "--sweep-interval", "3600",
            "--drain-timeout", "0.5",
            "--checkpoint-durability", self.durability,
        ]  # fmt: skip
        if schema:
            cmd += ["--database-schema", schema]
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TK_TEST_LOG": str(self.log), **env}
        with open(self.log.with_suffix(f".worker{len(self.procs)}.err"), "wb") as err:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=full_env, stdout=subprocess.DEVNULL, stderr=err
            )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(params=["sync", "async", "exit"])
def workers(db: DB, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workers]:
    pool = Workers(db, tmp_path / "calls.jsonl", request.param)
    try:
        yield pool
    finally:
        pool.kill_all()


def _log(workers: Workers) -> list[dict[str, object]]:
    return read_log(workers.log)


async def _wait_for(check: Callable[[], object], what: str, limit_s: float = 30.0) -> None:
    import asyncio

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {limit_s} s waiting for {what}")


async def _events(runtime: SessionRuntime, turn_id: TurnId) -> list[StreamEvent]:
    return [e async for e in runtime.events(turn_id)]


async def _kill_and_recover(
    db: DB, workers: Workers, *, slow: dict[str, str], killed_when: Callable[..., object]
) -> tuple[SessionRuntime, TurnId]:
    url, schema = db
    runtime = SessionRuntime(
        agent=agent(), config=RuntimeConfig(database_url=url, database_schema=schema)
    )
    await runtime.open()
    submission = await runtime.submit("crash-session", "double 21 please")
    first = workers.start(**slow)
    await _wait_for(lambda: killed_when(runtime, submission.turn_id), "the kill point")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    workers.start()  # no slowness: this one finishes the turn

    async def finished() -> bool:
        record = await runtime.turn(submission.turn_id)
        return record.status in ("succeeded", "failed", "timed_out", "cancelled")

    await _wait_for(finished, "the second worker to finish the turn", limit_s=60)
    return runtime, submission.turn_id


def _assert_clean_log(events: list[StreamEvent]) -> None:
    seqs = [e.seq for e in events]  # type: ignore[union-attr]
    assert seqs == list(range(1, len(seqs) + 1)), "missing or duplicate seq"
    results = [e.tool_call_id for e in events if isinstance(e, ToolCompletedEvent)]
    assert results == ["call_fixed"], "each tool_call_id has exactly one result"
    starts = [e.block.tool_call_id for e in events if isinstance(e, ToolStartedEvent)]
    assert starts == ["call_fixed"]
    answers = [e for e in events if isinstance(e, MessageCompleteEvent) and e.block.is_answer]
    assert [a.block.text for a in answers] == ["The answer is 42."]
    assert events[-1].type == "done"
    brackets = [
        (e.type, e.step, e.iteration)
        for e in events
        if isinstance(e, StepStartEvent | StepEndEvent)
    ]
    assert len(brackets) == len(set(brackets)), "a stage bracket was written twice"
    assert [e.type for e in events].count("usage") == 1


async def test_kill_while_a_tool_runs(db: DB, workers: Workers) -> None:
    async def tool_is_running(runtime: SessionRuntime, turn_id: TurnId) -> bool:
        started = any(isinstance(e, ToolStartedEvent) for e in await _events(runtime, turn_id))
        return started and any(line["event"] == "tool" for line in _log(workers))

    runtime, turn_id = await _kill_and_recover(
        db, workers, slow={"TK_TOOL_SLEEP": "60"}, killed_when=tool_is_running
    )
    try:
        record = await runtime.turn(turn_id)
        assert record.status == "succeeded", record
        assert record.attempts == 2
        _assert_clean_log(await _events(runtime, turn_id))
        calls = _log(workers)
        tool_runs = [c for c in calls if c["event"] == "tool"]
        assert len(tool_runs) == 2, "at-least-once: the interrupted tool ran again"
        assert tool_runs[0]["key"] == tool_runs[1]["key"], "same idempotency key on recovery"
        assert tool_runs[0]["pid"] != tool_runs[1]["pid"]
        first_calls = [c for c in calls if c["event"] == "model" and not c["has_result"]]
        assert len(first_calls) == 1, "the committed tool call was not asked for again"
        events = await _events(runtime, turn_id)
        [recovering] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
        assert (recovering.attempt, recovering.cause) == (2, "lease-expired")
        # With checkpoints only at the end, the next attempt starts over from the log.
        started_from = "start" if workers.durability == "exit" else "checkpoint"
        assert recovering.resumed_from == started_from
        [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
        assert (doubt.tool_call_id, doubt.resolution) == ("call_fixed", "rerun")
        assert doubt.idempotency_key == tool_runs[0]["key"]
        [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
        assert (finished.status, finished.attempt, finished.recoveries) == ("succeeded", 2, 1)
        assert record.summary is not None
        assert record.summary.status == "succeeded"
        assert record.summary.attempt == 2
        assert record.summary.recoveries == 1  # on the turn row too, for an operator
    finally:
        await runtime.close()


async def test_the_next_turn_repeats_a_recovered_turns_last_request(
    db: DB, workers: Workers
) -> None:
    """The prompt prefix survives a SIGKILL: the next turn starts with the bytes the
    recovered turn last sent, so the provider's cache still matches."""

    async def tool_is_running(runtime: SessionRuntime, turn_id: TurnId) -> bool:
        return any(line["event"] == "tool" for line in _log(workers))

    runtime, turn_id = await _kill_and_recover(
        db, workers, slow={"TK_TOOL_SLEEP": "60"}, killed_when=tool_is_running
    )
    try:
        assert (await runtime.turn(turn_id)).status == "succeeded"
        nxt = await runtime.submit("crash-session", "thanks")

        async def finished() -> bool:
            return (await runtime.turn(nxt.turn_id)).status == "succeeded"

        await _wait_for(finished, "a worker to run the next turn", limit_s=60)
        calls = [c for c in _log(workers) if c["event"] == "model"]
        first_turn = [c for c in calls if c["last_user"] == "double 21 please"]
        second_turn = [c for c in calls if c["last_user"] == "thanks"]
        last, first = first_turn[-1]["messages"], second_turn[0]["messages"]
        assert isinstance(last, list)
        assert isinstance(first, list)
        assert first[: len(last)] == last
        assert len(first) == len(last) + 2  # + the answer and the new message
    finally:
        await runtime.close()


async def test_kill_between_the_answer_and_the_settle(db: DB, workers: Workers) -> None:
    async def answer_is_committed(runtime: SessionRuntime, turn_id: TurnId) -> bool:
        events = await _events(runtime, turn_id)
        answered = any(isinstance(e, MessageCompleteEvent) and e.block.is_answer for e in events)
        return answered and any(line["event"] == "enrich" for line in _log(workers))

    runtime, turn_id = await _kill_and_recover(
        db, workers, slow={"TK_ENRICH_SLEEP": "60"}, killed_when=answer_is_committed
    )
    try:
        record = await runtime.turn(turn_id)
        assert record.status == "succeeded", record
        _assert_clean_log(await _events(runtime, turn_id))
        answering = [c for c in _log(workers) if c["event"] == "model" and c["has_result"]]
        assert len(answering) == 1, "the answer was not asked for (or billed) twice"
        rows = await runtime.audit(turn_id)
        assert len([r for r in rows if r.payloads.synthesis_quality]) == 1
    finally:
        await runtime.close()


async def test_a_stopped_worker_leaves_its_turn_to_the_next_one(db: DB, workers: Workers) -> None:
    """SIGTERM is not Stop: the turn is abandoned (not cancelled) and another worker ends it."""
    url, schema = db
    runtime = SessionRuntime(
        agent=agent(), config=RuntimeConfig(database_url=url, database_schema=schema)
    )
    await runtime.open()
    try:
        submission = await runtime.submit("drain-session", "double 21 please")
        first = workers.start(TK_TOOL_SLEEP="60")

        def tool_started() -> bool:
            return any(line["event"] == "tool" for line in _log(workers))

        await _wait_for(tool_started, "the tool to start")
        first.send_signal(signal.SIGTERM)  # drain timeout is 0.5 s (see Workers.start)
        first.wait(timeout=20)
        record = await runtime.turn(submission.turn_id)
        assert record.status == "running"  # abandoned, not cancelled
        workers.start()

        async def finished() -> bool:
            return (await runtime.turn(submission.turn_id)).status == "succeeded"

        await _wait_for(finished, "the next worker to finish the turn", limit_s=60)
        _assert_clean_log(await _events(runtime, submission.turn_id))
    finally:
        await runtime.close()
