"""An agent's `output_type`: the answer is asked for in a JSON shape, checked, and asked
again with what was wrong before the turn fails."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, Union

import pytest
from pydantic import BaseModel, Field, ValidationInfo, model_validator
from typing_extensions import TypedDict

from tests.conftest import RuntimeFactory
from tests.helpers import add, until
from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit import Agent, AnswerContext, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.audit import AuditRow
from turnkit.blocks import TextBlock
from turnkit.budgets import BudgetLimit
from turnkit.errors import ConfigurationError
from turnkit.events import (
    ApprovalRequestedEvent,
    BudgetPausedEvent,
    DoneEvent,
    ErrorEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
)
from turnkit.http.models import TurnOut
from turnkit.models import ModelMessage, ModelRequest, Usage
from turnkit.models.litellm import LiteLLMClient
from turnkit.protocols.ai_sdk import UIMessageStreamTranslator
from turnkit.store.sql import SqlStore
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

NO_PLAN = frozenset({"anchor-plan"})


class Sum(BaseModel):
    """The answer to a sum."""

    total: int
    words: str = Field(min_length=3)


VALID = '{"total": 5, "words": "five"}'


def _checks(rows: list[AuditRow]) -> list[tuple[int, bool, tuple[str, ...]]]:
    return [
        (c.attempt, c.valid, c.problems)
        for c in (r.payloads.output_check for r in rows)
        if c is not None
    ]


def _texts(turn_blocks: object) -> list[tuple[str, bool]]:
    return [(b.text, b.is_answer) for b in turn_blocks if isinstance(b, TextBlock)]  # type: ignore[attr-defined]


async def test_the_answer_is_asked_for_in_the_shape_and_checked(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply(VALID)]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add], output_type=Sum, skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    # Every loop call may be the answer, so each asks for the shape.
    for request in model.calls:
        assert request.output is not None
        assert request.output.name == "Sum"
        assert request.output.schema["required"] == ["total", "words"]
    [turn] = await runtime.history("s1")
    assert turn.answer is not None
    assert Sum.model_validate_json(turn.answer) == Sum(total=5, words="five")
    assert _checks(await runtime.audit(events[0].turn_id)) == [(0, True, ())]


async def test_an_answer_that_does_not_validate_is_asked_for_again(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("The total is 5."), ModelStep.text_reply(VALID)])
    runtime = runtime_factory(Agent(model=model, output_type=Sum, skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    # The failed answer stays what it was (narration); the one asked again is the answer.
    completes = [e.block for e in events if isinstance(e, MessageCompleteEvent)]
    assert [(b.text, b.is_answer) for b in completes] == [
        ("The total is 5.", False),
        (VALID, True),
    ]
    again = model.calls[1]
    assert again.messages[: len(model.calls[0].messages)] == model.calls[0].messages
    assert again.messages[-2].role == "assistant"
    assert again.messages[-2].content == "The total is 5."
    assert again.messages[-1].role == "user"
    assert "Your answer was not accepted:" in str(again.messages[-1].content)
    assert "Invalid JSON" in str(again.messages[-1].content)
    assert again.output is not None
    assert again.tool_choice == "none"
    [turn] = await runtime.history("s1")
    assert turn.answer == VALID
    rows = await runtime.audit(events[0].turn_id)
    [(first, valid_first, problems), second] = _checks(rows)
    assert (first, valid_first) == (0, False)
    assert problems
    assert second == (1, True, ())
    [quality] = [r.payloads.synthesis_quality for r in rows if r.payloads.synthesis_quality]
    assert quality.source == "synthesize"
    assert quality.answer_chars == len(VALID)


async def test_a_field_that_fails_names_what_is_wrong(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel(
        [ModelStep.text_reply('{"total": "five", "words": "5"}'), ModelStep.text_reply(VALID)]
    )
    runtime = runtime_factory(Agent(model=model, output_type=Sum, skip_stages=NO_PLAN))
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    told = str(model.calls[1].messages[-1].content)
    assert "- total: Input should be a valid integer" in told
    assert "- words: String should have at least 3 characters" in told


async def test_the_turn_fails_when_no_answer_validates(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel(
        [
            ModelStep.text_reply("five"),
            ModelStep.text_reply("still five"),
            ModelStep.text_reply("It was five."),
            ModelStep.text_reply(VALID),
        ]
    )
    agent = Agent(model=model, output_type=Sum, output_retries=1, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    done = events[-1]
    assert error.code == "output-invalid"
    assert "after 2 answer(s)" in error.message
    assert isinstance(done, DoneEvent)
    assert done.status == "failed"
    assert _checks(await runtime.audit(events[0].turn_id))[-1][:2] == (1, False)
    # The next turn's model reads what was tried and why the turn ended.
    await collect_events(runtime.execute_message("s1", "Try again."))
    seen = [(m.role, str(m.content)) for m in model.calls[2].messages]
    assert ("assistant", "five") in seen
    assert ("assistant", "still five") in seen
    assert any(role == "assistant" and "output-invalid" in text for role, text in seen)
    [first, second] = await runtime.history("s1")
    assert second.answer == VALID
    assert first.error_code == "output-invalid"  # history says why the turn has no answer
    assert TurnOut.model_validate(first).model_dump(by_alias=True)["errorCode"] == (
        "output-invalid"
    )
    assert second.error_code is None


def _with_writer(model: ScriptedModel, writer: ScriptedModel) -> Agent:
    """An agent whose separate synthesis call, by `writer`, writes the answer."""
    return Agent(
        model=model,
        tools=[add],
        synthesis="separate",
        synthesis_model=writer,
        output_type=Sum,
        skip_stages=NO_PLAN,
    )


async def test_a_separate_synthesis_writes_again_with_its_own_model(
    runtime_factory: RuntimeFactory,
) -> None:
    writer = ScriptedModel(
        [ModelStep.text_reply("```json\n" + VALID + "\n```"), ModelStep.text_reply(VALID)],
        name="writer",
    )
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("Added.")]
    )
    runtime = runtime_factory(_with_writer(model, writer))
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    writer.assert_complete()
    # Only the calls that write the answer ask for its shape.
    assert [r.output is not None for r in model.calls] == [False, False]
    assert [r.output is not None for r in writer.calls] == [True, True]
    [turn] = await runtime.history("s1")
    assert turn.answer == VALID
    assert [a for _, a in _texts(turn.blocks)] == [False, False, True]


class Ticket(TypedDict):
    """A TypedDict works as well as a model."""

    title: str
    urgent: bool


async def test_a_typed_dict_and_no_retries(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply('{"title": "Printer", "urgent": "maybe"}')])
    agent = Agent(model=model, output_type=Ticket, output_retries=0, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "File it."))
    model.assert_complete()  # not asked again
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert error.code == "output-invalid"
    assert error.details["problems"] == [
        'urgent: Input should be a valid boolean, unable to interpret input (got "maybe")'
    ]


def test_output_type_must_have_a_json_schema() -> None:
    model = ScriptedModel([])
    with pytest.raises(ConfigurationError, match="has no JSON schema"):
        Agent(model=model, output_type=object())
    with pytest.raises(ConfigurationError, match="output_retries"):
        Agent(model=model, output_type=Sum, output_retries=-1)
    plain = Agent(model=model)
    shaped = Agent(model=model, output_type=Sum)
    assert plain.output is None
    assert shaped.version != plain.version  # a turn is pinned to the shape it asked for
    assert Agent(model=model, output_type=Sum, output_retries=2).version != shaped.version


async def test_a_takeover_does_not_ask_again_for_an_answer_already_checked(
    tmp_path: Path,
) -> None:
    """The first process dies while the answer is asked for again; the one that takes the
    turn over reads the failed answer from the log and asks only for the new one."""
    model = ScriptedModel(
        [ModelStep.text_reply("five"), ModelStep.hang('{"tot'), ModelStep.text_reply(VALID)]
    )
    agent = Agent(model=model, output_type=Sum, skip_stages=NO_PLAN)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", lease_ttl_s=1.0)
    async with SessionRuntime(agent=agent, config=config) as first:
        submission = await first.start("s1", "What is 2 + 3?")
        await until(lambda: len(model.calls) == 2, "the answer is asked for again")
    later = dataclasses.replace(config, recover_in_process=True)
    async with SessionRuntime(agent=agent, config=later) as second:
        events = [e async for e in second.reader().follow(submission.turn_id)]
        rows = await second.audit(submission.turn_id)
        [turn] = await second.history("s1")
    model.assert_complete()
    assert len(model.calls) == 3  # the failed answer was not asked for twice
    assert model.calls[2].messages == model.calls[1].messages
    assert turn.answer == VALID
    assert _checks(rows)[0][:2] == (0, False)
    assert [c[:2] for c in _checks(rows)] == [(0, False), (1, True)]
    assert json.loads(turn.answer) == {"total": 5, "words": "five"}
    assert events


@pytest.fixture(params=["direct", "litellm"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a `LiteLLMClient` sends a call to an OpenAI-compatible server."""
    if request.param == "litellm":  # a logging callback sends every call down litellm's path
        import litellm

        monkeypatch.setattr(litellm, "input_callback", [lambda *_args, **_kw: None])
    return str(request.param)


