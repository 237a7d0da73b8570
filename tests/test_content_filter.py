"""A reply the provider's content filter stopped (finish reason `content_filter`: OpenAI and
Azure's filter; through litellm also Anthropic's refusal and Gemini's SAFETY) is not a
complete answer: with no text the turn fails (`content-filtered`); text it cut is kept as
the answer, and its audit row says so."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal

import pytest
from pydantic import BaseModel

from tests.conftest import RuntimeFactory
from tests.helpers import add
from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit import Agent, ContentFilteredError, ModelFamily, RuntimeConfig, tool
from turnkit.audit import AuditRow
from turnkit.blocks import TextBlock
from turnkit.events import (
    DoneEvent,
    ErrorEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    ProviderCascadeEvent,
    RunFinishedEvent,
    ToolFailedEvent,
)
from turnkit.journal import Journal
from turnkit.models import ToolCallPart
from turnkit.models._litellm_finish import stop_reason
from turnkit.models.litellm import LiteLLMClient
from turnkit.stages.tool_loop import committed_response
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

NO_PLAN = frozenset({"anchor-plan"})


def _rows(rows: list[AuditRow], stage: str) -> list[AuditRow]:
    return [r for r in rows if r.identity.stage_id == stage]


def test_content_filter_is_its_own_stop_reason() -> None:
    assert stop_reason("content_filter", False) == "content_filter"
    assert stop_reason("content_filter", True) == "content_filter"
    assert stop_reason("stop", False) == "end_turn"
    assert ContentFilteredError.code == "content-filtered"


async def test_a_filtered_reply_with_no_text_fails_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.filtered()])
    runtime = runtime_factory(Agent(model=model, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    rows = await runtime.audit(turn.turn_id)
    model.assert_complete()  # not asked again: the same model would refuse again
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "content-filtered")
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert "content filter" in error.message
    last = _rows(rows, "tool-loop")[-1]
    assert last.call is not None
    assert (last.call.outcome, last.call.error_code) == ("error", "content-filtered")
    assert turn.answer is None


async def test_text_the_filter_cut_is_the_answer_and_the_audit_says_so(
    runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([ModelStep.filtered("Here is part")])
    runtime = runtime_factory(Agent(model=model, tools=[add], skip_stages=NO_PLAN))
    with caplog.at_level(logging.WARNING, logger="turnkit.runtime"):
        events = await collect_events(runtime.execute_message("s1", "Tell me."))
    [turn] = await runtime.history("s1")
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.answer == "Here is part"
    [row] = [r for r in await runtime.audit(turn.turn_id) if r.payloads.synthesis_quality]
    assert row.payloads.synthesis_quality is not None
    assert row.payloads.synthesis_quality.stop_reason == "content_filter"
    assert any("content filter" in r.getMessage() for r in caplog.records)


async def test_no_call_of_a_filtered_response_runs(runtime_factory: RuntimeFactory) -> None:
    """The filter stopped the response while it named a tool (OpenAI sends the name first,
    the arguments after): a tool whose parameters are all optional would run with none."""
    runs: list[str] = []

    @tool
    async def look_up(topic: str = "everything") -> str:
        """Look a topic up."""
        runs.append(topic)
        return f"about {topic}"

    cut = ToolCallPart(tool_call_id="call_1", name="look_up", arguments="")
    model = ScriptedModel([ModelStep.filtered("", cut), ModelStep.text_reply("I cannot.")])
    runtime = runtime_factory(Agent(model=model, tools=[look_up], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "Look it up."))
    assert runs == []
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert "content filter" in (failed.result.error or "")
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("succeeded", None)


class Sum(BaseModel):
    """The answer to a sum."""

    total: int


@pytest.mark.parametrize("agent_kind", ["separate", "structured"])
async def test_a_filtered_answer_call_fails_the_turn_without_asking_again(
    runtime_factory: RuntimeFactory, agent_kind: Literal["separate", "structured"]
) -> None:
    if agent_kind == "separate":
        model = ScriptedModel([ModelStep.text_reply("Working."), ModelStep.filtered()])
        agent = Agent(model=model, tools=[add], synthesis="separate", skip_stages=NO_PLAN)
    else:
        model = ScriptedModel([ModelStep.filtered()])
        agent = Agent(model=model, tools=[add], output_type=Sum, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "content-filtered")


async def test_a_family_does_not_walk_on_from_a_refusal(runtime_factory: RuntimeFactory) -> None:
    """A refusal is an answer from the provider, not a failure of it: the next rung is
    not asked (the text may have streamed already, and a rung is not a way around a
    content policy)."""
    first = ScriptedModel([ModelStep.filtered()], name="first")
    second = ScriptedModel([], name="second")
    runtime = runtime_factory(Agent(model=ModelFamily("m", [first, second]), skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "Tell me."))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].error_code == "content-filtered"
    assert not second.calls
    assert not any(isinstance(e, ProviderCascadeEvent) for e in events)


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_a_filtered_reply_over_http(
    runtime_factory: RuntimeFactory,
    openai_server: FakeOpenAIServer,
    transport: Literal["auto", "litellm"],
) -> None:
    openai_server.script(
        "fake-model",
        [
            Reply.tool_call("add", {"a": 2, "b": 3}, call_id="call_1"),
            Reply.text("", finish_reason="content_filter"),
            Reply.text("Here is part", finish_reason="content_filter"),
        ],
    )
    client = LiteLLMClient(
        "openai/fake-model", api_base=openai_server.base_url, api_key="sk", transport=transport
    )
    runtime = runtime_factory(Agent(model=client, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "content-filtered")
    assert len(openai_server.requests) == 2
    events = await collect_events(runtime.execute_message("s2", "Tell me."))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [turn] = await runtime.history("s2")
    assert turn.answer == "Here is part"
    [row] = [r for r in await runtime.audit(turn.turn_id) if r.payloads.synthesis_quality]
    assert row.payloads.synthesis_quality is not None
    assert row.payloads.synthesis_quality.stop_reason == "content_filter"
    assert [e.block.text for e in events if isinstance(e, MessageCompleteEvent)] == ["Here is part"]


FILTERED_NOTE = (
    "[my previous answer failed: content-filtered — the provider's content filter stopped "
    "it before it had any text]"
)
REFUSAL = "I'm sorry, I can't help with that."
REFUSED_NOTE = f'[my previous answer failed: content-filtered — I refused: "{REFUSAL}"]'


def _after_the_failed_turn(messages: tuple[object, ...], asked: str) -> tuple[object, ...]:
    """The failed turn's message and what follows it in the next turn's first request."""
    at = max(i for i, m in enumerate(messages) if getattr(m, "content", None) == asked)
    return tuple((getattr(m, "role", None), getattr(m, "content", None)) for m in messages[at:])


@pytest.mark.parametrize("refusal", ["", REFUSAL], ids=["filtered", "refused"])
async def test_the_next_turn_reads_that_the_answer_was_filtered(
    runtime_factory: RuntimeFactory, refusal: str
) -> None:
    """As after the output limit: the next turn's model reads, in place of the missing
    answer, a note of its own saying why there was none (a refusal with its words), not a
    user message left unanswered nor advice meant for a person."""
    step = ModelStep.filtered(refusal=refusal) if refusal else ModelStep.filtered()
    model = ScriptedModel([step, ModelStep.text_reply("Sure.")])
    runtime = runtime_factory(Agent(model=model, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "Tell me."))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].error_code == "content-filtered"
    await collect_events(runtime.execute_message("s1", "Something else, then."))
    note = FILTERED_NOTE if not refusal else REFUSED_NOTE
    assert _after_the_failed_turn(model.calls[1].messages, "Tell me.") == (
        ("user", "Tell me."),
        ("assistant", note),
        ("user", "Something else, then."),
    )


async def test_a_refusal_fails_the_turn_with_its_words_in_the_error(
    runtime_factory: RuntimeFactory,
) -> None:
    """A refusal (OpenAI's `refusal`) is not asked again and is not an answer: its words
    are in the `error` event (message and `details.refusal`), never a message block."""
    model = ScriptedModel([ModelStep.filtered(refusal=REFUSAL)])
    agent = Agent(model=model, tools=[add], output_type=Sum, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "content-filtered")
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert REFUSAL in error.message
    assert error.details == {"stop_reason": "content_filter", "refusal": REFUSAL}
    assert not [e for e in events if isinstance(e, MessageCompleteEvent)]


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_a_refusal_over_http_fails_the_turn_on_both_transports(
    runtime_factory: RuntimeFactory,
    openai_server: FakeOpenAIServer,
    transport: Literal["auto", "litellm"],
) -> None:
    """OpenAI streams a refusal in `delta.refusal` with the finish reason `stop`: on both
    transports the turn fails `content-filtered` at once, its words not shown as an
    answer (litellm's path drops them before turnkit sees them: the error has none)."""
    openai_server.script(
        "fake-model",
        [Reply.tool_call("add", {"a": 2, "b": 3}, call_id="call_1"), Reply.refused(REFUSAL)],
    )
    client = LiteLLMClient(
        "openai/fake-model", api_base=openai_server.base_url, api_key="sk", transport=transport
    )
    runtime = runtime_factory(Agent(model=client, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert (events[-1].status, events[-1].error_code) == ("failed", "content-filtered")
    assert len(openai_server.requests) == 2  # not asked again
    assert not [e for e in events if isinstance(e, MessageCompleteEvent) and e.block.text]
    assert not [e for e in events if isinstance(e, MessageDeltaEvent)]
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    if transport == "auto":
        assert error.details.get("refusal") == REFUSAL
    else:
        assert "refusal" not in error.details
    [turn] = await runtime.history("s1")
    [row] = [r for r in await runtime.audit(turn.turn_id) if r.identity.stage_id == "tool-loop"][1:]
    assert row.call is not None
    assert (row.call.outcome, row.call.error_code) == ("error", "content-filtered")


CUT_NOTE = (
    "[my previous answer was cut: content_filter — the provider's content filter stopped it "
    "after the text above, so it is incomplete]"
)


def _after_the_cut_answer(messages: tuple[object, ...], answer: str) -> tuple[object, ...]:
    """The cut answer and what follows it in the next turn's first request."""
    at = max(i for i, m in enumerate(messages) if getattr(m, "content", None) == answer)
    return tuple((getattr(m, "role", None), getattr(m, "content", None)) for m in messages[at:])


@pytest.mark.parametrize("synthesis", ["loop", "separate"])
async def test_an_answer_the_filter_cut_is_marked_and_the_next_turn_reads_so(
    runtime_factory: RuntimeFactory,
    db: tuple[str, str | None],
    synthesis: Literal["loop", "separate"],
) -> None:
    """As after the output limit, the next turn's model reads a note of its own that its
    answer was cut (else it takes a truncated answer for a whole one); the person's screen
    learns it from the answer's block (`filtered`) and the turn's `run.finished`."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    first = [ModelStep.filtered("Here is part")]
    second = [ModelStep.text_reply("Sure.")]
    if synthesis == "separate":
        first = [ModelStep.text_reply("Working."), *first]
        second = [ModelStep.text_reply("Working."), *second]
    model = ScriptedModel([*first, *second])
    mode = "separate" if synthesis == "separate" else "terminal"
    agent = Agent(model=model, tools=[add], synthesis=mode, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent, config=config)
    events = await collect_events(runtime.execute_message("s1", "Tell me."))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    blocks = [e.block for e in events if isinstance(e, MessageCompleteEvent)]
    [answer] = [b for b in blocks if b.is_answer]
    assert (answer.text, answer.filtered) == ("Here is part", True)
    [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
    assert finished.stop_reason == "content_filter"
    [turn] = await runtime.history("s1")
    assert [b for b in turn.blocks if isinstance(b, TextBlock) and b.is_answer] == [answer]
    # the next turn, in another process: its history comes from the Store
    await runtime.close()
    again = runtime_factory(agent, config=config)
    events = await collect_events(again.execute_message("s1", "Something else, then."))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
    assert finished.stop_reason == "end_turn"
    model.assert_complete()
    asked = model.calls[len(first)].messages
    assert _after_the_cut_answer(asked, "Here is part") == (
        ("assistant", "Here is part"),
        ("assistant", CUT_NOTE),
        ("user", "Something else, then."),
    )


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_an_answer_the_filter_cut_over_http_is_marked_for_the_next_turn(
    runtime_factory: RuntimeFactory,
    openai_server: FakeOpenAIServer,
    transport: Literal["auto", "litellm"],
) -> None:
    openai_server.script(
        "fake-model",
        [Reply.text("Here is part", finish_reason="content_filter"), Reply.text("Sure.")],
    )
    client = LiteLLMClient(
        "openai/fake-model", api_base=openai_server.base_url, api_key="sk", transport=transport
    )
    runtime = runtime_factory(Agent(model=client, tools=[add], skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "Tell me."))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [answer] = [e.block for e in events if isinstance(e, MessageCompleteEvent)]
    assert (answer.text, answer.filtered) == ("Here is part", True)
    [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
    assert finished.stop_reason == "content_filter"
    await collect_events(runtime.execute_message("s1", "Something else, then."))
    sent = openai_server.requests[1]["messages"]
    at = max(i for i, m in enumerate(sent) if m.get("content") == "Here is part")
    assert [(m["role"], m["content"]) for m in sent[at:]] == [
        ("assistant", "Here is part"),
        ("assistant", CUT_NOTE),
        ("user", "Something else, then."),
    ]


def test_an_attempt_that_takes_over_reads_from_the_log_that_the_answer_was_cut() -> None:
    """A takeover after the answer was committed ends the turn without writing it again:
    the log says it was cut, for `run.finished` and the next turn's note."""
    block = TextBlock(block_id="b", text="Here is part", is_answer=True, filtered=True)
    complete = MessageCompleteEvent(session_id="s", turn_id="t", stage_id="synthesize",
                                    ts=datetime.now(UTC), seq=3, block=block,
                                    generation_id="gen_1")  # fmt: skip
    journal = Journal.of([complete])
    assert journal.answer_filtered
    committed = journal.generation("gen_1")
    assert committed is not None
    assert committed_response(committed).stop_reason == "content_filter"
