"""A turn that pauses for a person's approval, survives a restart, and resumes.

Shows: `@tool(approval="always")`, the `approval.requested` event, the turn waiting in
`awaiting_approval` with no process holding it, a brand-new runtime (as after a restart)
approving with `runtime.resume(..., Approve())`, and the same turn continuing to its answer
with its `seq` numbers continuing where they stopped.

Run:  .venv/bin/python examples/approval.py   (offline, scripted models)
"""

import asyncio
import os
import tempfile

from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, DurableEvent
from turnkit.testing import ModelStep, ScriptedModel, call


@tool(approval="always")
async def transfer(amount_eur: int, to: str) -> str:
    """Move money (a person must approve every call)."""
    return f"transferred {amount_eur} EUR to {to}"


def runtime(db: str, model: ScriptedModel) -> SessionRuntime:
    agent = Agent(model=model, tools=[transfer])
    return SessionRuntime(agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}"))


async def main() -> None:
    db = os.path.join(tempfile.mkdtemp(), "approval.db")
    asking = ScriptedModel([ModelStep.tool_call_reply(call("transfer", amount_eur=40, to="Ada"))])
    async with runtime(db, asking) as first:
        async for event in first.execute_message("bank", "Pay Ada 40 EUR"):
            if isinstance(event, DurableEvent):
                print(f"#{event.seq} {event.type}")
            if isinstance(event, ApprovalRequestedEvent):
                request = event
        print("status:", (await first.turn(request.turn_id)).status)
    # ... the process stops; hours later another one answers the card:
    answering = ScriptedModel([ModelStep.text_reply("Ada got her 40 EUR.")])
    async with runtime(db, answering) as second:
        print("approving", request.summary)
        await second.resume(request.turn_id, request.request_id, Approve())
        async for event in second.follow(request.turn_id, after_seq=request.seq):
            if isinstance(event, DurableEvent):  # it ends with `done` (or the next pause)
                print(f"#{event.seq} {event.type}")
        [turn] = await second.history("bank")
        print("status:", turn.status)
        print("answer:", turn.answer)


if __name__ == "__main__":
    asyncio.run(main())
