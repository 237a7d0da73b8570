"""A tool-using turn through the public API: event order, blocks, audit rows."""

from __future__ import annotations

from tests.conftest import RuntimeFactory
from tests.helpers import add, durable
from turnkit import Agent
from turnkit.blocks import TextBlock, ToolResultBlock, ToolUseBlock, UserBlock
from turnkit.events import (
    DoneEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    ToolCompletedEvent,
)
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=2, b=3), text="Adding."),
            ModelStep.text_reply("2 + 3 = 5."),  # names no tool: this text is the answer
        ]
    )


async def test_tool_using_turn_event_order(runtime_factory: RuntimeFactory) -> None:
    model = _script()
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))

    assert [(e.type, e.stage_id) for e in durable(events)] == [
        ("turn.started", "runtime"),
        ("step.start", "anchor-plan"),
        ("step.end", "anchor-plan"),
        ("step.start", "tool-loop"),
        ("message.complete", "tool-loop"),
        ("tool.started", "tool-loop"),
        ("tool.completed", "tool-loop"),
        ("step.end", "tool-loop"),
        ("step.start", "tool-loop"),
        ("step.end", "tool-loop"),
        ("step.start", "synthesize"),
        ("message.complete", "synthesize"),
        ("step.end", "synthesize"),
        ("step.start", "post-turn"),
        ("usage", "post-turn"),
        ("step.end", "post-turn"),
        ("checkpoint.created", "post-turn"),
        ("run.finished", "post-turn"),
        ("done", "post-turn"),
    ]
    model.assert_complete()
    # Deltas come before the block they build, and rebuild exactly its text.
    answer = next(e for e in events if isinstance(e, MessageCompleteEvent) and e.block.is_answer)
    deltas = [
        e
        for e in events
        if isinstance(e, MessageDeltaEvent) and e.block_id == answer.block.block_id
    ]
    assert "".join(d.text for d in deltas) == answer.block.text == "2 + 3 = 5."
    assert events.index(deltas[-1]) < events.index(answer)
    completed = next(e for e in events if isinstance(e, ToolCompletedEvent))
    assert completed.result.output == 5
    last = events[-1]
    assert isinstance(last, DoneEvent)
    assert last.status == "succeeded"
    assert (await runtime.turn(last.turn_id)).status == "succeeded"