@pytest.mark.usefixtures("transport")
async def test_the_provider_is_asked_for_the_json_schema_over_http(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    openai_server.script(
        "fake-model",
        [Reply.text("Five.", chunks=2), Reply.text(VALID, chunks=3)],
    )
    client = LiteLLMClient("openai/fake-model", api_base=openai_server.base_url, api_key="sk-t")
    runtime = runtime_factory(Agent(model=client, output_type=Sum, skip_stages=NO_PLAN))
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    assert turn.answer == VALID
    first, again = openai_server.requests
    for body in (first, again):
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "Sum", "schema": Sum.model_json_schema()},
        }
    assert again["messages"][-2] == {"role": "assistant", "content": "Five."}  # type: ignore[index]


@pytest.mark.usefixtures("transport")
async def test_a_strict_response_format_of_the_clients_own_replaces_turnkits(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    strict = {
        "type": "json_schema",
        "json_schema": {"name": "Sum", "strict": True, "schema": Sum.model_json_schema()},
    }
    openai_server.script("fake-model", [Reply.text(VALID, chunks=2)])
    client = LiteLLMClient(
        "openai/fake-model",
        api_base=openai_server.base_url,
        api_key="sk-t",
        extra_body={"response_format": strict},
    )
    runtime = runtime_factory(Agent(model=client, output_type=Sum, skip_stages=NO_PLAN))
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [body] = openai_server.requests
    assert body["response_format"] == strict


async def test_an_answer_asked_for_again_waits_for_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call asked again does not fit the budget: the turn pauses, and once the limit
    is raised it goes on from the failed answer in the log (not asked for twice). It
    follows the first call at once, while that call's spend is still being committed."""
    commit = SqlStore.commit

    async def slow_commit(self: SqlStore, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)  # a store whose commit is a slow round trip
        return await commit(self, *args, **kwargs)

    monkeypatch.setattr(SqlStore, "commit", slow_commit)
    costly = dataclasses.replace(
        ModelStep.text_reply("five"), usage=Usage(input_tokens=740, output_tokens=50)
    )
    model = ScriptedModel([costly, ModelStep.text_reply(VALID)])
    agent = Agent(model=model, output_type=Sum, skip_stages=NO_PLAN)
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'b.db'}",
        budgets="enforce",
        budget_reserve_tokens=50,
        recover_in_process=True,
    )
    limit = BudgetLimit(scope="principal", key="ann", tokens=800)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.set_budget_limit(limit)
        events = await collect_events(runtime.execute_message("s1", "2 + 3?", principal="ann"))
        assert isinstance(events[-1], BudgetPausedEvent), [e.type for e in events]
        turn_id = events[0].turn_id
        await runtime.set_budget_limit(limit.model_copy(update={"tokens": 100_000}))
        async with asyncio.timeout(20):
            while (await runtime.turn(turn_id)).status == "running":
                await asyncio.sleep(0.05)
        logged = [e async for e in runtime.events(turn_id)]
        rows = await runtime.audit(turn_id)
        [turn] = await runtime.history("s1")
    model.assert_complete()
    assert isinstance(logged[-1], DoneEvent)
    assert logged[-1].status == "succeeded"
    assert [e.seq for e in logged] == list(range(1, len(logged) + 1))
    assert turn.answer == VALID
    assert [c[:2] for c in _checks(rows)] == [(0, False), (1, True)]


