"""The call that writes the answer offers tools with `tool_choice="none"`; a provider that
names tools there anyway never runs them, and never leaves the turn an empty answer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel

from tests.conftest import RuntimeFactory
from tests.helpers import add, until
from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit import Agent, BudgetLimit, RuntimeConfig, SessionRuntime, TurnHistory
from turnkit.audit import AuditRow
from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.events import (
    BudgetPausedEvent,
    DoneEvent,
    ErrorEvent,
    MessageCompleteEvent,
    ToolDeltaEvent,
    ToolStartedEvent,
)
from turnkit.models import Usage
from turnkit.models.litellm import LiteLLMClient
from turnkit.plugins import Enrichment, Plugin, PluginContext
from turnkit.protocols._agui_translate import ClientView, Translator
from turnkit.protocols._ai_sdk_translate import UIMessageStreamTranslator
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

NO_PLAN = frozenset({"anchor-plan"})
ANSWER_NOW = "No tool can be called now: answer from what you have, in text."


def _last_round(*after: ModelStep) -> ScriptedModel:
    """One round of tools (the most the agent allows), then the answer call's `after`."""
    return ScriptedModel([ModelStep.tool_call_reply(call("add", a=2, b=3)), *after])


def _synthesize_rows(rows: list[AuditRow]) -> list[AuditRow]:
    return [r for r in rows if r.identity.stage_id == "synthesize"]


def _dropped(row: AuditRow) -> list[str]:
    selection = row.payloads.tool_selection
    return [] if selection is None else [c.tool_name for c in selection.selected]


async def _recovered(
    agent: Agent, url: str, schema: str | None, turn_id: str
) -> tuple[TurnHistory, list[AuditRow]]:
    """A second runtime takes the turn over and runs it to its end: its turn and audit."""
    later = RuntimeConfig(
        database_url=url, database_schema=schema, lease_ttl_s=1.0, recover_in_process=True
    )
    async with SessionRuntime(agent=agent, config=later) as second:
        async with asyncio.timeout(20):
            while (await second.turn(turn_id)).status == "running":
                await asyncio.sleep(0.05)
        [turn] = await second.history("s1")
        return turn, await second.audit(turn_id)


async def test_an_answer_call_that_only_names_tools_is_asked_once_more(
    runtime_factory: RuntimeFactory,
) -> None:
    model = _last_round(
        ModelStep.tool_call_reply(call("add", a=5, b=5)), ModelStep.text_reply("2 + 3 is 5.")
    )
    runtime = runtime_factory(Agent(model=model, tools=[add], max_tool_rounds=1))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    rows = await runtime.audit(turn.turn_id)
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.answer == "2 + 3 is 5."
    assert len([e for e in events if isinstance(e, ToolStartedEvent)]) == 1  # never ran
    assert [c.tool_choice for c in model.calls] == ["auto", "none", "none"]
    asked = model.calls[2].messages
    assert (asked[-1].role, asked[-1].content) == ("user", ANSWER_NOW)
    # the prompt only grows; the reply with no text is not sent back
    assert asked[:-1] == model.calls[1].messages
    first, second = _synthesize_rows(rows)
    assert first.call is not None  # each call billed
    assert second.call is not None
    assert _dropped(first) == ["add"]
    assert first.payloads.synthesis_quality is None
    assert second.payloads.synthesis_quality is not None
    assert second.payloads.synthesis_quality.answer_chars == len("2 + 3 is 5.")
    usage = await runtime.store.read_usage(turn.turn_id)
    assert usage is not None
    assert usage.model_calls == 3
    answers = [e.block for e in events if isinstance(e, MessageCompleteEvent)]
    assert [(b.text, b.is_answer) for b in answers if isinstance(b, TextBlock)] == [
        ("", False),
        ("2 + 3 is 5.", True),
    ]


async def test_a_dropped_call_and_its_empty_reply_are_drawn_as_nothing(
    runtime_factory: RuntimeFactory,
) -> None:
    """A client shows neither the call the answer call named (it never runs: drawn, it would
    stay "being written") nor the empty reply kept as narration (an empty message)."""
    model = _last_round(
        ModelStep.tool_call_reply(call("add", a=5, b=5)), ModelStep.text_reply("2 + 3 is 5.")
    )
    runtime = runtime_factory(Agent(model=model, tools=[add], max_tool_rounds=1))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [ran] = [e.block.tool_call_id for e in events if isinstance(e, ToolStartedEvent)]
    assert [e.tool_call_id for e in events if isinstance(e, ToolDeltaEvent)] == [ran]
    ai_sdk = UIMessageStreamTranslator(message_id="m")
    chunks = [c for e in events for c in ai_sdk.translate(e)] + ai_sdk.finish()
    assert [c["toolCallId"] for c in chunks if c["type"] == "tool-input-start"] == [ran]
    agui = Translator(
        thread_id="t",
        run_id="r",
        turn_id=events[0].turn_id,
        client=ClientView(texts={}, arguments={}, results=set()),
        now=lambda: datetime.now(UTC),
    )
    frames = [f for e in events for f in agui.feed(e.model_dump_json().encode())]
    [answer] = [e.block for e in events if isinstance(e, MessageCompleteEvent) and e.block.text]
    opened = [f["messageId"] for f in frames if f["type"] == "TEXT_MESSAGE_START"]
    assert opened == [answer.block_id]


