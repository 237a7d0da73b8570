"""A specialist agent asked as a tool needs a person's approval: answered in the asking chat.

Shows: a front desk that asks a `refunds` agent (`refunds.as_tool()`), whose `refund` tool
needs approval; the front desk's turn pausing with the specialist's request (`asked` names
the agent and its turn); the card a person sees for the front desk's session; a brand-new
runtime (as after a restart) answering it; the answer going on to the specialist, whose
turn runs the refund once and answers; and both turns' audits naming who approved.

Run:  .venv/bin/python examples/specialist_approval.py   (offline, scripted models)
"""

import asyncio
import os
import tempfile

from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, MessageCompleteEvent
from turnkit.testing import ModelStep, ScriptedModel, call


@tool(approval="always")
async def refund(order_id: str, amount_eur: int) -> str:
    """Refund an order (a person approves every refund)."""
    return f"refunded {amount_eur} EUR on {order_id}"


def desk(*, restarted: bool = False) -> Agent:
    """The same agents in every process (a turn runs with the agents it was pinned to).

    A scripted model plays its script from the start in every process: after the restart
    it holds only the replies still to come (a real model is simply asked again; what
    was committed before is never asked for twice).
    """
    asks_refund = ModelStep.tool_call_reply(call("refund", order_id="A7", amount_eur=30))
    asks_refunds = ModelStep.tool_call_reply(call("refunds", message="Refund order A7: 30 EUR."))
    refunds = Agent(
        name="refunds",
        instructions="You refund orders.",
        model=ScriptedModel(
            [
                *([] if restarted else [asks_refund]),
                ModelStep.text_reply("Refunded 30 EUR on order A7."),
            ]
        ),
        tools=[refund],
    )
    return Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                *([] if restarted else [asks_refunds]),
                ModelStep.text_reply("Done: 30 EUR are on their way back to you."),
            ]
        ),
        tools=[refunds.as_tool()],
    )


async def main() -> None:
    config = RuntimeConfig(database_url=f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'd.db')}")
    async with SessionRuntime(agent=desk(), config=config) as first:
        async for event in first.execute_message("chat-1", "Refund A7 please", principal="ada"):
            if isinstance(event, ApprovalRequestedEvent):
                asked = event
        assert asked.asked is not None
        print("front desk waits:", (await first.turn(asked.turn_id)).status)
        print("asked by:", asked.asked.agent, "· its turn waits too")
        [card] = await first.pending("chat-1")
        print("card:", card.summary)

    async with SessionRuntime(agent=desk(restarted=True), config=config) as later:  # restarted
        await later.resume(asked.turn_id, asked.request_id, Approve(), principal="sam")
        async for event in later.follow(asked.turn_id, after_seq=asked.seq):
            if isinstance(event, MessageCompleteEvent) and event.block.is_answer:
                print("answer:", event.block.text)
        for turn_id in (asked.turn_id, asked.asked.turn_id):
            rows = await later.audit(turn_id)
            [answer] = [r.payloads.pause_answer for r in rows if r.payloads.pause_answer]
            record = await later.turn(turn_id)
            print(f"{record.agent}: {record.status}, approved by {answer.by}")


if __name__ == "__main__":
    asyncio.run(main())