@tool
async def lookup_invoice(number: str) -> str:
    """Look an invoice up."""
    return f"invoice {number}: 2 charges of 40 EUR"


class Routed(BaseModel):
    """A ticket's team; billing needs the invoice looked up first."""

    team: Literal["billing", "shipping"]

    @model_validator(mode="after")
    def billing_needs_an_invoice(self, info: ValidationInfo) -> Routed:
        turn = info.context
        if not isinstance(turn, AnswerContext):
            return self  # read outside a turn: nothing to check against
        if isinstance(turn.deps, dict) and turn.deps.get("strict"):
            raise ValueError("this deployment refuses every answer")
        if self.team == "billing" and not turn.called("lookup_invoice"):
            raise ValueError("look up the invoice before routing to billing")
        return self


BILLING = '{"team": "billing"}'


async def test_a_validator_reads_the_turn_and_the_model_may_use_tools_to_fix_it(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.text_reply(BILLING),
            ModelStep.tool_call_reply(call("lookup_invoice", number="A1")),
            ModelStep.text_reply(BILLING),
        ]
    )
    agent = Agent(model=model, tools=[lookup_invoice], output_type=Routed, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "I was charged twice."))
    model.assert_complete()
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    again = model.calls[1]
    assert again.tool_choice == "auto"  # asked again inside the loop: tools still usable
    assert again.output is not None
    assert again.messages[-1].role == "user"
    assert "look up the invoice before routing to billing" in str(again.messages[-1].content)
    completes = [e for e in events if isinstance(e, MessageCompleteEvent)]
    assert [(e.stage_id, e.block.text, e.block.is_answer) for e in completes] == [
        ("tool-loop", BILLING, False),
        ("synthesize", BILLING, True),
    ]
    rows = await runtime.audit(events[0].turn_id)
    assert [c[:2] for c in _checks(rows)] == [(0, False), (1, True)]
    [turn] = await runtime.history("s1")
    assert Routed.model_validate_json(turn.answer or "").team == "billing"


