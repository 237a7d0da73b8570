"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.events import DurableEvent, EphemeralEvent, StepStartEvent
from turnkit.ids import SessionId, new_turn_id
from turnkit.models import ModelChunk, ModelRequest
from turnkit.plugins import Enrichment, Plugin, PluginContext
from turnkit.store import NewInput, Submission
from turnkit.testing import ModelStep, ScriptedModel


@tool
async def report(pages: int) -> str:
    """Write a long report (12,000 characters a page)."""
    return "lorem ipsum " * (pages * 1_000)


@tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First addend.
        b: Second addend.
    """
    return a + b


def db_flags(url: str, schema: str | None) -> list[str]:
    """The CLI's `--database-url` (and `--database-schema`, when there is one) for a test db."""
    return ["--database-url", url, *(["--database-schema", schema] if schema else [])]


def durable(events: list[DurableEvent | EphemeralEvent]) -> list[DurableEvent]:
    return [e for e in events if isinstance(e, DurableEvent)]


def types(events: list[DurableEvent | EphemeralEvent]) -> list[str]:
    return [e.type for e in events]  # type: ignore[attr-defined]


def new_input(session: str = "s1", content: str = "hello", **kw: object) -> NewInput:
    fields: dict[str, object] = {
        "session_id": SessionId(session),
        "turn_id": new_turn_id(),
        "content": content,
        "request_id": None,
        "delivery": "queue",
        "agent": "assistant",
        "model": "m",
        "effort": "off",
        "pinned": {"model": "m", "tools": ["add"]},
    }
    fields.update(kw)
    return NewInput(**fields)  # type: ignore[arg-type]


def step_event(sub: Submission, seq: int) -> StepStartEvent:
    return StepStartEvent(
        session_id=sub.session_id,
        turn_id=sub.turn_id,
        stage_id="tool-loop",
        ts=datetime.now(UTC),
        seq=seq,
        step="tool-loop",
        iteration=seq,
    )


class LoopTicker:
    """Counts 10 ms ticks of the event loop while open: evidence nothing blocked it."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    async def __aenter__(self) -> LoopTicker:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class WriteRecorder:
    """An ASGI app wrapped to keep every response body write it sends, in order."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.writes: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                self.writes.append(message["body"])
            await send(message)

        await self.app(scope, receive, sending)


class PostTurnGate(Plugin):
    """Holds a turn in post-turn (its enrichment hook), after the answer is written."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        self.entered.set()
        await self.release.wait()
        return None


class WrappedModel:
    """A test model around `inner`: it answers to `inner`'s model and provider names."""

    inner: ScriptedModel

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def provider(self) -> str:
        return self.inner.provider


class GatedModel(WrappedModel):
    """Answers once `gate` is set, or call n once `gates[n]` is; counts calls in flight."""

    def __init__(self, *, per_call: bool = False) -> None:
        self.inner = ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True)
        self.gate = asyncio.Event()
        self.gates: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.per_call = per_call
        self.calls = 0
        self.active = 0
        self.most = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.active += 1
        self.calls += 1
        self.most = max(self.most, self.active)
        try:
            await (self.gates[self.calls] if self.per_call else self.gate).wait()
            async for chunk in self.inner.stream(request):
                yield chunk
        finally:
            self.active -= 1


async def until(check: Any, what: str) -> None:
    """Wait (10 s at most) until `check()` (sync or async) is true."""
    deadline = time.monotonic() + 10
    while not await _value(check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _value(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


async def turn_status(db: Path, turn_id: str) -> str:
    """A turn's status, read by a runtime of its own on the SQLite file `db`."""
    config = RuntimeConfig(database_url=f"sqlite:///{db}")
    async with SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config) as probe:
        return (await probe.turn(turn_id)).status


async def drain(stream: AsyncIterator[Any]) -> list[Any]:
    """Every event of a stream."""
    return [event async for event in stream]


async def waiting_for_slot(runtime: SessionRuntime, count: int) -> bool:
    """Whether `count` turns wait for a running-turn slot."""
    return runtime.host.slots.waiting == count


async def calls_made(model: GatedModel, count: int) -> bool:
    """Whether the model has been called `count` times."""
    return model.calls == count


async def follow_to_done(runtime: SessionRuntime, turn_id: str, after: int) -> list[Any]:
    """The turn's events after seq `after`, followed live to its `done` (20 s at most)."""
    from turnkit.events import decode_event
    from turnkit.runtime.reader import Frame

    out: list[Any] = []
    async with asyncio.timeout(20):
        async for frame in runtime.reader().follow(turn_id, after_seq=after):  # type: ignore[arg-type]
            if isinstance(frame, Frame) and frame.seq is not None:
                out.append(decode_event(frame.data))
                if out[-1].type == "done":
                    break
    return out
