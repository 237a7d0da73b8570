"""A stored event this version cannot read is skipped with a warning, never fatal.

A run that skips one also counts it (`run.finished.skipped_events`) and audits it (an
`unreadableEvent` row per event, without its bytes).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, RunFinishedEvent, StepEndEvent, StepStartEvent
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


async def test_history_skips_an_event_from_a_newer_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "u.db"
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    async with SessionRuntime(
        agent=Agent(model=model), config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as runtime:
        events = await collect_events(runtime.execute_message("s1", "hi", request_id="r-same"))
        turn_id = events[0].turn_id
        last = (await runtime.turn(turn_id)).last_seq
    with sqlite3.connect(db) as conn:  # a newer turnkit appended a type this one lacks
        conn.execute(
            "INSERT INTO tk_events (turn_id, seq, type, data) VALUES (?, ?, ?, ?)",
            (turn_id, last + 1, "from.the.future", b'{"type": "from.the.future"}'),
        )
    async with SessionRuntime(
        agent=Agent(model=model), config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as runtime:
        [turn] = await runtime.history("s1")
        # Reading the turn's events, or asking again with the same request id, reads the
        # rest of them too.
        read = [e.seq async for e in runtime.events(turn_id)]
        again = await collect_events(runtime.execute_message("s1", "hi", request_id="r-same"))
    assert turn.answer == "Hello."
    assert read == list(range(1, last + 1))
    assert again[-1].type == "done"
    assert "skipped unreadable event" in caplog.text
    assert "from.the.future" in caplog.text


@tool(approval="always")
async def send_note(to: str) -> str:
    """Send a note (needs a person's approval)."""
    return f"sent to {to}"


async def test_a_resumed_run_counts_and_audits_the_events_it_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "u.db"
    agent = Agent(
        model=ScriptedModel(
            [ModelStep.tool_call_reply(call("send_note", to="ada")), ModelStep.text_reply("Sent.")]
        ),
        tools=[send_note],
    )
    config = RuntimeConfig(database_url=f"sqlite:///{db}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "note Ada"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)  # paused: the next run reads the log
    # Damage the anchor-plan brackets: one torn, one as a newer version would write it.
    opened, closed = [
        e.seq
        for e in events
        if isinstance(e, StepStartEvent | StepEndEvent) and e.step == "anchor-plan"
    ]
    with sqlite3.connect(db) as conn:
        for seq, data in (
            (opened, b"\x00\x01 torn page"),
            (closed, b'{"type": "step.end.v2", "secret": "s3cr3t"}'),
        ):
            conn.execute(
                "UPDATE tk_events SET data = ? WHERE turn_id = ? AND seq = ?",
                (data, asked.turn_id, seq),
            )

    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        async with asyncio.timeout(20):
            while (await runtime.turn(asked.turn_id)).status == "running":
                await asyncio.sleep(0.02)
        record = await runtime.turn(asked.turn_id)
        rows = await runtime.audit(asked.turn_id)
        stored = [e async for e in runtime.store.read_events(asked.turn_id)]

    assert record.status == "succeeded"
    [finished] = [
        RunFinishedEvent.model_validate_json(e.data) for e in stored if e.type == "run.finished"
    ]
    assert finished.skipped_events == 2  # the operator's count, in the run's own account
    assert record.summary is not None
    assert record.summary.skipped_events == 2
    audited = [r for r in rows if r.payloads.unreadable_event is not None]
    assert all(r.call is None and r.identity.stage_id == "runtime" for r in audited)
    unreadable = [r.payloads.unreadable_event for r in audited if r.payloads.unreadable_event]
    assert [(p.seq, p.event_type, p.reason) for p in unreadable] == [
        (opened, "step.start", "invalid-json"),
        (closed, "step.end", "unknown-type"),
    ]
    assert unreadable[0].size_bytes == len(b"\x00\x01 torn page")
    assert "s3cr3t" not in "".join(r.model_dump_json(by_alias=True) for r in rows)  # no bytes
    assert "skipped unreadable event" in caplog.text