async def test_a_takeover_keeps_the_verdict_its_attempt_committed(tmp_path: Path) -> None:
    """The second process's deps would refuse every answer; the failed answer in the log
    stays failed and the answer asked again is checked under the new deps, once."""
    model = ScriptedModel(
        [
            ModelStep.text_reply(BILLING),
            ModelStep.hang('{"te'),
            ModelStep.text_reply('{"team": "shipping"}'),
        ]
    )
    agent = Agent(model=model, tools=[lookup_invoice], output_type=Routed, skip_stages=NO_PLAN)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", lease_ttl_s=1.0)
    async with SessionRuntime(agent=agent, config=config) as first:
        submission = await first.start("s1", "Where is my parcel?")
        await until(lambda: len(model.calls) == 2, "the answer is asked for again")
    later = dataclasses.replace(config, recover_in_process=True)
    async with SessionRuntime(
        agent=agent, config=later, deps=lambda _scope: {"strict": True}
    ) as second:
        async with asyncio.timeout(20):
            while (await second.turn(submission.turn_id)).status == "running":
                await asyncio.sleep(0.05)
        record = await second.turn(submission.turn_id)
        rows = await second.audit(submission.turn_id)
    model.assert_complete()
    assert model.calls[2].messages == model.calls[1].messages  # the same request, once more
    assert record.status == "failed"
    assert record.error_code == "output-invalid"
    assert [c[:2] for c in _checks(rows)] == [(0, False), (1, False)]
    assert _checks(rows)[0][2] == ("Value error, look up the invoice before routing to billing",)


