"""An iteration whose model answer an earlier attempt committed goes on from the request
that answer was given to: the plugins' notes and the guides it carried stay where they
were, so the next request extends it (a resumed approval, a recovered crash)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

from tests.conftest import RuntimeFactory
from tests.helpers import follow_to_done, until
from turnkit import Agent, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, DoneEvent, StreamEvent, ToolStartedEvent
from turnkit.models import ModelRequest
from turnkit.pauses import Approve
from turnkit.plugins import ModelCallView, Plugin, PluginContext
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

RULES = "Quote prices with their currency."


class HouseRules(Plugin):
    """A note on the turn's first request only (decided from the messages it is shown),
    with an audit row and an event about each request it is asked about."""

    name: ClassVar[str] = "house-rules"

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        ctx.audit({"asked": len(call.messages)})
        await ctx.emit("asked", {"messages": len(call.messages)})
        return [RULES] if len(call.messages) <= 2 else None


@tool(approval="always")
async def pay(to: str) -> str:
    """Pay someone."""
    return f"paid {to}"


async def _approved(runtime: SessionRuntime, asked: StreamEvent) -> list[StreamEvent]:
    """Approve the paused call and follow the turn to its successful end."""
    assert isinstance(asked, ApprovalRequestedEvent)
    await runtime.resume(asked.turn_id, asked.request_id, Approve())
    rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
    assert isinstance(rest[-1], DoneEvent)
    assert rest[-1].status == "succeeded"
    return rest


def _shown(request: ModelRequest) -> list[tuple[str, str]]:
    return [(m.role, str(m.content)) for m in request.messages]


async def test_a_resumed_approval_keeps_the_note_its_request_carried(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("pay", to="bob")), ModelStep.text_reply("Paid Bob.")]
    )
    agent = Agent(
        model=model, tools=[pay], plugins=[HouseRules()], skip_stages=frozenset({"anchor-plan"})
    )
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "pay bob"))
    asked = events[-1]
    rest = await _approved(runtime, asked)
    first, second = (_shown(r) for r in model.calls)
    assert ("system", RULES) in first
    assert second[: len(first)] == first  # the note stays where the first request had it
    assert [role for role, _ in second[len(first) :]] == ["assistant", "tool"]
    rows = await runtime.audit(asked.turn_id)
    breaks = [r.payloads.cache_breakpoint for r in rows if r.payloads.cache_breakpoint]
    assert [b.broken_region for b in breaks if b is not None] == [None, None]
    # Asked again about the first request, the plugin's row and event are not written twice.
    asked_rows = [r.plugin_payloads["house-rules"] for r in rows if r.plugin_payloads]
    assert asked_rows == [{"asked": 2}, {"asked": 5}]
    emitted = [e.data for e in [*events, *rest] if e.type == "plugin.emitted"]
    assert emitted == [{"messages": 2}, {"messages": 5}]


async def test_a_guide_a_paused_request_carried_stays_before_its_answer(
    runtime_factory: RuntimeFactory,
) -> None:
    release = asyncio.Event()

    @tool
    async def look(q: str) -> str:
        """Look something up, slowly."""
        await release.wait()
        return f"found {q}"

    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("look", q="price")),
            ModelStep.tool_call_reply(call("pay", to="bob")),
            ModelStep.text_reply("Paid Bob, as you asked."),
        ]
    )
    agent = Agent(model=model, tools=[look, pay], skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent)
    events: list[StreamEvent] = []

    async def drain() -> None:
        async for event in runtime.execute_message("s1", "check the price"):
            events.append(event)

    consumer = asyncio.create_task(drain())
    await until(lambda: any(isinstance(e, ToolStartedEvent) for e in events), "the lookup")
    assert (await runtime.submit("s1", "then pay bob", delivery="guide")).guided
    release.set()
    await asyncio.wait_for(consumer, 10)
    asked = events[-1]
    await _approved(runtime, asked)
    _, second, third = (_shown(r) for r in model.calls)
    assert second[-1] == ("user", "then pay bob")
    assert third[: len(second)] == second  # the guide stays before the answer it led to
    assert [role for role, _ in third[len(second) :]] == ["assistant", "tool"]
