"""A turn taken over after its last stage ran keeps what it did in the session's transcript.

The saver holds a finished stage's writes back until the next checkpoint, unless
something else is written first (another turn's checkpoint, on a busy process). When the
turn's last stage had finished and its writes were stored, but the turn's ending was not
committed (the runtime closed, the process died), the attempt that takes the turn over
resumes from that stage's checkpoint and runs nothing: LangGraph applies the stored
writes. It ends the turn `succeeded`, and the next turn's model must still read what the
first did: its tool call, the result and its answer, not the message alone. Found by
`tests/invariants/test_random_operations.py` (seed 6).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import turnkit.runtime.driver as driver
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.graph._sqlite_saver import ThreadedSqliteSaver
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool
async def note(key: str) -> str:
    """Write a note."""
    return f"noted {key}"


def _said(messages: Sequence[Any]) -> list[tuple[str, str, list[str]]]:
    return [(m.role, str(m.content), [c.name for c in m.tool_calls]) for m in messages]


async def test_a_turn_taken_over_after_its_last_stage_keeps_its_work_in_the_transcript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reached = asyncio.Event()
    ending = driver.end_succeeded

    async def stuck_once(*args: Any, **kwargs: Any) -> None:
        if not reached.is_set():  # the first attempt: its graph has run; close it here
            reached.set()
            await asyncio.Event().wait()
        await ending(*args, **kwargs)

    async def stored_at_once(
        self: ThreadedSqliteSaver, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:  # as when another turn's checkpoint is written right after the stage
        await self._write(lambda: self.put_writes(config, writes, task_id, task_path))

    monkeypatch.setattr(driver, "end_succeeded", stuck_once)
    monkeypatch.setattr(ThreadedSqliteSaver, "aput_writes", stored_at_once)
    first = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("note", key="k1", tool_call_id="c1")),
            ModelStep.text_reply("first answer"),
        ]
    )
    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    runtime = SessionRuntime(
        agent=Agent(model=first, tools=[note]), config=RuntimeConfig(database_url=url)
    )
    await runtime.open()
    submission = await runtime.start("s1", "first message")
    await asyncio.wait_for(reached.wait(), 30)
    await runtime.close()  # the turn is handed over, its ending not written

    second = ScriptedModel([ModelStep.text_reply("second answer")])
    config = RuntimeConfig(database_url=url, recover_in_process=True)
    async with SessionRuntime(agent=Agent(model=second, tools=[note]), config=config) as again:
        events = await collect_events(again.follow(submission.turn_id))
        assert events[-1].type == "done"
        assert events[-1].status == "succeeded"
        types = [e.type for e in events]
        assert types.count("turn.recovering") == 1
        assert "step.start" not in types[types.index("turn.recovering") :]  # no stage ran
        done = (await collect_events(again.execute_message("s1", "second message")))[-1]
        assert done.type == "done"
        assert done.status == "succeeded"
    first.assert_complete()
    second.assert_complete()
    [request] = second.calls
    assert _said(request.messages)[1:] == [
        ("user", "first message", []),
        ("assistant", "", ["note"]),
        ("tool", "noted k1", []),
        ("assistant", "first answer", []),
        ("user", "second message", []),
    ]
