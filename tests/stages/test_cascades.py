"""Family-strict model cascades and in-class tool cascades (DESIGN §7)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from tests.conftest import RuntimeFactory
from tests.helpers import durable

from turnkit import Agent, ConfigurationError, ModelFamily, ProviderError, tool
from turnkit.events import (
    DoneEvent,
    ErrorEvent,
    ProviderCascadeEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
)
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, Usage
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


async def test_rung_one_429_rung_two_answers(runtime_factory: RuntimeFactory) -> None:
    first = ScriptedModel(
        [ModelStep.fail(ProviderError("slow down", status_code=429))], name="m-large"
    )
    second = ScriptedModel([ModelStep.text_reply("Answer from rung two.")], name="m-small")
    family = ModelFamily("m", [first, second])
    runtime = runtime_factory(Agent(model=family))
    events = await collect_events(runtime.execute_message("s1", "hello"))

    cascades = [e for e in events if isinstance(e, ProviderCascadeEvent)]
    assert len(cascades) == 1
    step = cascades[0]
    assert (step.from_model, step.to_model, step.status_code) == ("m-large", "m-small", 429)
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    history = await runtime.history("s1")
    assert history[0].answer == "Answer from rung two."
    rows = await runtime.audit(events[0].turn_id)
    fallback = [r for r in rows if r.payloads.fallback_step is not None]
    assert len(fallback) == 1
    assert fallback[0].call is not None
    assert fallback[0].call.outcome == "error"
    assert fallback[0].call.rung == 0
    answered = [r for r in rows if r.payloads.synthesis_quality is not None][0]
    assert answered.call is not None
    assert answered.call.model == "m-small"
    assert answered.call.rung == 1
    assert answered.payloads.provider_cascade is not None
    assert answered.payloads.provider_cascade.attempts == ("m-large", "m-small")


async def test_every_rung_failing_ends_family_exhausted(runtime_factory: RuntimeFactory) -> None:
    rungs = [
        ScriptedModel([ModelStep.fail(ProviderError("overloaded", status_code=529))], name="a"),
        ScriptedModel([ModelStep.fail(ProviderError("boom", status_code=500))], name="b"),
    ]
    # The utility model serves anchor-plan only; it must never stand in for the family.
    outsider = ScriptedModel(
        [ModelStep.text_reply('{"intent": "x", "depth": "none"}')], name="other-family"
    )
    runtime = runtime_factory(Agent(model=ModelFamily("fam", rungs), utility_model=outsider))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert [e.code for e in errors] == ["family-exhausted"]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "failed"
    assert done.error_code == "family-exhausted"
    assert len(outsider.calls) == 1  # the utility model was never used as a fallback
    cascades = [e for e in durable(events) if isinstance(e, ProviderCascadeEvent)]
    assert [(c.from_model, c.to_model) for c in cascades] == [("a", "b"), ("b", None)]
    record = await runtime.turn(events[0].turn_id)
    assert (record.status, record.error_code) == ("failed", "family-exhausted")
    assert errors[0].message == (
        "every rung of model family 'fam' failed (a: overloaded; b: boom). Retry later, or "
        "pick another family: turnkit never widens a cascade on its own"
    )


async def test_a_lone_model_that_fails_says_why_in_its_own_words(
    runtime_factory: RuntimeFactory,
) -> None:
    """A plain model string is a family of one: no talk of rungs and families it never had."""
    lone = ScriptedModel([ModelStep.fail(ProviderError("overloaded", status_code=529))], name="m")
    runtime = runtime_factory(Agent(model=lone, skip_stages=frozenset({"anchor-plan"})))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert (error.code, error.message) == ("family-exhausted", "overloaded")


async def test_non_retriable_error_does_not_walk(runtime_factory: RuntimeFactory) -> None:
    second = ScriptedModel([], name="b")
    family = ModelFamily(
        "fam",
        [
            ScriptedModel(
                [ModelStep.fail(ProviderError("bad request", status_code=400))], name="a"
            ),
            second,
        ],
    )
    runtime = runtime_factory(Agent(model=family))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    assert [e.code for e in events if isinstance(e, ErrorEvent)] == ["provider-error"]
    assert second.calls == []


async def test_tool_cascade_pivots_to_the_next_in_class_tool(
    runtime_factory: RuntimeFactory,
) -> None:
    @tool
    async def mirror_search(query: str) -> str:
        """Search a mirror."""
        return f"mirror: {query}"

    @tool(fallbacks=[mirror_search])
    async def search(query: str) -> str:
        """Search the primary index."""
        raise ConnectionError("primary index is down")

    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("search", query="q3")),
            ModelStep.text_reply("Found it."),
            ModelStep.text_reply("Q3 is in the mirror."),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[search]))
    events = await collect_events(runtime.execute_message("s1", "find q3"))
    completed = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert len(completed) == 1
    assert completed[0].result.output == "mirror: q3"
    assert completed[0].tool_name == "mirror_search"  # who answered, after the pivot
    rows = await runtime.audit(events[0].turn_id)
    pivots = [r.payloads.tool_fallback_step for r in rows if r.payloads.tool_fallback_step]
    assert len(pivots) == 1
    assert (pivots[0].from_tool, pivots[0].to_tool) == ("search", "mirror_search")
    assert "primary index is down" in pivots[0].reason
    assert model.calls[0].tools[0].name == "search"  # the model sees one tool


class _Unfinished:
    """A hand-written client whose stream stops without its `Finish` (a mistake, or a cut)."""

    model, provider = "half", "mine"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("half an ans")


async def test_a_stream_without_its_finish_is_a_failed_rung_the_next_one_answers(
    runtime_factory: RuntimeFactory,
) -> None:
    """It is cut off: its rung fails (audited, retriable) and the family walks on."""
    second = ScriptedModel([ModelStep.text_reply("A whole answer.")], name="whole")
    runtime = runtime_factory(Agent(model=ModelFamily("fam", [_Unfinished(), second])))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    [step] = [e for e in events if isinstance(e, ProviderCascadeEvent)]
    assert (step.from_model, step.to_model) == ("half", "whole")
    assert (await runtime.history("s1"))[0].answer == "A whole answer."
    rows = await runtime.audit(events[0].turn_id)
    [failed] = [r for r in rows if r.payloads.fallback_step is not None]
    assert failed.call is not None
    assert (failed.call.model, failed.call.outcome) == ("half", "error")


async def test_a_lone_stream_without_its_finish_fails_the_turn_with_its_row(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=_Unfinished()))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert "without a Finish chunk" in error.message
    rows = await runtime.audit(events[0].turn_id)
    calls = [r.call for r in rows if r.call is not None and r.call.model == "half"]
    assert [c.outcome for c in calls] == ["error"]  # one row per model call, however it ended


class _OpenAIStyle:
    """A hand-written client that passes OpenAI's finish reason through as it is."""

    model, provider = "ported", "mine"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("A long answer that got cu")
        yield Finish("length", Usage(output_tokens=4096))  # type: ignore[arg-type]


