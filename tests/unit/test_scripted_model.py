"""`ScriptedModel.assert_complete()` catches a script too short even where the turn hid it.

A call past the script raises inside the turn; the runtime logs it where a failure may not
fail the turn (a session's name, a thinking summary), so the test must say so itself.
"""

from __future__ import annotations

import pytest
from tests.conftest import RuntimeFactory

from turnkit import Agent
from turnkit.testing import ModelStep, ScriptedModel, collect_events


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