async def test_a_separate_synthesis_that_names_tools_twice_fails_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.text_reply("Let me write it up."),
            ModelStep.tool_call_reply(call("add", a=2, b=3)),
            ModelStep.tool_call_reply(call("add", a=2, b=3)),
        ]
    )
    agent = Agent(model=model, tools=[add], synthesis="separate", skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    rows = await runtime.audit(turn.turn_id)
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "answer-missing")
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert "no tool can be called" in error.message
    assert not any(isinstance(e, ToolStartedEvent) for e in events)
    assert [c.tool_choice for c in model.calls] == ["auto", "none", "none"]
    first, second = _synthesize_rows(rows)
    assert _dropped(first) == _dropped(second) == ["add"]
    assert second.call is not None
    assert (second.call.outcome, second.call.error_code) == ("error", "answer-missing")
    assert not any(r.payloads.synthesis_quality for r in rows)
    assert turn.answer is None
    record = await runtime.turn(turn.turn_id)
    assert (record.status, record.error_code) == ("failed", "answer-missing")


async def test_an_answer_asked_again_that_writes_nothing_fails_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    model = _last_round(ModelStep.tool_call_reply(call("add", a=5, b=5)), ModelStep.text_reply(""))
    runtime = runtime_factory(Agent(model=model, tools=[add], max_tool_rounds=1))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "answer-missing")
    # the next turn reads why this one ended, after the request it made last
    follow = ScriptedModel([ModelStep.text_reply("5.")])
    again = runtime_factory(Agent(model=follow, tools=[add], max_tool_rounds=1))
    await collect_events(again.execute_message("s1", "And?"))
    sent = follow.calls[0].messages
    assert [m.content for m in sent if m.role == "user"][-2] == ANSWER_NOW


async def test_text_written_beside_tool_calls_is_the_answer_and_the_calls_are_noted(
    runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    model = _last_round(ModelStep.tool_call_reply(call("add", a=5, b=5), text="It is 5."))
    runtime = runtime_factory(Agent(model=model, tools=[add], max_tool_rounds=1))
    with caplog.at_level(logging.WARNING, logger="turnkit.runtime"):
        events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    rows = await runtime.audit(turn.turn_id)
    model.assert_complete()
    assert turn.answer == "It is 5."
    assert len([e for e in events if isinstance(e, ToolStartedEvent)]) == 1
    [row] = _synthesize_rows(rows)
    assert _dropped(row) == ["add"]
    assert row.payloads.synthesis_quality is not None
    [warning] = [r for r in caplog.records if "no tool can be called" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "add" in warning.getMessage()


class Sum(BaseModel):
    """The answer to a sum."""

    total: int


async def test_a_valid_structured_answer_beside_tool_calls_notes_them_too(
    runtime_factory: RuntimeFactory,
) -> None:
    writer = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3), text='{"total": 5}')], name="writer"
    )
    model = ScriptedModel([ModelStep.text_reply("Let me write it up.")])
    agent = Agent(
        model=model,
        tools=[add],
        synthesis="separate",
        synthesis_model=writer,
        output_type=Sum,
        skip_stages=NO_PLAN,
    )
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    [row] = _synthesize_rows(await runtime.audit(turn.turn_id))
    assert turn.answer == '{"total": 5}'
    assert _dropped(row) == ["add"]


async def test_a_takeover_does_not_ask_again_for_the_call_that_named_tools(
    db: tuple[str, str | None],
) -> None:
    """The first process dies while the answer is asked for again; the one that takes the
    turn over reads the call that named tools from the log and makes only the new one."""
    url, schema = db
    model = _last_round(
        ModelStep.tool_call_reply(call("add", a=5, b=5)),
        ModelStep.hang("2 +"),
        ModelStep.text_reply("2 + 3 is 5."),
    )
    agent = Agent(model=model, tools=[add], max_tool_rounds=1, skip_stages=NO_PLAN)
    config = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=1.0)
    async with SessionRuntime(agent=agent, config=config) as first:
        submission = await first.start("s1", "What is 2 + 3?")
        await until(lambda: len(model.calls) == 3, "the answer is asked for again")
    turn, rows = await _recovered(agent, url, schema, submission.turn_id)
    model.assert_complete()
    assert len(model.calls) == 4  # the call that named tools was not made twice
    assert model.calls[3].messages == model.calls[2].messages
    assert turn.answer == "2 + 3 is 5."
    first_row, second_row = _synthesize_rows(rows)
    assert _dropped(first_row) == ["add"]
    assert second_row.payloads.synthesis_quality is not None


