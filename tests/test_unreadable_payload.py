"""A stored event this version cannot read is skipped with a warning, never fatal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.testing import ModelStep, ScriptedModel, collect_events


async def test_history_skips_an_event_from_a_newer_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "u.db"
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    async with SessionRuntime(
        agent=Agent(model=model), config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as runtime:
        events = await collect_events(runtime.execute_message("s1", "hi"))
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
    assert turn.answer == "Hello."
    assert "skipped unreadable event" in caplog.text
    assert "from.the.future" in caplog.text
