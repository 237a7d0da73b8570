"""Stop pressed after the model's answer streamed in full, before the turn's ending is saved.

The person saw the whole answer stream. The turn ends `cancelled`; before, its log and
`history()` kept no trace of the answer, while the session's stored transcript (what the
next turn's model reads) kept the answer text followed by "the person stopped this turn
before I answered": the next model read an answer the person's history never showed.
Now it is kept as a Stop mid-answer keeps what streamed: an interrupted block in the log
and in `history()`, and the same text, then the note, in the next model's transcript.
Found by `tests/invariants/test_random_operations.py` (seeds 4 and 10).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import turnkit.graph
import turnkit.runtime.driver as driver
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.blocks import TextBlock
from turnkit.events import MessageCompleteEvent
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events
from turnkit.tools import tool

DB = tuple[str, str | None]
ANSWER = "Here is the whole answer."
NOTE = "[the person stopped this turn before I answered]"


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def _stop_once_answered(
    db: DB, monkeypatch: pytest.MonkeyPatch, model: ScriptedModel, *, at: str
) -> tuple[list[Any], Any, list[str]]:
    """Run a turn and Stop it as stage `at` begins (the answer streamed in full).

    What the first turn's stream yielded, its log and history entry, and what the next
    turn's model read from the assistant.
    """
    url, schema = db
    answered = asyncio.Event()
    stage = getattr(turnkit.graph, at)

    async def held(*args: Any, **kwargs: Any) -> Any:
        answered.set()
        await asyncio.Event().wait()  # until Stop cancels the turn
        return await stage(*args, **kwargs)  # pragma: no cover

    monkeypatch.setattr(turnkit.graph, at, held)
    agent = Agent(model=model, tools=[lookup])
    config = RuntimeConfig(database_url=url, database_schema=schema)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        seen: list[Any] = []

        async def read() -> None:
            async for event in runtime.execute_message("s1", "first"):
                seen.append(event)

        reading = asyncio.create_task(read())
        await asyncio.wait_for(answered.wait(), 30)
        turn_id = seen[0].turn_id
        assert await runtime.cancel(turn_id) == "cancelled"
        await reading
        monkeypatch.setattr(turnkit.graph, at, stage)
        streamed = "".join(e.text for e in seen if e.type == "message.delta")
        assert streamed == ANSWER  # what the person saw
        assert seen[-1].type == "done"
        assert seen[-1].status == "cancelled"
        log = await collect_events(runtime.events(turn_id))
        [turn] = await runtime.history("s1")
        events = await collect_events(runtime.execute_message("s1", "second"))
        assert events[-1].status == "succeeded"
    said = [m.content for m in model.calls[-1].messages if m.role == "assistant" and m.content]
    return log, turn, [str(c) for c in said]


def _kept(log: list[Any]) -> list[tuple[str, bool, bool]]:
    blocks = [e.block for e in log if isinstance(e, MessageCompleteEvent) and e.block.text]
    return [(b.text, b.interrupted, b.is_answer) for b in blocks]


def _model() -> ScriptedModel:
    return ScriptedModel(
        [
            ModelStep.tool_call_reply(call("lookup", key="a")),
            ModelStep.text_reply(ANSWER),
            ModelStep.text_reply("second answer"),
        ]
    )


async def test_stop_after_the_answer_streamed_before_it_was_kept_keeps_it_as_shown(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a Stop mid-answer: an interrupted block, and the next model reads it and the note."""
    model = _model()
    log, turn, said = await _stop_once_answered(db, monkeypatch, model, at="run_synthesize")
    assert log[-1].status == "cancelled"
    assert _kept(log) == [(ANSWER, True, False)]
    assert [b.text for b in turn.blocks if isinstance(b, TextBlock) and b.text] == [ANSWER]
    assert turn.answer is None  # stopped before it became the turn's answer
    assert said[-2:] == [ANSWER, NOTE]


async def test_stop_after_the_answer_was_kept_leaves_it_the_answer_with_no_note(
    db: DB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its answer kept, the turn's ending not: no note says it was stopped before it."""
    model = _model()
    log, turn, said = await _stop_once_answered(db, monkeypatch, model, at="run_post_turn")
    assert log[-1].status == "cancelled"
    assert _kept(log) == [(ANSWER, False, True)]
    assert turn.answer == ANSWER
    assert said[-1] == ANSWER
    assert NOTE not in said


@pytest.mark.parametrize("synthesis", ["terminal", "separate"])
async def test_stop_of_a_taken_over_turn_keeps_what_its_earlier_attempt_did(
    db: DB, monkeypatch: pytest.MonkeyPatch, synthesis: str
) -> None:
    """Stopped before its new attempt ran a stage: the next model still reads the answer.

    The log and `history()` show the earlier attempt's call, result and answer; the
    stored transcript kept only the message and the note that the person stopped the
    turn before it answered (found with seed 13 on PostgreSQL).
    """
    url, schema = db
    answered, resumed = asyncio.Event(), asyncio.Event()
    post_turn, run_turn = turnkit.graph.run_post_turn, driver.run_turn

    async def held_post_turn(*args: Any, **kwargs: Any) -> Any:
        answered.set()  # its answer is kept; the runtime closes here
        await asyncio.Event().wait()
        return await post_turn(*args, **kwargs)  # pragma: no cover

    async def held_run(*args: Any, **kwargs: Any) -> Any:
        resumed.set()  # the attempt that took it over, before any stage
        await asyncio.Event().wait()
        return await run_turn(*args, **kwargs)  # pragma: no cover

    monkeypatch.setattr(turnkit.graph, "run_post_turn", held_post_turn)
    model = _model() if synthesis == "terminal" else _separate_model()
    agent = Agent(model=model, tools=[lookup], synthesis=synthesis)  # type: ignore[arg-type]
    config = RuntimeConfig(database_url=url, database_schema=schema)
    runtime = SessionRuntime(agent=agent, config=config)
    await runtime.open()
    first = await runtime.start("s1", "first")
    await asyncio.wait_for(answered.wait(), 30)
    await runtime.close()  # handed over, its ending not written
    monkeypatch.setattr(turnkit.graph, "run_post_turn", post_turn)

    monkeypatch.setattr(driver, "run_turn", held_run)
    config = RuntimeConfig(database_url=url, database_schema=schema, recover_in_process=True)
    async with SessionRuntime(agent=agent, config=config) as again:
        await asyncio.wait_for(resumed.wait(), 30)
        assert await again.cancel(first.turn_id) == "cancelled"
        monkeypatch.setattr(driver, "run_turn", run_turn)
        [turn] = await again.history("s1")
        assert turn.answer == ANSWER  # the log shows it: the next model reads it too
        events = await collect_events(again.execute_message("s1", "second"))
        assert events[-1].status == "succeeded"
    said = [(m.role, str(m.content)) for m in model.calls[-1].messages if m.role != "system"]
    if synthesis == "separate":  # the answer a synthesis call wrote, kept with no note after it
        assert ("assistant", ANSWER) in said
        assert all(NOTE not in text for _, text in said), said
        return
    assert said == [
        ("user", "first"),
        ("assistant", ""),
        ("tool", "value of a"),
        ("assistant", ANSWER),
        ("user", "second"),
    ]


def _separate_model() -> ScriptedModel:
    """For an agent whose answer a synthesis call of its own writes."""
    return ScriptedModel(
        [
            ModelStep.tool_call_reply(call("lookup", key="a")),
            ModelStep.text_reply("I looked it up."),
            ModelStep.text_reply(ANSWER),
            ModelStep.text_reply("Nothing to look up."),
            ModelStep.text_reply("second answer"),
        ]
    )
