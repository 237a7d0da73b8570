"""Input guardrails guard every way a person's words reach a model: guides, plans, old turns."""

from __future__ import annotations

from pathlib import Path

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.plugins.pii import PiiRedaction
from turnkit.testing import ModelStep, ScriptedModel, collect_events


def _runtime(tmp_path: Path, agent: Agent, **kw: object) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'ctx.db'}")
    return SessionRuntime(agent=agent, config=config, **kw)  # type: ignore[arg-type]


def _sent(model: ScriptedModel, n: int = -1) -> str:
    return " ".join(str(m.content) for m in model.calls[n].messages)


async def test_a_blocked_message_stopped_before_it_ran_never_reaches_the_model(
    tmp_path: Path,
) -> None:
    """A queued message the input guardrail would block, stopped before its turn ran,
    must not reach a later turn's model (nor any raw message nobody guarded)."""
    model = ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)
    agent = Agent(model=model, plugins=[PiiRedaction(block=True, check_input=True)])
    async with _runtime(tmp_path, agent) as rt:
        await collect_events(rt.execute_message("s1", "hi"))
        queued = await rt.submit("s1", "my card is 4111 1111 1111 1111")
        assert await rt.cancel(queued.turn_id) == "cancelled"
        await collect_events(rt.execute_message("s1", "hello again"))
    assert "4111" not in _sent(model)


async def test_a_masked_message_stopped_before_it_ran_is_not_unmasked_later(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")], repeat_last=True)
    agent = Agent(model=model, plugins=[PiiRedaction(check_input=True)])
    async with _runtime(tmp_path, agent) as rt:
        await collect_events(rt.execute_message("s1", "hi"))
        queued = await rt.submit("s1", "write to ada@example.com please")
        assert await rt.cancel(queued.turn_id) == "cancelled"
        await collect_events(rt.execute_message("s1", "hello again"))
    assert "ada@example.com" not in _sent(model)


async def test_the_plan_call_never_reads_what_the_input_guardrail_masked(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True)
    utility = ScriptedModel(
        [ModelStep.text_reply('{"intent": "x", "depth": "none", "tasks": []}')], repeat_last=True
    )
    agent = Agent(model=model, utility_model=utility, plugins=[PiiRedaction(check_input=True)])
    async with _runtime(tmp_path, agent) as rt:
        long = "Please draft a short and friendly note for the team about the offsite"
        await collect_events(rt.execute_message("s1", f"{long}, then write to ada@example.com"))
        await rt.wait_background()  # the naming call (the title is cut before the address)
    assert "ada@example.com" not in _sent(model, 0)  # the turn's model: masked
    assert [c.purpose for c in utility.calls] == ["plan", "utility"]  # plan, then naming
    for n in range(len(utility.calls)):
        assert "ada@example.com" not in _sent(utility, n), utility.calls[n].purpose


async def test_a_guide_passes_the_input_guardrails_before_the_model_reads_it(
    tmp_path: Path,
) -> None:
    """A message that joins a running turn is the person's message too: a guardrail that
    masks it in a turn of its own masks it as a guide."""
    import asyncio

    from turnkit import tool
    from turnkit.events import ToolStartedEvent
    from turnkit.testing import call

    release = asyncio.Event()

    @tool
    async def slow_lookup(q: str) -> str:
        """Look something up, slowly."""
        await release.wait()
        return f"found {q}"

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow_lookup", q="A")), ModelStep.text_reply("Done.")],
        repeat_last=True,
    )
    agent = Agent(model=model, tools=[slow_lookup], plugins=[PiiRedaction(check_input=True)])
    async with _runtime(tmp_path, agent) as rt:
        events: list[object] = []

        async def drain() -> None:
            async for event in rt.execute_message("s1", "check A"):
                events.append(event)

        consumer = asyncio.create_task(drain())
        async with asyncio.timeout(10):
            while not any(isinstance(e, ToolStartedEvent) for e in events):
                await asyncio.sleep(0.01)
        guided = await rt.submit("s1", "and mail it to ada@example.com", delivery="guide")
        assert guided.guided
        release.set()
        await asyncio.wait_for(consumer, 10)
        await collect_events(rt.execute_message("s1", "thanks"))
    assert "ada@example.com" in str(events)  # the person's own history keeps it
    assert "ada@example.com" not in _sent(model, 1)  # the guide's request
    assert "ada@example.com" not in _sent(model)  # and every later turn's
