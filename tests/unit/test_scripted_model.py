"""`ScriptedModel.assert_complete()` catches a script too short even where the turn hid it.

A call past the script raises inside the turn; the runtime logs it where a failure may not
fail the turn (a session's name, a thinking summary), so the test must say so itself.
"""

from __future__ import annotations

import pytest
from tests.conftest import RuntimeFactory

from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


async def test_a_call_past_the_script_fails_assert_complete(
    runtime_factory: RuntimeFactory,
) -> None:
    planner = ScriptedModel([ModelStep.text_reply('{"intent": "x", "depth": "none"}')])
    model = ScriptedModel([ModelStep.text_reply("Hi.")])
    runtime = runtime_factory(Agent(model=model, utility_model=planner))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    await runtime.wait_background()  # the session's name: a call past the planner's script
    assert events[-1].type == "done"
    assert events[-1].status == "succeeded"  # the naming call's failure did not fail the turn
    model.assert_complete()
    with pytest.raises(AssertionError, match=r"called 2 times; its script has 1 step.*'utility'"):
        planner.assert_complete()


def test_a_script_not_played_to_its_end_fails_assert_complete() -> None:
    unused = ScriptedModel([ModelStep.text_reply("never")])
    with pytest.raises(AssertionError, match="1 scripted step"):
        unused.assert_complete()


def test_a_script_of_something_else_is_refused_when_it_is_written() -> None:
    with pytest.raises(TypeError, match=r"steps\[1\] is 'hello', not a ModelStep: ModelStep"):
        ScriptedModel([ModelStep.text_reply("Hi."), "hello"])  # type: ignore[list-item]


async def test_script_mistakes_say_what_went_wrong_in_the_turn(
    runtime_factory: RuntimeFactory,
) -> None:
    """A responder returning nothing, a tool call for an agent without tools, one call too
    many: each ends the turn with words a test author can act on."""
    cases = [
        (ScriptedModel([ModelStep.respond(lambda request: None)]), "returned None"),  # type: ignore[arg-type, return-value]
        (
            ScriptedModel([ModelStep.tool_call_reply(call("order_status", order_id="A-1"))]),
            "calls ['order_status'] but this call ('synthesize') offers no tools",
        ),
        (ScriptedModel([]), "script has 0 step(s); the call past it: 'synthesize'"),
    ]
    for at, (model, said) in enumerate(cases):
        runtime = runtime_factory(Agent(model=model))
        events = await collect_events(runtime.execute_message(f"s{at}", "hello"))
        [error] = [e for e in events if e.type == "error"]
        assert said in error.message, error.message
        assert events[-1].status == "failed"


async def test_collect_events_fails_a_stream_that_never_ends_in_time(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([ModelStep.hang("thinking")])))
    with pytest.raises(AssertionError, match=r"did not end within 0.5 s: .* the last 'message"):
        await collect_events(runtime.execute_message("s1", "hello"), timeout_s=0.5)
    [turn] = await runtime.history("s1")
    assert turn.status == "cancelled"  # the stream was closed: the turn stopped, not left