async def test_a_stop_while_the_answer_is_asked_again_keeps_the_next_turns_prefix(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [ModelStep.text_reply("five"), ModelStep.hang('{"total": 5, '), ModelStep.text_reply(VALID)]
    )
    runtime = runtime_factory(Agent(model=model, output_type=Sum, skip_stages=NO_PLAN))
    submission = await runtime.start("s1", "2 + 3?")
    async with asyncio.timeout(20):
        async for event in runtime.reader().events(submission.turn_id):
            if isinstance(event, MessageDeltaEvent) and "total" in event.text:
                assert await runtime.cancel(submission.turn_id) == "cancelled"
                break
    second = await collect_events(runtime.execute_message("s1", "again"))
    assert isinstance(second[-1], DoneEvent)
    assert second[-1].status == "succeeded"
    # The next request extends the stopped one: the message asking again included.
    assert model.calls[2].messages[: len(model.calls[1].messages)] == model.calls[1].messages


@pytest.mark.parametrize("output_type", [Sum, None], ids=["asked-again", "separate-synthesis"])
async def test_an_answer_cut_by_the_output_limit_keeps_the_next_turns_prefix(
    runtime_factory: RuntimeFactory, output_type: type[Sum] | None
) -> None:
    if output_type is None:  # a separate synthesis call, cut: the same ending
        steps = [
            ModelStep.text_reply("Adding."),
            ModelStep.truncated("The long"),
            ModelStep.text_reply("Again."),
        ]
        agent = Agent(
            model=ScriptedModel([]), tools=[add], synthesis="separate", skip_stages=NO_PLAN
        )
    else:
        steps = [ModelStep.text_reply("five"), ModelStep.truncated('{"total": 5')]
        agent = Agent(model=ScriptedModel([]), output_type=Sum, skip_stages=NO_PLAN)
    model = ScriptedModel([*steps, ModelStep.text_reply(VALID)])
    runtime = runtime_factory(dataclasses.replace(agent, model=model))
    first = await collect_events(runtime.execute_message("s1", "2 + 3?"))
    assert isinstance(first[-1], DoneEvent)
    assert first[-1].error_code == "agent_output_limit_exceeded"
    second = await collect_events(runtime.execute_message("s1", "again"))
    assert isinstance(second[-1], DoneEvent)
    assert second[-1].status == "succeeded"
    assert model.calls[2].messages[: len(model.calls[1].messages)] == model.calls[1].messages


class Picky(BaseModel):
    """A validator that assumes a JSON object."""

    total: int

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: dict[str, object]) -> dict[str, object]:
        data["total"] = int(str(data["total"]))
        return data


