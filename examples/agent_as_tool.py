"""A front-desk agent that asks two specialists, each answering in a durable turn of its own.

Shows: `Agent.as_tool()` offering one agent to another; the asking model calls it with a
message, the specialist answers in its own session (a child of the asking one, owned by
the same caller, left out of session lists), with its own tools, and its answer, text or
its `output_type`'s JSON, is the call's result. The call's progress names what the
specialist is doing, and deleting the asking session deletes the specialists' too.

Run:  .venv/bin/python examples/agent_as_tool.py   (offline, scripted models)
"""

import asyncio
import os
import tempfile

from pydantic import BaseModel

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import (
    JobProgressEvent,
    MessageCompleteEvent,
    ToolCompletedEvent,
    ToolStartedEvent,
)
from turnkit.ids import SessionId
from turnkit.testing import ModelStep, ScriptedModel, call


@tool
async def track_parcel(order_id: str) -> str:
    """Where an order's parcel is."""
    return f"order {order_id}: out for delivery, arrives today"


class RefundCheck(BaseModel):
    """The refunds desk's verdict."""

    eligible: bool
    reason: str


shipping = Agent(
    name="shipping",
    instructions="You track parcels. Answer in one sentence.",
    model=ScriptedModel(
        [
            ModelStep.tool_call_reply(call("track_parcel", order_id="A7")),
            ModelStep.text_reply("Order A7 is out for delivery and arrives today."),
        ]
    ),
    tools=[track_parcel],
)
refunds = Agent(
    name="refunds",
    instructions="You decide whether an order may be refunded.",
    model=ScriptedModel(
        [ModelStep.text_reply('{"eligible": false, "reason": "it has not arrived yet"}')]
    ),
    output_type=RefundCheck,
)
front_desk = Agent(
    name="front-desk",
    instructions="You help customers; ask the specialists.",
    model=ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("shipping", message="Where is order A7?"),
                call("refunds", message="May order A7 be refunded? It has not arrived."),
            ),
            ModelStep.text_reply(
                "Your order A7 arrives today; a refund can wait until it has arrived."
            ),
        ]
    ),
    tools=[shipping.as_tool(), refunds.as_tool()],
)


async def main() -> None:
    database = os.path.join(tempfile.mkdtemp(), "agents.db")
    config = RuntimeConfig(database_url=f"sqlite:///{database}")
    async with SessionRuntime(agent=front_desk, config=config) as runtime:
        asked: list[SessionId] = []
        turn = runtime.execute_message("desk-1", "Where is A7? Refund?", principal="ada")
        async for event in turn:
            if isinstance(event, ToolStartedEvent) and event.asked_session_id:
                asked.append(SessionId(event.asked_session_id))  # where the specialist answers
            elif isinstance(event, JobProgressEvent) and event.message:
                print("progress:", event.message.split(" (session")[0])
            elif isinstance(event, ToolCompletedEvent):
                print(f"{event.result.tool_name} answered: {event.result.output}")
            elif isinstance(event, MessageCompleteEvent) and event.block.is_answer:
                print("answer:", event.block.text)
        listed = await runtime.store.list_sessions(principal="ada")
        print("ada's sessions:", [s.session_id for s in listed])
        for session_id in asked:
            child = await runtime.store.get_session(session_id)
            assert child is not None
            [child_turn] = await runtime.store.list_turns(session_id)
            print(f"{child_turn.agent} answered in a session of desk-1: {child.parent_session}")
        await runtime.store.delete_session(SessionId("desk-1"))  # specialists' go with it
        left = [s for s in asked if await runtime.store.get_session(s) is not None]
        print("specialist sessions left after deleting desk-1:", len(left))


if __name__ == "__main__":
    asyncio.run(main())
