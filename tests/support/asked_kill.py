"""A process that ends an asking turn and is SIGKILLed before it stops the turn it asked.

`python -c "from tests.support.asked_kill import main; main()" URL SCHEMA HOW TURN REQUEST`:
the asking turn `TURN` waits on the refunds agent's request `REQUEST`; `HOW` ends it:

- `stop`: a Stop of the waiting asking turn;
- `gone`: an answer, in a process whose asking agent changed (a deploy), which ends the
  asking turn `agent-not-found` in this process;
- `handed`: the same, but the answer is handed on to the asked turn first (an API process
  that leaves turns to workers), and the asking turn is driven here afterwards.

The process kills itself the moment the asking turn has ended and the runtime goes on to
stop the asked one (`SessionRuntime._stop_asked_by`, `_cancel_asked`). `TK_REFUNDED` names
a file each refund appends a line to, in any process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import Any

from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, tool
from turnkit.ids import TurnId
from turnkit.runtime._control import RuntimeControl
from turnkit.testing import ModelStep, ScriptedModel, call


@tool(approval="always")
async def refund(order_id: str, amount_eur: int) -> str:
    """Refund an order."""
    line = f"{order_id} {amount_eur} {os.getpid()}\n"
    await asyncio.to_thread(_append, Path(os.environ["TK_REFUNDED"]), line)
    return f"refunded {amount_eur} EUR on {order_id}"


def _append(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line)


def front_desk() -> Agent:
    """The asking agent, and the refunds agent it asks (a fresh script each time)."""
    refunds = Agent(
        name="refunds",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("refund", order_id="A1", amount_eur=20)),
                ModelStep.text_reply("Refunded 20 EUR on A1."),
            ]
        ),
        tools=[refund],
    )
    return Agent(
        name="front-desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("refunds", message="Refund order A1, 20 EUR")),
            ModelStep.text_reply("Done."),
        ]),
        tools=[refunds.as_tool()],
    )  # fmt: skip


def config(url: str, schema: str | None, **settings: Any) -> RuntimeConfig:
    return RuntimeConfig(database_url=url, database_schema=schema, lease_ttl_s=1.0, **settings)


def _die(*_: object, **__: object) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


async def _end(url: str, schema: str | None, how: str, turn_id: str, request_id: str) -> None:
    RuntimeControl._cancel_asked = _die  # type: ignore[method-assign]
    RuntimeControl._stop_asked_by = _die  # type: ignore[method-assign]
    edited = dataclasses.replace(front_desk(), instructions="Edited.")
    if how == "stop":
        async with SessionRuntime(agent=front_desk(), config=config(url, schema)) as runtime:
            await runtime.cancel(turn_id)
    elif how == "gone":
        async with SessionRuntime(agent=edited, config=config(url, schema)) as runtime:
            await runtime.resume(turn_id, request_id, Approve())
            await asyncio.sleep(30)
    else:
        settings = config(url, schema, run_in_process=False)
        async with SessionRuntime(agent=edited, config=settings) as runtime:
            await runtime.resume(turn_id, request_id, Approve())
            runtime.host.detach(TurnId(turn_id))
            await asyncio.sleep(30)
    sys.exit(3)  # never killed: the asking turn did not end here


def main() -> None:
    url, schema, how, turn_id, request_id = sys.argv[1:6]
    asyncio.run(_end(url, schema or None, how, turn_id, request_id))
