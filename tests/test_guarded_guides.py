"""Guides and guardrails: a verdict per guide; each agent of a session sees its own view."""

from __future__ import annotations

import asyncio

from tests.conftest import RuntimeFactory
from tests.helpers import until
from turnkit import Agent, tool
from turnkit.events import StreamEvent, ToolStartedEvent
from turnkit.plugins.pii import PiiRedaction
from turnkit.testing import ModelStep, ScriptedModel, call


async def test_a_masked_guide_has_its_own_guardrail_event(runtime_factory: RuntimeFactory) -> None:
    """The opening message and a guide are both masked: each check is one `guardrail` event.

    Its dedupe key (checkpoint, tool call, subject, kind, action) is the same for both, so
    the guide's verdict is dropped as if it were a replay of the opening message's."""
    release = asyncio.Event()

    @tool
    async def look(q: str) -> str:
        """Look something up, slowly."""
        await release.wait()
        return f"found {q}"

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("look", q="price")), ModelStep.text_reply("Done.")],
        repeat_last=True,
    )
    agent = Agent(
        model=model,
        tools=[look],
        skip_stages=frozenset({"anchor-plan"}),
        plugins=[PiiRedaction(check_input=True)],
    )
    runtime = runtime_factory(agent)
    events: list[StreamEvent] = []

    async def drain() -> None:
        async for event in runtime.execute_message("s1", "check the price for ada@example.com"):
            events.append(event)

    consumer = asyncio.create_task(drain())
    await until(lambda: any(isinstance(e, ToolStartedEvent) for e in events), "the lookup")
    assert (await runtime.submit("s1", "and cc bob@example.com", delivery="guide")).guided
    release.set()
    await asyncio.wait_for(consumer, 10)
    assert "bob@example.com" not in " ".join(str(m.content) for m in model.calls[-1].messages)
    verdicts = [e for e in events if e.type == "guardrail"]
    assert len(verdicts) == 2, verdicts  # the opening message's, and the guide's


async def test_a_held_transcript_built_unguarded_does_not_leak_to_a_guarded_agent(
    tmp_path: object,
) -> None:
    """`guarded` is not part of what the runtime holds per session: an unguarded agent's
    turn holds the raw text of a stopped turn, which a guarded agent's next turn reuses."""
    from pathlib import Path

    from turnkit import RuntimeConfig, SessionRuntime
    from turnkit.testing import collect_events

    plain_model = ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)
    guarded_model = ScriptedModel([ModelStep.text_reply("Hi.")], repeat_last=True)
    plain = Agent(name="plain", model=plain_model)
    guarded = Agent(
        name="guarded", model=guarded_model, plugins=[PiiRedaction(block=True, check_input=True)]
    )
    config = RuntimeConfig(database_url=f"sqlite:///{Path(str(tmp_path)) / 'held.db'}")
    async with SessionRuntime(agents=[plain, guarded], config=config) as rt:
        await collect_events(rt.execute_message("s1", "hi", agent="guarded"))
        queued = await rt.submit("s1", "my card is 4111 1111 1111 1111", agent="guarded")
        assert await rt.cancel(queued.turn_id) == "cancelled"
        await collect_events(rt.execute_message("s1", "hello", agent="plain"))
        await collect_events(rt.execute_message("s1", "hello again", agent="guarded"))
    sent = " ".join(str(m.content) for m in guarded_model.calls[-1].messages)
    assert "4111" not in sent
