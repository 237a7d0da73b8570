"""A long session's turn costs what the turn adds, not what the session holds.

A turn's start reads only what the turns since the last one this runtime started kept;
a checkpoint holds the turn's own messages; the history is sealed against changes in
place; and all of it survives a restart mid-turn after compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Any

from tests.conftest import RuntimeFactory
from tests.helpers import add
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.demo import demo_agent
from turnkit.events import CompactionCompletedEvent, DoneEvent, ToolStartedEvent
from turnkit.graph import sqlite_checkpoint_file
from turnkit.ids import SessionId, TurnId
from turnkit.models import ModelRequest
from turnkit.store import KeptTranscript
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


def _starts_with(after: ModelRequest, before: ModelRequest) -> bool:
    return after.messages[: len(before.messages)] == before.messages


async def test_a_turn_start_reads_only_the_turns_since_the_last_one_started_here(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    reads: list[tuple[TurnId | None, int]] = []
    first = (await collect_events(runtime.execute_message("s1", "message 1")))[0].turn_id
    store: Any = runtime.store
    kept = store.kept_transcript

    async def spy(session_id: SessionId, **kw: Any) -> KeptTranscript:
        found: KeptTranscript = await kept(session_id, **kw)
        reads.append((kw.get("after"), len(found.turns)))
        return found

    store.kept_transcript = spy
    turns = []
    for n in range(2, 8):
        events = await collect_events(runtime.execute_message("s1", f"message {n}"))
        turns.append(events[0].turn_id)
    # The second turn reads the first; every later one only the turn before it.
    assert reads == [(None, 1), *((t, 1) for t in [first, *turns[:-2]])]
    # And every request still starts with the whole previous one (the prefix rule).
    for before, after in zip(model.calls, model.calls[1:], strict=False):
        assert _starts_with(after, before)
    assert [str(m.content) for m in model.calls[-1].messages[1::2]] == [
        f"message {n}" for n in range(1, 8)
    ]


async def test_a_checkpoint_holds_the_turns_own_messages(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    for n in range(1, 4):
        events = await collect_events(runtime.execute_message("s1", f"message {n}"))
    graph: Any = runtime._graph  # pyright: ignore[reportPrivateUsage] - the checkpoint itself
    state = await graph.aget_state({"configurable": {"thread_id": events[0].turn_id}})
    assert state.values["part"] == "turn"
    assert [m["content"] for m in state.values["transcript"]] == ["message 3", "Noted."]


async def test_a_session_deleted_and_begun_again_starts_from_nothing(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    for text in ("old 1", "old 2", "old 3"):
        await collect_events(runtime.execute_message("s1", text))
    assert await runtime.store.delete_session(SessionId("s1"))
    for text in ("new 1", "new 2"):
        await collect_events(runtime.execute_message("s1", text))
    sent = [str(m.content) for m in model.calls[-1].messages[1:]]
    assert sent == ["new 1", "Noted.", "new 2"]


SLOW = {"seconds": 60.0}


@tool
async def quick(n: int) -> int:
    """Answer at once."""
    return n


@tool
async def fetch(n: int) -> int:
    """Fetch something slowly."""
    await asyncio.sleep(SLOW["seconds"])
    return n


def _runtime(db: Path, model: ScriptedModel) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=True)
    return SessionRuntime(agent=Agent(model=model, tools=[quick, fetch]), config=config)


async def test_a_turn_recovered_after_compaction_keeps_its_whole_transcript(
    tmp_path: Path,
) -> None:
    """The checkpoint says history was replaced; the recovered attempt, which compacts
    nothing itself, still stores the whole list, so the next turn repeats its last
    request byte for byte."""
    db, long = tmp_path / "app.db", "word " * 200  # ~250 tokens; a window of 900
    before = ScriptedModel(
        [
            ModelStep.text_reply("First."),
            ModelStep.text_reply("Second."),
            ModelStep.tool_call_reply(call("quick", n=1)),  # compacts, then a tool round
            ModelStep.tool_call_reply(call("fetch", n=7)),  # the process goes away here
        ],
        context_window=900,
    )
    first = _runtime(db, before)
    await first.open()
    try:
        await collect_events(first.execute_message("s1", long))
        await collect_events(first.execute_message("s1", long))
        submission = await first.start("s1", f"{long} And now?")
        for _ in range(400):  # bounded: until the slow tool runs
            events = [e async for e in first.events(submission.turn_id)]
            if any(
                isinstance(e, ToolStartedEvent) and e.block.tool_name == "fetch" for e in events
            ):
                break
            await asyncio.sleep(0.02)
        assert any(isinstance(e, CompactionCompletedEvent) for e in events)
    finally:
        await first.close()  # mid-tool: its lease lapses, nothing ends

    SLOW["seconds"] = 0.0
    after = ScriptedModel(
        [ModelStep.text_reply("Got 7."), ModelStep.text_reply("You are welcome.")],
        context_window=900,
    )
    second = _runtime(db, after)
    await second.open()
    try:
        deadline = time.monotonic() + 20
        while (await second.turn(submission.turn_id)).status == "running":
            assert time.monotonic() < deadline, "the restarted app never took the turn over"
            await asyncio.sleep(0.05)
        assert (await second.turn(submission.turn_id)).status == "succeeded"
        events = await collect_events(second.execute_message("s1", "Thanks."))
        assert isinstance(events[-1], DoneEvent)
    finally:
        await second.close()
        SLOW["seconds"] = 60.0
    recovered_last, next_first = after.calls
    assert not any(isinstance(e, CompactionCompletedEvent) for e in events)
    assert _starts_with(next_first, recovered_last)
    assert [str(m.content) for m in next_first.messages[len(recovered_last.messages) :]] == [
        "Got 7.",
        "Thanks.",
    ]


MESSAGES = ("What is (12 + 3) * 7?", "Thanks, that helps.", "How many words are in this line?")


def _checkpoint_bytes(db: Path, turn_id: str) -> int:
    """What one turn's checkpoints hold: their rows and their writes."""
    with contextlib.closing(sqlite3.connect(sqlite_checkpoint_file(f"sqlite:///{db}"))) as conn:
        (rows,) = conn.execute(
            "SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints"
            " WHERE thread_id = ?",
            (turn_id,),
        ).fetchone()
        (writes,) = conn.execute(
            "SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?", (turn_id,)
        ).fetchone()
    return int(rows) + int(writes)