async def test_a_stop_reason_turnkit_does_not_know_never_passes_for_a_whole_answer(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=_OpenAIStyle()))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "failed"
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert "'length' is 'max_tokens'" in error.message
    assert (await runtime.history("s1"))[0].answer is None  # the cut text is no answer


async def test_a_whole_number_retry_after_is_the_familys_wait_too(
    runtime_factory: RuntimeFactory,
) -> None:
    rungs = [
        ScriptedModel([ModelStep.fail(ProviderError("busy", status_code=429, retry_after_s=3))]),
        ScriptedModel([ModelStep.fail(ProviderError("busy", status_code=429, retry_after_s=5))]),
    ]
    runtime = runtime_factory(Agent(model=ModelFamily("fam", rungs)))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert error.code == "family-exhausted"
    assert (error.details or {}).get("retry_after_s") == 3.0  # the first rung back


class _Unpriced:
    """A hand-written client that reports no usage."""

    model, provider = "unpriced", "mine"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("x" * 400)
        yield Finish("end_turn")


async def test_a_call_whose_client_reports_no_usage_is_counted_not_free(
    runtime_factory: RuntimeFactory,
) -> None:
    """Budgets must see it: its tokens are estimated, as for a call cut short."""
    runtime = runtime_factory(Agent(model=_Unpriced()))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    rows = await runtime.audit(events[0].turn_id)
    [answered] = [r.call for r in rows if r.call is not None and r.call.model == "unpriced"]
    assert answered.output_tokens >= 90  # 400 characters, about four to a token
    assert answered.input_tokens > 0
    assert answered.cost_usd == 0.0  # turnkit prices only what litellm prices
    finished = [e for e in events if e.type == "run.finished"][0]
    assert finished.context_tokens == answered.input_tokens + answered.output_tokens


@tool
async def mirror_lookup(order_id: str) -> str:
    """Look an order up on the mirror."""
    return f"{order_id}: shipped (mirror)"


@tool(timeout_s=0.2, fallbacks=[mirror_lookup])
async def lookup(order_id: str) -> str:
    """Look an order up (a service that sometimes hangs)."""
    await asyncio.sleep(30)
    return f"{order_id}: shipped"


@tool(timeout_s=0.2)
async def slow_lookup(order_id: str) -> str:
    """Look an order up, slowly."""
    await asyncio.sleep(30)
    return f"{order_id}: shipped"


async def test_a_tool_past_its_timeout_fails_a_call_the_model_reads(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("slow_lookup", order_id="A-1")),
        ModelStep.text_reply("The lookup timed out."),
        ModelStep.tool_call_reply(call("lookup", order_id="A-2")),
        ModelStep.text_reply("Shipped."),
    ])  # fmt: skip
    runtime = runtime_factory(Agent(model=model, tools=[slow_lookup, lookup]))
    async with asyncio.timeout(10):  # not the tools' 30 s
        first = await collect_events(runtime.execute_message("s1", "where is A-1?"))
        second = await collect_events(runtime.execute_message("s1", "and A-2?"))
    [failed] = [e for e in first if isinstance(e, ToolFailedEvent)]
    assert failed.code == "tool-failed"
    assert "did not finish within 0.2 s and was stopped" in (failed.result.error or "")
    assert "did not finish within 0.2 s" in model.calls[1].messages[-1].content
    assert isinstance(first[-1], DoneEvent)
    assert first[-1].status == "succeeded"  # the turn went on: the model read the failure
    [answered] = [e for e in second if isinstance(e, ToolCompletedEvent)]
    assert answered.result.output == "A-2: shipped (mirror)"  # the class tried its next member


def test_a_timeout_that_is_not_a_duration_is_refused_where_it_is_given() -> None:
    with pytest.raises(ConfigurationError, match="timeout_s of the tool 'late'"):

        @tool(timeout_s=0)
        async def late() -> str:
            """Never."""
            return "x"


async def test_a_failure_without_words_is_named_by_its_type_alone(
    runtime_factory: RuntimeFactory,
) -> None:
    first = ScriptedModel([ModelStep.fail(TimeoutError())], name="a")
    second = ScriptedModel([ModelStep.text_reply("Fine.")], name="b")
    family = ModelFamily("f", [first, second], is_retriable=lambda exc: True)
    runtime = runtime_factory(Agent(model=family))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    [step] = [e for e in events if isinstance(e, ProviderCascadeEvent)]
    assert step.reason == "TimeoutError"  # not "TimeoutError: "
