"""A buffer lagging the Store: no delta after its block's message.complete, no snapshot after it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.ids import TurnId
from turnkit.replay import BufferEntry
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime.reader import Frame
from turnkit.testing import ModelStep, ScriptedModel, call


@tool
async def slow_lookup(q: str) -> str:
    """Takes a few seconds (a real tool does)."""
    await asyncio.sleep(3)
    return q


class SlowRemoteBuffer:
    """An in-memory buffer behind a slow link (as Redis under load): no `publish_now`,
    so the publisher's task sends batches, each reaching the buffer `delay_s` late."""

    def __init__(self, delay_s: float) -> None:
        self.inner = InMemoryReplayBuffer()
        self.delay_s = delay_s

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        await asyncio.sleep(self.delay_s)
        self.inner.publish_now(turn_id, entries)

    async def tail(self, turn_id: TurnId) -> str:
        return await self.inner.tail(turn_id)

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        return await self.inner.read(turn_id, after=after, wait_s=wait_s, limit=limit)

    async def release(self, turn_id: TurnId) -> None:
        await self.inner.release(turn_id)

    async def ping(self) -> None:
        pass

    async def drop(self, turn_id: TurnId) -> None:
        await self.inner.drop(turn_id)

    async def close(self) -> None:
        await self.inner.close()


def _types(frames: list[dict]) -> list[str]:
    return [f["type"] for f in frames]


async def test_a_slow_publisher_never_sends_a_blocks_deltas_after_its_complete(
    tmp_path: Path,
) -> None:
    """The reader catches up from the Store while the buffer lags: the deltas the buffer
    delivers later belong before events already sent (their `message.complete`)."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("slow_lookup", q="x"), text="Let me look that up."),
            ModelStep.text_reply("Found it."),
        ]
    )
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[slow_lookup]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'slow.db'}"),
        replay=SlowRemoteBuffer(1.5),
    )
    async with runtime:
        submission = await runtime.start("s1", "hi")
        frames: list[dict] = []
        async with asyncio.timeout(30):
            async for frame in runtime.reader(keepalive_s=30).follow(submission.turn_id):
                if isinstance(frame, Frame):
                    frames.append(json.loads(frame.data))
    types = _types(frames)
    assert types[-1] == "done"
    completes = [i for i, f in enumerate(frames) if f["type"] == "message.complete"]
    late = [
        f["text"]
        for i, f in enumerate(frames)
        if f["type"] == "message.delta"
        and any(frames[c]["block"]["block_id"] == f["block_id"] and c < i for c in completes)
    ]
    assert late == [], f"deltas sent after their block's message.complete: {late} in {types}"


class LateCompleteBuffer(SlowRemoteBuffer):
    """Publishes at once up to a `message.complete`; from there on `delay_s` late (the
    commit-to-publish window of a remote buffer, widened)."""

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        at = next((i for i, e in enumerate(entries) if b'"type":"message.complete"' in e[1]), None)
        if at is None:
            if self.late:
                await asyncio.sleep(self.delay_s)
            self.inner.publish_now(turn_id, entries)
            return
        self.inner.publish_now(turn_id, entries[:at])
        self.late = True
        await asyncio.sleep(self.delay_s)
        self.inner.publish_now(turn_id, entries[at:])

    late = False


async def test_a_resume_while_a_complete_is_being_published_sends_no_snapshot_after_it(
    tmp_path: Path,
) -> None:
    """Resuming between a block's commit and its publish: the Store sends the block's
    `message.complete`; a snapshot of the same block must not follow it (it reopens a
    finished block on screen, and deltas may follow it)."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("slow_lookup", q="x"), text="Let me look that up."),
            ModelStep.text_reply("Found it."),
        ]
    )
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[slow_lookup]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'late.db'}"),
        replay=LateCompleteBuffer(1.5),
    )
    async with runtime:
        submission = await runtime.start("s1", "hi")
        async with asyncio.timeout(10):
            while True:  # the narration's message.complete is committed, not yet published
                events = [e async for e in runtime.events(submission.turn_id)]
                if any(e.type == "message.complete" for e in events):
                    break
                await asyncio.sleep(0.01)
        cursor = next(e.seq for e in events if e.type == "message.complete") - 1
        frames: list[dict] = []
        async with asyncio.timeout(30):
            async for frame in runtime.reader(keepalive_s=30).follow(
                submission.turn_id, after_seq=cursor
            ):
                if isinstance(frame, Frame):
                    frames.append(json.loads(frame.data))
    types = _types(frames)
    assert types[-1] == "done"
    finished: set[str] = set()
    reopened = []
    for f in frames:
        if f["type"] == "message.complete":
            finished.add(f["block"]["block_id"])
        elif f["type"] in ("message.snapshot", "message.delta") and f["block_id"] in finished:
            reopened.append((f["type"], f["text"]))
    assert reopened == [], f"a finished block reopened: {reopened} in {types}"
