"""A reply with neither text nor tool calls is never the answer: the model is asked once
more, in a call of its own, and a second empty reply fails the turn (`answer-missing`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pytest
from pydantic import BaseModel

from tests.conftest import RuntimeFactory
from tests.helpers import add, until
from tests.support.openai_server import FakeOpenAIServer, Reply
from tests.test_answer_call_tools import (
    _HoldAfterAnswer,
    _recovered,
    _recovered_after_the_answer,
)
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.audit import AuditRow
from turnkit.blocks import TextBlock
from turnkit.events import DoneEvent, ErrorEvent, MessageCompleteEvent
from turnkit.models import ModelMessage
from turnkit.models.litellm import LiteLLMClient
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

NO_PLAN = frozenset({"anchor-plan"})
ANSWER_NOW = "No tool can be called now: answer from what you have, in text."


def _after_a_tool(*after: ModelStep) -> ScriptedModel:
    """A round of tools, then the loop's next replies (`after`)."""
    return ScriptedModel([ModelStep.tool_call_reply(call("add", a=2, b=3)), *after])


def _rows(rows: list[AuditRow], stage: str) -> list[AuditRow]:
    return [r for r in rows if r.identity.stage_id == stage]


def _texts(events: list[object]) -> list[tuple[str, bool]]:
    blocks = [e.block for e in events if isinstance(e, MessageCompleteEvent)]
    return [(b.text, b.is_answer) for b in blocks if isinstance(b, TextBlock)]


