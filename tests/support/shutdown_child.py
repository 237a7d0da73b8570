"""A process that goes away while its turn waits on the model, without a Stop.

`python -c "from tests.support.shutdown_child import main; main()" URL SCHEMA HOW`: a
runtime nobody closes starts a turn (`start`) whose model asks for the `note` tool, then
takes its time over the second call. While that call waits, the process goes away `HOW`:

- `return`: `asyncio.run(main())` returns (asyncio cancels the tasks left);
- `raise`: `main` raises `KeyboardInterrupt` (asyncio cancels the tasks left);
- `sigint`: the process is sent SIGINT (Ctrl-C), which asyncio turns into a cancellation
  of `main` and then of the tasks left;
- `close`: `main` closes the runtime first, then returns;
- `stream-sigint`: as `sigint`, with the turn streamed to `main` (`execute_message`): the
  caller leaves its stream, which is a Stop;
- `stream-return`: a task of `main`'s reads the stream; `main` returns meanwhile (asyncio
  cancels the reader and the turn's task together);
- `tool-sigint`, `tool-return`: as `sigint` and `return`, but the moment the `note` tool
  has run (its result not yet committed), not while the second call waits.

It prints the turn's id first. `TK_SHUTDOWN_LOG` names a file each tool run and each model
call (in any process) appends a line to.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from tests.helpers import WrappedModel
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.models import ModelChunk, ModelRequest
from turnkit.testing import ModelStep, ScriptedModel, call


def _append(line: str) -> None:
    with Path(os.environ["TK_SHUTDOWN_LOG"]).open("a") as out:
        out.write(f"{line} {os.getpid()}\n")


TOOL_RAN = asyncio.Event()
"""Set as `note` returns, in a process that goes away then (`tool-...`)."""


@tool
async def note(text: str) -> str:
    """Write a note down."""
    _append(f"tool {text}")
    how = os.environ.get("TK_SHUTDOWN_AT_TOOL")
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)  # asyncio cancels `main`, then every task
    elif how == "return":
        TOOL_RAN.set()  # `main` returns: asyncio cancels every task left
    return f"noted {text}"


class SlowModel(WrappedModel):
    """Asks for `note`, then (the second call) waits `wait_s` before it answers.

    A process that recovers the turn builds one with `wait_s=0`: it answers at once.
    """

    def __init__(self, *, wait_s: float, first: bool = True) -> None:
        steps = [ModelStep.text_reply("Noted.")]
        if first:
            steps.insert(0, ModelStep.tool_call_reply(call("note", text="A1")))
        self.inner = ScriptedModel(steps)
        self.wait_s = wait_s

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        _append(f"model call {len(self.inner.calls) + 1}")
        if self.inner.calls:  # the answer after the tool's result
            await asyncio.sleep(self.wait_s)
        async for chunk in self.inner.stream(request):
            yield chunk


def agent(*, wait_s: float, first: bool = True) -> Agent:
    return Agent(
        name="notes",
        model=SlowModel(wait_s=wait_s, first=first),
        tools=[note],
        skip_stages=frozenset({"anchor-plan"}),
    )


def config(url: str, schema: str | None, **changes: object) -> RuntimeConfig:
    return RuntimeConfig(
        database_url=url,
        database_schema=schema,
        lease_ttl_s=3.0,
        **changes,  # type: ignore[arg-type]
    )


async def _second_call_waits() -> None:
    path = Path(os.environ["TK_SHUTDOWN_LOG"])
    while "model call 2" not in await asyncio.to_thread(path.read_text):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # well inside the call


async def _go(url: str, schema: str | None, how: str) -> None:
    runtime = SessionRuntime(agent=agent(wait_s=60), config=config(url, schema))
    await runtime.open()
    if how.startswith("stream-"):
        stream = runtime.execute_message("s1", "note A1")
        print((await anext(stream)).turn_id, flush=True)
        if how == "stream-return":  # read in a task of its own, left running
            reading = asyncio.create_task(_read(stream))
            await _second_call_waits()
            assert not reading.done()
            return
        ctrl_c = asyncio.create_task(_second_call_waits())
        ctrl_c.add_done_callback(lambda _: os.kill(os.getpid(), signal.SIGINT))
        async for _ in stream:  # Ctrl-C comes while the second call waits
            pass
        return
    submission = await runtime.start("s1", "note A1")
    print(submission.turn_id, flush=True)
    if how.startswith("tool-"):
        await TOOL_RAN.wait()  # set by the tool, or cancelled by Ctrl-C (`tool-sigint`)
        return
    await _second_call_waits()
    if how == "raise":
        raise KeyboardInterrupt
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(30)  # cancelled by asyncio's Ctrl-C handling
    if how == "close":
        await runtime.close()


async def _read(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass


def main() -> None:
    url, schema, how = sys.argv[1], sys.argv[2] or None, sys.argv[3]
    if how.startswith("tool-"):
        os.environ["TK_SHUTDOWN_AT_TOOL"] = how.removeprefix("tool-")
    try:
        asyncio.run(_go(url, schema, how))
    except KeyboardInterrupt:
        sys.exit(130)
