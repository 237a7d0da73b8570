"""The agent `turnkit worker` runs in the crash-recovery tests (loaded by import path).

Its model decides from the request alone (so a fresh process continues where a killed
one stopped), its tool and its enrichment plugin can be made slow through environment
variables, and every model call, tool run and enrichment is appended to `$TK_TEST_LOG`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from turnkit import Agent, ToolContext, tool
from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallDelta, Usage
from turnkit.plugins import Enrichment, Plugin, PluginContext


def _log(**fields: object) -> None:
    line = (json.dumps({"pid": os.getpid(), **fields}) + "\n").encode()
    fd = os.open(os.environ["TK_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one append: lines of concurrent processes never interleave
    finally:
        os.close(fd)


def read_log(path: Path) -> list[dict[str, object]]:
    """The complete lines of a call log that other processes may still be appending to.

    A line another process is writing at this moment may show up unfinished: it is read
    again (bounded: 2 s), never parsed half-written.
    """
    for _ in range(40):
        if not path.exists():
            return []
        *complete, _unfinished = path.read_bytes().split(b"\n")
        try:
            return [json.loads(line) for line in complete]
        except ValueError:
            time.sleep(0.05)
    raise AssertionError(f"{path} holds a line that is not JSON")


@tool
async def slow_tool(x: int, ctx: ToolContext) -> int:
    """Double a number, slowly when TK_TOOL_SLEEP says so."""
    _log(event="tool", key=ctx.idempotency_key, call=ctx.tool_call_id, turn=ctx.turn_id)
    await asyncio.sleep(float(os.environ.get("TK_TOOL_SLEEP", "0")))
    return x * 2


class SlowEnrichment(Plugin):
    name = "slow-enrichment"

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        _log(event="enrich", text=answer.text)
        await asyncio.sleep(float(os.environ.get("TK_ENRICH_SLEEP", "0")))
        return None


class RuleModel:
    """Asks for `slow_tool` once, then answers; the answer is always the same string."""

    model = "rule-model"
    provider = "test"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        has_result = any(m.role == "tool" for m in request.messages)
        _log(
            event="model",
            purpose=request.purpose,
            has_result=has_result,
            # What the provider would receive, message by message (for prefix checks).
            messages=[hashlib.sha256(repr(m).encode()).hexdigest()[:16] for m in request.messages],
            last_user=next(str(m.content) for m in reversed(request.messages) if m.role == "user"),
        )
        usage = Usage(input_tokens=10, output_tokens=5)
        if request.purpose == "tool-loop" and not has_result:
            yield ToolCallDelta(
                index=0, tool_call_id="call_fixed", name="slow_tool", arguments='{"x": 21}'
            )
            yield Finish("tool_use", usage)
        elif request.purpose == "tool-loop":
            yield TextDelta("The answer is 42.")
            yield Finish("end_turn", usage)
        else:
            yield TextDelta("The answer is 42.")
            yield Finish("end_turn", usage)


def agent() -> Agent:
    return Agent(
        name="worker-test",
        model=RuleModel(),
        tools=[slow_tool],
        plugins=[SlowEnrichment()],
        skip_stages=frozenset({"anchor-plan"}),
    )