async def test_a_validator_that_raises_any_error_asks_again(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("[5]"), ModelStep.text_reply('{"total": 5}')])
    runtime = runtime_factory(Agent(model=model, output_type=Picky, skip_stages=NO_PLAN))
    events = await collect_events(runtime.execute_message("s1", "2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert "TypeError: list indices must be integers" in str(model.calls[1].messages[-1].content)


class Node(BaseModel):
    """A model that nests itself."""

    name: str
    children: list[Node] = []


def test_a_model_that_nests_itself_is_an_output_type() -> None:
    agent = Agent(model=ScriptedModel([]), output_type=Node)
    assert agent.output is not None
    assert agent.output.shape.name == "Node"
    assert agent.output.problems('{"name": "a", "children": [{"name": "b"}]}') == ()


def test_a_model_with_tools_is_asked_for_the_shape_only_where_its_provider_takes_it() -> None:
    """litellm turns `response_format` into a forced JSON tool call for models without a
    native schema mode, which would leave the agent's own tools uncallable."""
    import litellm

    shape = Agent(model=ScriptedModel([]), output_type=Sum).output
    assert shape is not None
    tools = Agent(model=ScriptedModel([]), tools=[add]).registry().specs()

    def sent(model: str, *, usable: bool) -> bool:
        client = LiteLLMClient(model, api_key="sk-t")
        request = ModelRequest(
            messages=(ModelMessage(role="user", content="hi"),),
            tools=tools,
            tool_choice="auto" if usable else "none",
            output=shape.shape,
        )
        return "response_format" in client._call_kwargs(litellm, request)

    assert sent("anthropic/claude-3-5-sonnet-20240620", usable=True) is False
    assert sent("anthropic/claude-3-5-sonnet-20240620", usable=False) is True
    assert sent("anthropic/claude-sonnet-4-5", usable=True) is True
    assert sent("openai/gpt-4o-mini", usable=True) is True


def test_the_version_counts_the_type_and_retries_are_checked_without_one() -> None:
    model = ScriptedModel([])

    class Other(BaseModel):
        total: int
        words: str = Field(min_length=3)

    Other.__doc__ = Sum.__doc__
    assert (
        Agent(model=model, output_type=Other).version != Agent(model=model, output_type=Sum).version
    )
    with pytest.raises(ConfigurationError, match="output_retries"):
        Agent(model=model, output_retries=-1)


async def test_a_synthesis_answer_that_calls_a_tool_is_told_no_tool_can_be_used(
    runtime_factory: RuntimeFactory,
) -> None:
    writer = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply(VALID)],
        name="writer",
    )
    model = ScriptedModel([ModelStep.text_reply("Let me write it up.")])
    runtime = runtime_factory(_with_writer(model, writer))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    told = str(writer.calls[1].messages[-1].content)
    assert "- no tool can be used now: answer with the JSON object alone" in told
    assert writer.calls[1].tool_choice == "none"


async def test_compaction_inside_the_turn_buys_no_more_answers_than_output_retries(
    runtime_factory: RuntimeFactory,
) -> None:
    """Each failed answer is long, so compaction folds the older rounds (and the messages
    asking again) away; the count of failed answers comes from the log."""
    bad = "The total is five, " + "and I am sure of it " * 70
    model = ScriptedModel(
        [ModelStep.text_reply(bad)] * 8 + [ModelStep.text_reply(VALID)], context_window=900
    )
    agent = Agent(model=model, tools=[add], output_type=Sum, output_retries=2, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    async with asyncio.timeout(30):
        events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    rows = await runtime.audit(events[0].turn_id)
    assert [r for r in rows if r.payloads.compaction is not None]  # compaction did run
    assert [e.code for e in events if isinstance(e, ErrorEvent)] == ["output-invalid"]
    assert [c[:2] for c in _checks(rows)] == [(0, False), (1, False), (2, False)]
    assert len(model.calls) == 3


@tool
async def fetch_page(n: int) -> str:
    """A long page of a document."""
    return f"page {n}: " + "text " * 60


async def test_validators_see_the_turns_tool_calls_through_compaction(
    runtime_factory: RuntimeFactory,
) -> None:
    rounds = [ModelStep.tool_call_reply(call("fetch_page", n=n)) for n in range(8)]
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("lookup_invoice", number="A1")),
            *rounds,
            ModelStep.text_reply(BILLING),
            ModelStep.text_reply(BILLING),  # only if the first was refused
        ],
        context_window=900,
    )
    agent = Agent(
        model=model, tools=[lookup_invoice, fetch_page], output_type=Routed, skip_stages=NO_PLAN
    )
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "I was charged twice."))
    rows = await runtime.audit(events[0].turn_id)
    assert [r for r in rows if r.payloads.compaction is not None]  # the early rounds folded
    assert [c[:2] for c in _checks(rows)] == [(0, True)]


@tool
async def broken_lookup(number: str) -> str:
    """Look an invoice up (the billing system is down)."""
    raise RuntimeError("billing system unreachable")