def _kept_last_request_bytes(db: Path) -> int:
    """The size of the last request the Store keeps for the session (its newest turn's)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        (size,) = conn.execute(
            "SELECT length(last_request) FROM tk_transcripts WHERE last_request IS NOT NULL"
        ).fetchone()
    return int(size)


async def test_what_a_turn_stores_does_not_grow_with_its_session(tmp_path: Path) -> None:
    """A late turn of a long session writes as many checkpoint bytes as an early one (its
    previous request is stored beside the transcript, not listed message by message), and
    the last request the Store keeps for the next turn is as small."""
    db = tmp_path / "long.db"
    config = RuntimeConfig(database_url=f"sqlite:///{db}", keep_ended_checkpoints=True)
    turn_ids: list[str] = []
    last_request: list[int] = []
    async with SessionRuntime(agent=demo_agent(), config=config) as runtime:
        for n in range(90):
            events = await collect_events(runtime.execute_message("s1", MESSAGES[n % 3]))
            assert isinstance(events[-1], DoneEvent)
            assert events[-1].status == "succeeded"
            turn_ids.append(events[0].turn_id)
            last_request.append(_kept_last_request_bytes(db))
        requests = [
            r.payloads.cache_breakpoint.request_messages
            for r in await runtime.audit(TurnId(turn_ids[-1]))
            if r.payloads.cache_breakpoint
        ]
    assert max(requests) > 250  # a long session: every request carries them all
    for turn in range(3, 6):  # one of each kind of turn, early and late
        early = _checkpoint_bytes(db, turn_ids[turn])
        assert _checkpoint_bytes(db, turn_ids[turn + 84]) <= early + 256, (turn, early)
        assert last_request[turn + 84] <= last_request[turn] + 32, (turn, last_request[turn])


async def test_a_late_turn_after_a_restart_sees_the_whole_previous_request(
    tmp_path: Path,
) -> None:
    """Read back from the Store by a process that never saw the session, the previous
    request is whole: the first request of the next turn shares all of it, and one whose
    agent changed its instructions meanwhile shares none of it, as the agent's change."""
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    async with SessionRuntime(agent=demo_agent(), config=RuntimeConfig(database_url=url)) as one:
        for n in range(12):
            await collect_events(one.execute_message("s1", MESSAGES[n % 3]))
        last_turn = (await one.history("s1"))[-1].turn_id
        rows = await one.audit(last_turn)
    sent = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint][-1]
    changed = dataclasses.replace(demo_agent(), instructions="Answer in French.")
    for agent, shared, region in (
        (demo_agent(), sent.request_messages, None),
        (changed, 0, "system"),
    ):
        async with SessionRuntime(agent=agent, config=RuntimeConfig(database_url=url)) as two:
            events = await collect_events(two.execute_message("s1", "Thanks, that helps."))
            assert isinstance(events[-1], DoneEvent)
            assert events[-1].status == "succeeded"
            rows = await two.audit(events[0].turn_id)
        first = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint][0]
        assert first.prefix_messages == shared
        assert first.broken_region == region
        assert first.break_reason == (None if region is None else "agent-changed")
        sent = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint][-1]
