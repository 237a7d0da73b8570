"""The runtime's guidance: a short text after the agent's instructions in the system message
of every call on the agent's own models, the same on every turn; configurable, or off."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import RuntimeFactory
from tests.helpers import add
from turnkit import Agent, ConfigurationError, RuntimeConfig
from turnkit.config import DEFAULT_GUIDANCE
from turnkit.events import DoneEvent
from turnkit.models import ModelRequest, text_of
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

INSTRUCTIONS = "You answer questions about arithmetic."


def _system(request: ModelRequest) -> str:
    first = request.messages[0]
    assert first.role == "system"
    return text_of(first.content)


def _plan(request: ModelRequest) -> ModelStep:
    return ModelStep.text_reply('{"intent": "sum", "depth": "none"}')


async def test_every_call_of_the_agent_carries_the_guidance_after_its_instructions(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("add", a=2, b=3)),
            ModelStep.text_reply("Looked it up."),
            ModelStep.text_reply("2 + 3 is 5."),  # the separate answer call
            ModelStep.text_reply("And 5 + 5 is 10."),  # the next turn
            ModelStep.text_reply("Ten."),
        ]
    )
    utility = ScriptedModel([ModelStep.respond(_plan)], repeat_last=True)
    agent = Agent(
        instructions=INSTRUCTIONS,
        model=model,
        utility_model=utility,
        tools=[add],
        synthesis="separate",
    )
    runtime = runtime_factory(agent, config=RuntimeConfig(database_url=database_url))
    for message in ("What is 2 + 3?", "And 5 + 5?"):
        events = await collect_events(runtime.execute_message("s1", message))
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"
    assert len(model.calls) == 5  # two tool-loop calls and an answer call, then two
    expected = f"{INSTRUCTIONS}\n\n{DEFAULT_GUIDANCE}"
    assert [_system(c) for c in model.calls] == [expected] * 5  # the same on every turn
    # The utility model plans by its own prompt: the guidance is for answering turns.
    plans = [c for c in utility.calls if c.purpose == "plan"]
    assert plans
    assert all(DEFAULT_GUIDANCE not in _system(c) for c in plans)


async def test_guidance_can_be_replaced_or_turned_off(
    runtime_factory: RuntimeFactory, database_url: str
) -> None:
    base = RuntimeConfig(database_url=database_url)
    for session, (guidance, expected) in enumerate(
        [
            ("Answer in one sentence.", f"{INSTRUCTIONS}\n\nAnswer in one sentence."),
            (None, INSTRUCTIONS),
            ("", INSTRUCTIONS),
        ]
    ):
        model = ScriptedModel([ModelStep.text_reply("Five.")])
        agent = Agent(instructions=INSTRUCTIONS, model=model)
        config = dataclasses.replace(base, guidance=guidance)
        runtime = runtime_factory(agent, config=config)
        await collect_events(runtime.execute_message(f"s{session}", "What is 2 + 3?"))
        [request] = model.calls
        assert _system(request) == expected
        await runtime.close()
    with pytest.raises(ConfigurationError, match="guidance"):
        RuntimeConfig(guidance=42)  # type: ignore[arg-type]