class RoutedStrict(BaseModel):
    """Billing only after an invoice lookup that worked."""

    team: Literal["billing", "shipping"]

    @model_validator(mode="after")
    def billing_needs_an_invoice(self, info: ValidationInfo) -> RoutedStrict:
        turn = info.context
        if (
            isinstance(turn, AnswerContext)
            and self.team == "billing"
            and not turn.called("broken_lookup")
        ):
            failed = [c.error for c in turn.tool_calls if c.name == "broken_lookup"]
            raise ValueError(f"look up the invoice before routing to billing ({failed})")
        return self


async def test_a_call_that_failed_does_not_count_as_called(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("broken_lookup", number="A1")),
            ModelStep.text_reply(BILLING),
            ModelStep.text_reply('{"team": "shipping"}'),
        ]
    )
    agent = Agent(model=model, tools=[broken_lookup], output_type=RoutedStrict, skip_stages=NO_PLAN)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "charged twice"))
    rows = await runtime.audit(events[0].turn_id)
    [(attempt, valid, problems), second] = _checks(rows)
    assert (attempt, valid) == (0, False)
    assert "billing system unreachable" in problems[0]  # the failed call's error is there
    assert second[:2] == (1, True)


async def test_the_ai_sdk_answer_part_is_marked_after_a_thinking_summary(
    runtime_factory: RuntimeFactory,
) -> None:
    answer = '{"total": 4, "words": "' + "four " * 40 + '"}'  # long enough for a summary
    model = ScriptedModel(
        [
            ModelStep(text="", thinking="maybe add", tool_calls=(call("add", a=2, b=2),)),
            ModelStep.text_reply(answer, thinking="done"),
        ]
    )
    utility = ScriptedModel(
        [ModelStep.text_reply("The assistant added the numbers.")], name="background"
    )
    agent = Agent(
        model=model, utility_model=utility, tools=[add], output_type=Sum, skip_stages=NO_PLAN
    )
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "2+2?"))
    [done] = [e for e in events if isinstance(e, MessageCompleteEvent) and e.block.is_answer]
    assert any(e.type == "thinking.complete" for e in events)
    translator = UIMessageStreamTranslator(message_id=events[0].turn_id)
    out = translator.start()
    for event in events:
        out += translator.translate(event)
    out += translator.finish()
    ends = [c for c in out if c["type"] == "text-end" and c["id"] == done.block.block_id]
    assert ends == [
        {
            "type": "text-end",
            "id": done.block.block_id,
            "providerMetadata": {"turnkit": {"answer": True}},
        }
    ]
    assert [c["type"] for c in out].count("start-step") == [c["type"] for c in out].count(
        "finish-step"
    )


class Refusal(BaseModel):
    """Why the agent will not route the ticket."""

    kind: Literal["refusal"]
    reason: str


class Route(BaseModel):
    """Where the ticket goes."""

    kind: Literal["route"]
    team: Literal["billing", "shipping"]


async def test_a_union_is_asked_for_wrapped_and_parsed_back(
    runtime_factory: RuntimeFactory,
) -> None:
    """Providers take only an object at a schema's top: a union is asked for as
    {"response": ...}, checked as that, and `parse` gives the value back."""
    model = ScriptedModel(
        [
            ModelStep.text_reply('{"kind": "route", "team": "billing"}'),  # not wrapped
            ModelStep.text_reply('{"response": {"kind": "refusal", "reason": "spam"}}'),
        ]
    )
    agent = Agent(model=model, output_type=Route | Refusal, skip_stages=NO_PLAN)
    assert agent.output is not None
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "BUY CHEAP WATCHES"))
    model.assert_complete()
    shape = model.calls[0].output
    assert shape is not None
    assert shape.name == "answer"
    assert shape.schema["type"] == "object"
    assert shape.schema["required"] == ["response"]
    assert "response: Field required" in str(model.calls[1].messages[-1].content)
    [turn] = await runtime.history("s1")
    assert agent.output.parse(turn.answer or "") == Refusal(kind="refusal", reason="spam")