async def test_history_returns_blocks_in_order(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory(Agent(model=_script(), tools=[add]))
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    [turn] = await runtime.history("s1")
    kinds = [type(b) for b in turn.blocks]
    assert kinds == [UserBlock, TextBlock, ToolUseBlock, ToolResultBlock, TextBlock]
    assert turn.answer == "2 + 3 = 5."
    assert turn.status == "succeeded"
    narration = turn.blocks[1]
    assert isinstance(narration, TextBlock)
    assert narration.text == "Adding."
    assert not narration.is_answer


async def test_exactly_one_synthesis_row_and_one_row_per_model_call(
    runtime_factory: RuntimeFactory,
) -> None:
    model = _script()
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    rows = await runtime.audit(events[0].turn_id)
    model_rows = [r for r in rows if r.call is not None]
    assert len(model_rows) == len(model.calls) == 2  # a one-tool turn makes two calls
    assert [r.payloads.kinds() for r in rows] == [
        ("planGeneration",),
        ("cacheBreakpoint", "toolSelection"),
        ("cacheBreakpoint",),
        ("synthesisQuality",),  # the loop's last call wrote the answer: no call of its own
    ]
    assert [r.identity.seq_within_turn for r in rows] == [1, 2, 3, 4]
    synthesis = [r for r in rows if r.payloads.synthesis_quality is not None]
    assert len(synthesis) == 1
    quality = synthesis[0].payloads.synthesis_quality
    assert quality is not None
    assert quality.answer_chars == len("2 + 3 = 5.")
    assert quality.tool_calls_in_turn == 1
    assert quality.source == "tool-loop"
    assert synthesis[0].call is None
    selection = rows[1].payloads.tool_selection
    assert selection is not None
    assert selection.offered == ("add", "read_tool_result")
    assert [s.tool_name for s in selection.selected] == ["add"]
    usage = await runtime.store.read_usage(events[0].turn_id)
    assert usage.model_calls == 2
    assert usage.input_tokens == sum(r.call.input_tokens for r in model_rows if r.call)


async def test_tool_loop_requests_only_append(runtime_factory: RuntimeFactory) -> None:
    """Each request's messages start with the previous request's (append-only prompt)."""
    model = _script()
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    for before, after in zip(model.calls, model.calls[1:], strict=False):
        assert after.messages[: len(before.messages)] == before.messages
        assert after.tools == before.tools  # the tools are part of the cached prefix
    assert model.calls[0].tools[0].name == "add"


async def test_a_no_tool_turn_is_one_call_streamed_once(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Paris is the capital of France.")])
    runtime = runtime_factory(Agent(model=model, tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "Capital of France?"))
    model.assert_complete()
    assert len(model.calls) == 1
    deltas = "".join(e.text for e in events if isinstance(e, MessageDeltaEvent))
    assert deltas == "Paris is the capital of France."  # streamed once, not twice
    completes = [e for e in events if isinstance(e, MessageCompleteEvent)]
    assert [(c.stage_id, c.block.is_answer) for c in completes] == [("synthesize", True)]
    [turn] = await runtime.history("s1")
    texts = [b.text for b in turn.blocks if isinstance(b, TextBlock)]
    assert texts == ["Paris is the capital of France."]  # the answer is in history once


async def test_separate_synthesis_keeps_the_old_shape(runtime_factory: RuntimeFactory) -> None:
    writer = ScriptedModel([ModelStep.text_reply("2 + 3 = 5.")], name="writer")
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=2, b=3), text="Adding."),
            ModelStep.text_reply("The sum is 5."),
        ]
    )
    agent = Agent(model=model, tools=[add], synthesis="separate", synthesis_model=writer)
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "What is 2 + 3?"))
    model.assert_complete()
    writer.assert_complete()
    [turn] = await runtime.history("s1")
    assert turn.answer == "2 + 3 = 5."
    texts = [(b.text, b.is_answer) for b in turn.blocks if isinstance(b, TextBlock)]
    assert texts == [("Adding.", False), ("The sum is 5.", False), ("2 + 3 = 5.", True)]
    rows = await runtime.audit(events[0].turn_id)
    [quality] = [r for r in rows if r.payloads.synthesis_quality is not None]
    assert quality.call is not None
    assert quality.call.model == "writer"
    assert quality.payloads.synthesis_quality is not None
    assert quality.payloads.synthesis_quality.source == "synthesize"
    # The synthesis call keeps the prefix: same tools offered (not usable), messages appended.
    last_loop, synthesis = model.calls[-1], writer.calls[0]
    assert synthesis.messages[: len(last_loop.messages)] == last_loop.messages
    assert synthesis.tools == last_loop.tools
    assert synthesis.tool_choice == "none"


async def test_second_turn_sees_the_first_answer(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hi Ada."), ModelStep.text_reply("You are Ada.")])
    runtime = runtime_factory(Agent(model=model))
    await collect_events(runtime.execute_message("s1", "I am Ada."))
    await collect_events(runtime.execute_message("s1", "Who am I?"))
    contents = [(m.role, m.content) for m in model.calls[1].messages]
    assert ("user", "I am Ada.") in contents
    assert ("assistant", "Hi Ada.") in contents
    assert contents[-1] == ("user", "Who am I?")
    assert [t.answer for t in await runtime.history("s1")] == ["Hi Ada.", "You are Ada."]


async def test_agent_without_tools_makes_one_call(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello!")])
    runtime = runtime_factory(Agent(model=model))
    events = await collect_events(runtime.execute_message("s1", "Hi"))
    steps = [e.step for e in events if e.type == "step.start"]  # type: ignore[attr-defined]
    assert steps == ["anchor-plan", "synthesize", "post-turn"]
    model.assert_complete()
