"""A process whose asking turn follows an agent still at its model call, SIGKILLed there.

`python -c "from tests.support.asked_working import main; main()" URL SCHEMA`: the asking
turn (session `s1`) asks the refunds agent; the moment that agent's model call is under
way (it never answers in this process), the process kills itself with SIGKILL. The asked
agent never paused, so nothing of it was handed to the asking turn. `TK_REFUNDED` names
a file each refund appends a line to, in any process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from tests.support.asked_kill import config
from turnkit import Agent, SessionRuntime, tool
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool
async def instant_refund(order_id: str) -> str:
    """Refund an order (no approval)."""
    line = f"{order_id} {os.getpid()}\n"
    await asyncio.to_thread(_append, Path(os.environ["TK_REFUNDED"]), line)
    return f"refunded {order_id}"


def _append(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line)


def answering() -> ScriptedModel:
    """The refunds agent's model where it gets to answer: it refunds, then says so."""
    return ScriptedModel([
        ModelStep.tool_call_reply(call("instant_refund", order_id="A1")),
        ModelStep.text_reply("Refunded A1."),
    ])  # fmt: skip


def front_desk(refunds_model: ScriptedModel) -> Agent:
    """The asking agent, and the refunds agent it asks, on `refunds_model`."""
    refunds = Agent(name="refunds", model=refunds_model, tools=[instant_refund])
    return Agent(
        name="front-desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("refunds", message="Refund order A1")),
            ModelStep.text_reply("Done."),
        ]),
        tools=[refunds.as_tool()],
    )  # fmt: skip


async def _ask(url: str, schema: str | None) -> None:
    model = ScriptedModel([ModelStep.hang("Looking the order up")])
    async with SessionRuntime(agent=front_desk(model), config=config(url, schema)) as runtime:
        asking = asyncio.create_task(collect_events(runtime.execute_message("s1", "refund A1")))
        async with asyncio.timeout(30):
            while not model.calls:  # the asked agent's model call is under way
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # ... and streams its text, never to answer
        os.kill(os.getpid(), signal.SIGKILL)
        await asking
    sys.exit(3)  # never killed


def main() -> None:
    url, schema = sys.argv[1:3]
    asyncio.run(_ask(url, schema or None))