def test_a_list_or_a_number_is_wrapped_too() -> None:
    model = ScriptedModel([])
    numbers = Agent(model=model, output_type=list[int]).output
    assert numbers is not None
    assert numbers.parse('{"response": [1, 2]}') == [1, 2]
    assert numbers.problems('{"response": ["x"]}') == (
        "response.0: Input should be a valid integer, unable to parse string as an integer "
        '(got "x")',
    )
    assert (
        Agent(model=model, output_type=int).version != Agent(model=model, output_type=str).version
    )
    sums = Agent(model=model, output_type=Sum).output
    assert sums is not None
    assert sums.parse(VALID) == Sum(total=5, words="five")  # an object is not wrapped


_UNION_VERSION = """
from typing import Annotated
from pydantic import AfterValidator, BaseModel
from turnkit import Agent
from turnkit.testing import ScriptedModel
def positive(v: int) -> int:
    return v
class Refund(BaseModel):
    amount: int
answer = Refund | list[Annotated[int, AfterValidator(positive)]]
print(Agent(model=ScriptedModel([]), output_type=answer).version)
"""


def test_a_union_agents_version_is_the_same_in_every_process() -> None:
    """A turn is pinned to its agent's version: another process must compute it alike
    (a union has no name of its own, and a validator function's repr has an address)."""
    versions = {
        subprocess.run(
            [sys.executable, "-c", _UNION_VERSION],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for _ in range(2)
    }
    assert len(versions) == 1


def _capped(limit: int, qualname: str) -> type[BaseModel]:
    class Refund(BaseModel):
        amount: int

        @model_validator(mode="after")
        def capped(self) -> Refund:
            if self.amount > limit:
                raise ValueError("too much")
            return self

    Refund.__qualname__ = qualname
    return Refund


def test_replacing_a_member_of_a_union_makes_a_new_version() -> None:
    lenient, strict = _capped(1000, "Lenient.Refund"), _capped(10, "Strict.Refund")
    model = ScriptedModel([])
    for union in (lambda t: Union[t, int], lambda t: t | None, lambda t: list[t]):  # noqa: UP007 - the typing form, as well as `|`
        assert (
            Agent(model=model, output_type=union(lenient)).version
            != Agent(model=model, output_type=union(strict)).version
        )
    shape = Agent(model=model, output_type=Union[Sum, int]).output  # noqa: UP007
    assert shape is not None
    assert shape.shape.name == "answer"  # a wrapped type is asked for by one name


SEEN: list[tuple[tuple[str, dict[str, object], object, str | None], ...]] = []


class Seen(BaseModel):
    """Records what its validator is shown of the turn's tool calls."""

    total: int

    @model_validator(mode="after")
    def record(self, info: ValidationInfo) -> Seen:
        if isinstance(info.context, AnswerContext):
            SEEN.append(
                tuple(
                    (c.name, dict(c.arguments), c.output, c.error) for c in info.context.tool_calls
                )
            )
        return self


@tool(approval="always")
async def send_note(text: str = "default") -> str:
    """Send a note."""
    return f"sent {text}"


@pytest.mark.parametrize(
    ("decision", "seen"),
    [
        (
            Approve(arguments={"text": "final"}),
            ("send_note", {"text": "final"}, "sent final", None),
        ),
        (Approve(arguments={}), ("send_note", {}, "sent default", None)),
    ],
    ids=["changed", "emptied"],
)
async def test_validators_see_the_arguments_a_person_approved(
    runtime_factory: RuntimeFactory, decision: Approve, seen: tuple[object, ...]
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_note", text="draft")),
            ModelStep.text_reply('{"total": 5}'),
        ]
    )
    runtime = runtime_factory(
        Agent(model=model, tools=[send_note], output_type=Seen, skip_stages=NO_PLAN)
    )
    SEEN.clear()
    asked = (await collect_events(runtime.execute_message("s1", "note it")))[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    await runtime.resume(asked.turn_id, asked.request_id, decision)
    async with asyncio.timeout(20):
        while (await runtime.turn(asked.turn_id)).status == "running":
            await asyncio.sleep(0.05)
    assert SEEN[-1] == (seen,)