async def test_a_server_that_ignores_tool_choice_is_asked_again_over_http(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    openai_server.script(
        "fake-model",
        [
            Reply.tool_call("add", {"a": 2, "b": 3}, call_id="call_1"),
            Reply.tool_call("add", {"a": 5, "b": 5}, call_id="call_2"),
            Reply.text("2 + 3 is 5."),
        ],
    )
    client = LiteLLMClient("openai/fake-model", api_base=openai_server.base_url, api_key="sk")
    runtime = runtime_factory(Agent(model=client, tools=[add], max_tool_rounds=1))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [turn] = await runtime.history("s1")
    assert turn.answer == "2 + 3 is 5."
    assert [r.get("tool_choice") for r in openai_server.requests] == [None, "none", "none"]
    last = openai_server.requests[2]["messages"]
    assert isinstance(last, list)
    assert last[-1] == {"role": "user", "content": ANSWER_NOW}
    assert len([e for e in events if isinstance(e, ToolStartedEvent)]) == 1


async def test_blank_text_beside_tool_calls_is_no_answer(runtime_factory: RuntimeFactory) -> None:
    """Servers often write a line break before a tool call: blank text is not an answer, so
    the model is asked once more (and a blank answer asked again fails the turn)."""
    model = _last_round(
        ModelStep.tool_call_reply(call("add", a=5, b=5), text="\n\n"),
        ModelStep.text_reply("2 + 3 is 5."),
    )
    runtime = runtime_factory(Agent(model=model, tools=[add], max_tool_rounds=1))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.answer == "2 + 3 is 5."
    blank = _last_round(
        ModelStep.tool_call_reply(call("add", a=5, b=5), text="\n"), ModelStep.text_reply(" \n")
    )
    again = runtime_factory(Agent(model=blank, tools=[add], max_tool_rounds=1))
    events = await collect_events(again.execute_message("s2", "What is 2 + 3?"))
    blank.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "answer-missing")


class _HoldAfterAnswer(Plugin):
    """Holds the turn in post-turn, once both answer calls are in the log."""

    name: ClassVar[str] = "hold-after-answer"
    reached: ClassVar[asyncio.Event | None] = None

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        if _HoldAfterAnswer.reached is not None:
            _HoldAfterAnswer.reached.set()
            await asyncio.sleep(3600)  # until the process "dies"
        return None


async def _recovered_after_the_answer(
    agent: Agent, url: str, schema: str | None
) -> tuple[TurnHistory, list[AuditRow]]:
    """The process dies once the answer is in the log (held in post-turn by the agent's
    `_HoldAfterAnswer`); a second takes the turn over: its turn and audit."""
    _HoldAfterAnswer.reached = asyncio.Event()
    config = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=1.0)
    try:
        async with SessionRuntime(agent=agent, config=config) as first:
            submission = await first.start("s1", "What is 2 + 3?")
            async with asyncio.timeout(10):
                await _HoldAfterAnswer.reached.wait()
    finally:
        _HoldAfterAnswer.reached = None
    return await _recovered(agent, url, schema, submission.turn_id)


async def test_a_takeover_after_the_answer_asked_again_makes_no_answer_call(
    db: tuple[str, str | None],
) -> None:
    """Both answer calls are in the log when the first process dies: the one that takes
    the turn over reads them both and makes no call at all."""
    url, schema = db
    model = _last_round(
        ModelStep.tool_call_reply(call("add", a=5, b=5)), ModelStep.text_reply("2 + 3 is 5.")
    )
    agent = Agent(
        model=model,
        tools=[add],
        max_tool_rounds=1,
        skip_stages=NO_PLAN,
        plugins=[_HoldAfterAnswer()],
    )
    turn, rows = await _recovered_after_the_answer(agent, url, schema)
    model.assert_complete()
    assert len(model.calls) == 3
    assert turn.answer == "2 + 3 is 5."
    assert len(_synthesize_rows(rows)) == 2


async def test_the_answer_asked_again_waits_for_its_budget(tmp_path: Path) -> None:
    """The call asked again does not fit the budget: the turn pauses after the call that
    named tools, and once the limit is raised it goes on without making that call again."""
    costly = dataclasses.replace(
        ModelStep.tool_call_reply(call("add", a=5, b=5)),
        usage=Usage(input_tokens=740, output_tokens=50),
    )
    model = _last_round(costly, ModelStep.text_reply("2 + 3 is 5."))
    agent = Agent(model=model, tools=[add], max_tool_rounds=1, skip_stages=NO_PLAN)
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'b.db'}",
        budgets="enforce",
        budget_reserve_tokens=50,
        recover_in_process=True,
    )
    limit = BudgetLimit(scope="principal", key="ann", tokens=900)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.set_budget_limit(limit)
        events = await collect_events(runtime.execute_message("s1", "2 + 3?", principal="ann"))
        assert isinstance(events[-1], BudgetPausedEvent), [e.type for e in events]
        assert len(model.calls) == 2
        await runtime.set_budget_limit(limit.model_copy(update={"tokens": 100_000}))
        async with asyncio.timeout(20):
            while (await runtime.turn(events[0].turn_id)).status == "running":
                await asyncio.sleep(0.05)
        [turn] = await runtime.history("s1")
    model.assert_complete()
    assert len(model.calls) == 3
    assert turn.answer == "2 + 3 is 5."