@pytest.mark.parametrize("empty", ["", " \n\n"], ids=["empty", "blank"])
async def test_an_empty_loop_reply_is_asked_once_more(
    runtime_factory: RuntimeFactory, empty: str
) -> None:
    """The loop's reply after a tool's result has no text and no call (as Claude sometimes
    answers right after tool results): it is not the answer; one more call asks for it."""
    model = _after_a_tool(ModelStep.text_reply(empty), ModelStep.text_reply("2 + 3 is 5."))
    runtime = runtime_factory(Agent(model=model, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    rows = await runtime.audit(turn.turn_id)
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.answer == "2 + 3 is 5."
    assert [c.tool_choice for c in model.calls] == ["auto", "auto", "none"]
    asked = model.calls[2].messages
    assert (asked[-1].role, asked[-1].content) == ("user", ANSWER_NOW)
    # the request extends the previous one; the empty reply is not sent back
    assert asked[:-1] == model.calls[1].messages
    assert _texts(events) == [(empty, False), ("2 + 3 is 5.", True)]
    [answer_row] = _rows(rows, "synthesize")
    assert answer_row.call is not None  # its own call, billed
    quality = answer_row.payloads.synthesis_quality
    assert quality is not None
    assert (quality.source, quality.answer_chars) == ("synthesize", len("2 + 3 is 5."))
    assert len(_rows(rows, "tool-loop")) == 2
    assert [r for r in rows if r.payloads.synthesis_quality] == [answer_row]  # one answer
    usage = await runtime.store.read_usage(turn.turn_id)
    assert usage is not None
    assert usage.model_calls == 3


async def test_a_second_empty_reply_fails_the_turn(runtime_factory: RuntimeFactory) -> None:
    model = _after_a_tool(ModelStep.text_reply(""), ModelStep.text_reply("\n"))
    runtime = runtime_factory(Agent(model=model, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    rows = await runtime.audit(turn.turn_id)
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "answer-missing")
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert "empty" in error.message
    [row] = _rows(rows, "synthesize")
    assert row.call is not None
    assert (row.call.outcome, row.call.error_code) == ("error", "answer-missing")
    assert turn.answer is None
    # the next turn reads why this one ended, after the request it made last
    follow = ScriptedModel([ModelStep.text_reply("5.")])
    again = runtime_factory(Agent(model=follow, tools=[add], skip_stages=NO_PLAN))
    await collect_events(again.execute_message("s1", "And?"))
    sent = follow.calls[0].messages
    assert [m.content for m in sent if m.role == "user"][-2] == ANSWER_NOW
    assert not [m for m in sent if m.role == "assistant" and not m.content and not m.tool_calls]


@pytest.mark.parametrize("synthesis", ["separate", "no-tools"])
async def test_an_empty_answer_call_is_asked_once_more(
    runtime_factory: RuntimeFactory, synthesis: Literal["separate", "no-tools"]
) -> None:
    """The answer written in synthesize (a separate synthesis call, or an agent without
    tools) is asked for once more when it is empty, like the loop's."""
    if synthesis == "separate":
        model = ScriptedModel(
            [
                ModelStep.text_reply("Let me write it up."),
                ModelStep.text_reply(""),
                ModelStep.text_reply("It is 5."),
            ]
        )
        agent = Agent(model=model, tools=[add], synthesis="separate", skip_stages=NO_PLAN)
    else:
        model = ScriptedModel([ModelStep.text_reply(""), ModelStep.text_reply("It is 5.")])
        agent = Agent(model=model, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.answer == "It is 5."
    asked = model.calls[-1].messages
    assert (asked[-1].role, asked[-1].content) == ("user", ANSWER_NOW)
    assert asked[:-1] == model.calls[-2].messages
    first, second = _rows(await runtime.audit(turn.turn_id), "synthesize")
    assert first.call is not None
    assert first.payloads.synthesis_quality is None
    assert second.payloads.synthesis_quality is not None
    rows = await runtime.audit(turn.turn_id)
    assert [r for r in rows if r.payloads.synthesis_quality] == [second]  # one answer


class Sum(BaseModel):
    """The answer to a sum."""

    total: int


async def test_an_empty_structured_answer_is_told_it_was_empty(
    runtime_factory: RuntimeFactory,
) -> None:
    """An agent with an `output_type` asks again through its own retries, saying why."""
    model = _after_a_tool(ModelStep.text_reply(""), ModelStep.text_reply('{"total": 5}'))
    agent = Agent(model=model, tools=[add], output_type=Sum, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    model.assert_complete()
    assert turn.answer == '{"total": 5}'
    told = model.calls[2].messages[-1]
    assert told.role == "user"
    assert "empty" in str(told.content)


async def test_a_takeover_after_the_empty_reply_makes_only_the_call_asked_again(
    db: tuple[str, str | None],
) -> None:
    """The first process dies while the answer is asked for again: the one that takes the
    turn over reads the empty reply from the log and makes only the new call."""
    url, schema = db
    model = _after_a_tool(
        ModelStep.text_reply(""), ModelStep.hang("2 +"), ModelStep.text_reply("2 + 3 is 5.")
    )
    agent = Agent(model=model, tools=[add], skip_stages=NO_PLAN)
    config = RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=1.0)
    async with SessionRuntime(agent=agent, config=config) as first:
        submission = await first.start("s1", "What is 2 + 3?")
        await until(lambda: len(model.calls) == 3, "the answer is asked for again")
    turn, rows = await _recovered(agent, url, schema, submission.turn_id)
    model.assert_complete()
    assert len(model.calls) == 4  # the empty reply was not asked for twice
    assert model.calls[3].messages == model.calls[2].messages
    assert turn.answer == "2 + 3 is 5."
    [row] = [r for r in _rows(rows, "synthesize") if r.payloads.synthesis_quality]
    assert row.call is not None


async def test_a_takeover_after_the_answer_asked_again_makes_no_call(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    model = _after_a_tool(ModelStep.text_reply(""), ModelStep.text_reply("2 + 3 is 5."))
    agent = Agent(model=model, tools=[add], skip_stages=NO_PLAN, plugins=[_HoldAfterAnswer()])
    turn, rows = await _recovered_after_the_answer(agent, url, schema)
    model.assert_complete()
    assert len(model.calls) == 3
    assert turn.answer == "2 + 3 is 5."
    assert len([r for r in rows if r.payloads.synthesis_quality]) == 1


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_an_empty_reply_over_http_is_asked_once_more(
    runtime_factory: RuntimeFactory,
    openai_server: FakeOpenAIServer,
    transport: Literal["auto", "litellm"],
) -> None:
    openai_server.script(
        "fake-model",
        [
            Reply.tool_call("add", {"a": 2, "b": 3}, call_id="call_1"),
            Reply.text(""),
            Reply.text("2 + 3 is 5."),
        ],
    )
    client = LiteLLMClient(
        "openai/fake-model", api_base=openai_server.base_url, api_key="sk", transport=transport
    )
    runtime = runtime_factory(Agent(model=client, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [turn] = await runtime.history("s1")
    assert turn.answer == "2 + 3 is 5."
    assert [r.get("tool_choice") for r in openai_server.requests] == [None, None, "none"]
    last, before = openai_server.requests[2]["messages"], openai_server.requests[1]["messages"]
    assert isinstance(last, list)
    assert last == [*before, {"role": "user", "content": ANSWER_NOW}]  # type: ignore[misc]


def _blank_replies(messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """A request's assistant messages with no text and no tool call."""
    return [
        m
        for m in messages
        if m.role == "assistant" and not m.tool_calls and not str(m.content).strip()
    ]


@pytest.mark.parametrize("empty", ["", " \n\n"], ids=["empty", "blank"])
async def test_an_empty_loop_reply_is_not_sent_to_the_separate_synthesis_call(
    runtime_factory: RuntimeFactory, empty: str
) -> None:
    """The loop's last reply has no text: the synthesis call is the loop's request plus its
    closing instruction (some providers refuse an empty assistant message, and litellm
    puts a placeholder text in its place for Anthropic), and the session keeps none."""
    model = _after_a_tool(ModelStep.text_reply(empty), ModelStep.text_reply("It is 5."))
    agent = Agent(model=model, tools=[add], synthesis="separate", skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.answer == "It is 5."
    synthesis = model.calls[2].messages
    assert synthesis[:-1] == model.calls[1].messages
    assert (synthesis[-1].role, synthesis[-1].content) == ("user", agent.synthesis_instructions)
    follow = ScriptedModel([ModelStep.text_reply("Yes.")])
    again = runtime_factory(Agent(model=follow, skip_stages=NO_PLAN))
    await collect_events(again.execute_message("s1", "Sure?"))
    assert _blank_replies(follow.calls[0].messages) == []


async def test_an_empty_first_reply_leaves_the_synthesis_call_the_message_itself(
    runtime_factory: RuntimeFactory,
) -> None:
    """Nothing ran and nothing was said: the synthesis call answers the message itself,
    as when the loop is skipped (no closing instruction after the user's own message)."""
    model = ScriptedModel([ModelStep.text_reply(""), ModelStep.text_reply("Hello.")])
    agent = Agent(model=model, tools=[add], synthesis="separate", skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "Hi"))
    model.assert_complete()
    assert model.calls[1].messages == model.calls[0].messages
    assert [c.tool_choice for c in model.calls] == ["auto", "none"]


@pytest.mark.parametrize("synthesis", ["terminal", "separate"])
async def test_an_empty_structured_answer_is_not_sent_back(
    runtime_factory: RuntimeFactory, synthesis: Literal["terminal", "separate"]
) -> None:
    """An agent with an `output_type` asks again through its retries: the request that
    asks again extends the one the empty answer answered, without the empty answer."""
    if synthesis == "terminal":
        model = _after_a_tool(ModelStep.text_reply(""), ModelStep.text_reply('{"total": 5}'))
    else:
        model = _after_a_tool(
            ModelStep.text_reply("Done."),
            ModelStep.text_reply(""),
            ModelStep.text_reply('{"total": 5}'),
        )
    agent = Agent(
        model=model, tools=[add], output_type=Sum, synthesis=synthesis, skip_stages=NO_PLAN
    )
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    model.assert_complete()
    assert turn.answer == '{"total": 5}'
    asked = model.calls[-1].messages
    assert asked[:-1] == model.calls[-2].messages
    assert "empty" in str(asked[-1].content)


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_an_empty_loop_reply_over_http_is_not_sent_to_the_synthesis_call(
    runtime_factory: RuntimeFactory,
    openai_server: FakeOpenAIServer,
    transport: Literal["auto", "litellm"],
) -> None:
    openai_server.script(
        "fake-model",
        [
            Reply.tool_call("add", {"a": 2, "b": 3}, call_id="call_1"),
            Reply.text(""),
            Reply.text("It is 5."),
        ],
    )
    client = LiteLLMClient(
        "openai/fake-model", api_base=openai_server.base_url, api_key="sk", transport=transport
    )
    agent = Agent(model=client, tools=[add], synthesis="separate", skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    last, before = openai_server.requests[2]["messages"], openai_server.requests[1]["messages"]
    assert isinstance(last, list)
    assert last == [*before, {"role": "user", "content": agent.synthesis_instructions}]  # type: ignore[misc]
