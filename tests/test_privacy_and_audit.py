"""What never reaches clients (raw reasoning, planner output), and calls that always audit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from tests.conftest import RuntimeFactory
from turnkit import Agent, ModelFamily, ProviderError
from turnkit.events import ErrorEvent, MessageDeltaEvent, encode_event
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallDelta, Usage
from turnkit.testing import FakeClock, ModelStep, ScriptedModel, collect_events


async def test_raw_reasoning_never_leaves_the_runtime(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Paris.", thinking="SECRET chain of thought")])
    runtime = runtime_factory(Agent(model=model))
    events = await collect_events(runtime.execute_message("s1", "Capital of France?"))
    assert not [e for e in events if e.type.startswith("thinking.")]  # type: ignore[attr-defined]
    assert all(b"SECRET" not in encode_event(e) for e in events)
    stored = [e async for e in runtime.events(events[0].turn_id)]
    assert all(b"SECRET" not in encode_event(e) for e in stored)  # type: ignore[arg-type]


async def test_the_planners_output_is_not_streamed_as_prose(
    runtime_factory: RuntimeFactory,
) -> None:
    planner = ScriptedModel([ModelStep.text_reply('{"intent": "greet", "depth": "none"}')])
    model = ScriptedModel([ModelStep.text_reply("Hello!")])
    runtime = runtime_factory(Agent(model=model, utility_model=planner))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    deltas = [e for e in events if isinstance(e, MessageDeltaEvent)]
    assert {d.stage_id for d in deltas} == {"synthesize"}
    rows = await runtime.audit(events[0].turn_id)
    plan = rows[0].payloads.plan_generation
    assert plan is not None
    assert plan.intent == "greet"


async def test_a_model_call_that_crashes_still_leaves_its_audit_row(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.fail(RuntimeError("client bug"))])
    runtime = runtime_factory(Agent(model=model))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert error.code == "internal-error"
    rows = [r for r in await runtime.audit(events[0].turn_id) if r.call is not None]
    assert len(rows) == len(model.calls) == 1
    assert rows[0].call is not None
    assert (rows[0].call.outcome, rows[0].call.error_code) == ("error", "internal-error")


async def test_error_events_carry_the_errors_details(runtime_factory: RuntimeFactory) -> None:
    rungs = [
        ScriptedModel([ModelStep.fail(ProviderError("busy", status_code=503))], name="a"),
        ScriptedModel([ModelStep.fail(ProviderError("busy", status_code=503))], name="b"),
    ]
    runtime = runtime_factory(Agent(model=ModelFamily("fam", rungs)))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert error.details == {"family": "fam", "attempts": ["a", "b"]}


async def test_the_next_turn_learns_the_last_one_hit_the_output_limit(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.truncated("The long answer is"), ModelStep.text_reply("ok")])
    runtime = runtime_factory(Agent(model=model))
    first = await collect_events(runtime.execute_message("s1", "write a lot"))
    assert first[-1].error_code == "agent_output_limit_exceeded"  # type: ignore[attr-defined]
    rows = await runtime.audit(first[0].turn_id)
    assert rows[-1].call is not None
    assert rows[-1].call.outcome == "error"  # a cut answer is not audited as fine
    await collect_events(runtime.execute_message("s1", "shorter please"))
    contents = [m.content for m in model.calls[1].messages]
    assert any("agent_output_limit_exceeded" in c for c in contents)


async def test_throttled_tool_deltas_lose_no_argument_text(
    runtime_factory: RuntimeFactory,
) -> None:
    from tests.helpers import add
    from turnkit.events import ToolDeltaEvent
    from turnkit.testing import raw_call

    args = '{"a": 1, "b": 2}'
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(raw_call("add", args)),
            ModelStep.text_reply("3"),
            ModelStep.text_reply("3"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "1+2"))
    deltas = [e for e in events if isinstance(e, ToolDeltaEvent)]
    assert deltas
    assert "".join(d.arguments_delta for d in deltas) == args[: deltas[-1].chars]


class _SlowArguments:
    """Streams two tool calls' arguments a piece at a time, 0.1 s (fake) apart, then answers."""

    model = "slow-args"
    provider = "test"

    def __init__(self, clock: FakeClock, pieces: int) -> None:
        self.clock, self.pieces, self.calls = clock, pieces, 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.calls += 1
        if self.calls > 1:
            yield TextDelta("3")
            yield Finish(stop_reason="end_turn", usage=Usage(input_tokens=5, output_tokens=1))
            return
        for index in (0, 1):
            yield ToolCallDelta(index=index, tool_call_id=f"c{index}", name="add", arguments="")
        for _ in range(self.pieces):
            self.clock.advance(0.1)
            for index in (0, 1):
                yield ToolCallDelta(index=index, arguments=" ")
        for index in (0, 1):
            yield ToolCallDelta(index=index, arguments='{"a": 1, "b": 2}')
        yield Finish(stop_reason="tool_use", usage=Usage(input_tokens=5, output_tokens=9))


async def test_tool_deltas_go_out_at_most_twice_a_second_per_call(
    runtime_factory: RuntimeFactory,
) -> None:
    """Arguments streamed for 2 s go out as a few reports per call, each 0.5 s or more
    after the one before (a client redraws a call being written, it does not need every
    piece); every call has its own pace, and nothing written is lost."""
    from tests.helpers import add
    from turnkit.events import ToolDeltaEvent

    clock = FakeClock()
    model = _SlowArguments(clock, pieces=20)
    runtime = runtime_factory(Agent(model=model, tools=[add]), clock=clock)
    events = await collect_events(runtime.execute_message("s1", "1+2, twice"))
    deltas = [e for e in events if isinstance(e, ToolDeltaEvent)]
    by_call = {
        call: [d for d in deltas if d.tool_call_id == call]
        for call in dict.fromkeys(d.tool_call_id for d in deltas)
    }
    assert len(by_call) == 2
    for sent in by_call.values():
        gaps = [(b.ts - a.ts).total_seconds() for a, b in zip(sent, sent[1:], strict=False)]
        assert 3 <= len(sent) <= 5, gaps  # 2 s of pieces: one at once, then each 0.5 s
        assert min(gaps) >= 0.5 - 1e-6, gaps
        assert "".join(d.arguments_delta for d in sent) == " " * sent[-1].chars


async def test_enrichment_points_at_the_answer_block(runtime_factory: RuntimeFactory) -> None:
    from turnkit.blocks import TextBlock, ToolResultBlock
    from turnkit.events import Citation, MessageCitationsEvent, MessageCompleteEvent
    from turnkit.plugins import Enrichment, Plugin, PluginContext

    class Cite(Plugin):
        name = "cite"

        async def enrich_message(
            self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
        ) -> Enrichment | None:
            return Enrichment(citations=(Citation(source="doc-1", quote=answer.text[:5]),))

    model = ScriptedModel([ModelStep.text_reply("Cited answer.")])
    runtime = runtime_factory(Agent(model=model, plugins=[Cite()]))
    events = await collect_events(runtime.execute_message("s1", "cite it"))
    answer = next(e for e in events if isinstance(e, MessageCompleteEvent))
    [cited] = [e for e in events if isinstance(e, MessageCitationsEvent)]
    assert cited.block_id == answer.block.block_id
    assert cited.citations[0].quote == "Cited"
