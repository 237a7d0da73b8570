"""A reader that resumes while a block is being written gets its text so far, then live.

Stop keeps the partial text as an interrupted block: in history, in the audit, and in
what the next turn's model reads.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL, require_service
from tests.support.services import PrivateRedis, private_redis
from turnkit import Agent, ModelFamily, ProviderError, RuntimeConfig, SessionRuntime, tool
from turnkit.clock import SystemClock
from turnkit.events import (
    DurableEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    MessageSnapshotEvent,
    ProviderCascadeEvent,
    TurnRecoveringEvent,
    encode_event,
)
from turnkit.ids import TurnId
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
    text_of,
)
from turnkit.replay import BufferEntry, ReplayBuffer
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime.reader import _Buffer, _snapshots
from turnkit.testing import ModelStep, ScriptedModel, call

__all__ = ("private_redis",)  # a fixture, re-exported for pytest

WORDS = [f"word{i} " for i in range(40)]


class SlowWriter:
    """Writes 40 words, 20 ms apart; remembers what every request carried."""

    model = "slow-writer"
    provider = "test"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        for word in WORDS:
            yield TextDelta(word)
            await asyncio.sleep(0.02)
        yield Finish("end_turn", Usage(input_tokens=5, output_tokens=40))


@pytest.fixture(params=["memory", "redis"])
async def replay(request: pytest.FixtureRequest) -> AsyncIterator[ReplayBuffer]:
    if request.param == "memory":
        yield InMemoryReplayBuffer()
        return
    require_service("Redis", "127.0.0.1", 6379)
    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(REDIS_URL, prefix=f"tk-mid-{uuid.uuid4().hex[:8]}")
    yield buffer
    await buffer.close()


def _runtime(tmp_path: Path, replay: ReplayBuffer, model: SlowWriter) -> SessionRuntime:
    agent = Agent(model=model, skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'mid.db'}")
    return SessionRuntime(agent=agent, config=config, replay=replay)


async def test_a_reader_resuming_mid_block_sees_the_whole_text_once(
    tmp_path: Path, replay: ReplayBuffer
) -> None:
    async with _runtime(tmp_path, replay, SlowWriter()) as runtime:
        submission = await runtime.start("s1", "write")
        cursor, seen = 0, ""
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(submission.turn_id):
                if isinstance(event, DurableEvent):
                    cursor = event.seq
                if isinstance(event, MessageDeltaEvent):
                    seen += event.text
                    if len(seen) > 60:
                        break  # the connection drops mid-answer
        screen, snapshots = "", 0
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(submission.turn_id, after_seq=cursor):
                if isinstance(event, MessageSnapshotEvent):
                    screen, snapshots = event.text, snapshots + 1  # replaces the block
                elif isinstance(event, MessageDeltaEvent):
                    screen += event.text
                elif isinstance(event, MessageCompleteEvent):
                    complete = event.block.text
    assert snapshots == 1
    assert screen == "".join(WORDS)  # whole, nothing twice
    assert complete == screen


async def test_stop_keeps_the_partial_text_as_an_interrupted_block(
    tmp_path: Path, replay: ReplayBuffer
) -> None:
    model = SlowWriter()
    async with _runtime(tmp_path, replay, model) as runtime:
        submission = await runtime.start("s1", "write")
        seen = ""
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(submission.turn_id):
                if isinstance(event, MessageDeltaEvent):
                    seen += event.text
                    if len(seen) > 60:
                        await runtime.cancel(submission.turn_id)
                        break
        record = await runtime.turn(submission.turn_id)
        events = [e async for e in runtime.events(submission.turn_id)]
        [turn] = await runtime.history("s1")
        rows = await runtime.audit(submission.turn_id)
        await runtime.start("s1", "go on")
        async with asyncio.timeout(20):
            while len(model.requests) < 2:
                await asyncio.sleep(0.02)

    assert record.status == "cancelled"
    [kept] = [e for e in events if isinstance(e, MessageCompleteEvent)]
    assert kept.block.interrupted
    assert not kept.block.is_answer
    assert kept.block.text.startswith(seen)
    assert turn.blocks[-1] == kept.block  # history shows it
    interrupted = [r.payloads.interrupted_block for r in rows if r.payloads.interrupted_block]
    assert interrupted[0].block_id == kept.block.block_id
    assert interrupted[0].chars == len(kept.block.text)
    following = model.requests[1].messages
    assistant = [text_of(m.content) for m in following if m.role == "assistant"]
    assert any(kept.block.text in text for text in assistant)  # the next turn reads it


class BreaksMidBlock:
    """Writes a little, then fails with a retriable 502: the family walks on."""

    model = "breaks"
    provider = "test"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("VOIDED by the cascade ")
        raise ProviderError("bad gateway", status_code=502)


async def test_a_reader_resuming_after_a_cascade_gets_no_snapshot_of_the_void_block(
    tmp_path: Path, replay: ReplayBuffer
) -> None:
    agent = Agent(
        model=ModelFamily("writers", [BreaksMidBlock(), SlowWriter()]),
        skip_stages=frozenset({"anchor-plan"}),
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'cascade.db'}")
    async with SessionRuntime(agent=agent, config=config, replay=replay) as runtime:
        submission = await runtime.start("s1", "write")
        cursor, seen = 0, ""
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(submission.turn_id):
                if isinstance(event, ProviderCascadeEvent):
                    cursor = event.seq
                elif isinstance(event, MessageDeltaEvent) and cursor:
                    seen += event.text
                    if len(seen) > 30:
                        break  # the connection drops mid-answer, after the cascade
        screen: dict[str, str] = {}
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(submission.turn_id, after_seq=cursor):
                if isinstance(event, MessageSnapshotEvent):
                    screen[event.block_id] = event.text  # replaces the block
                elif isinstance(event, MessageDeltaEvent):
                    screen[event.block_id] = screen.get(event.block_id, "") + event.text
    assert list(screen.values()) == ["".join(WORDS)]  # nothing of the failed rung's block


async def test_a_block_a_recovering_attempt_writes_again_is_snapshotted_from_its_restart() -> None:
    buffer, clock = InMemoryReplayBuffer(), SystemClock()
    ids = {"session_id": "s1", "turn_id": "t1", "ts": clock.now()}

    def delta(text: str, stage: str = "tool-loop") -> tuple[None, bytes, bool]:
        event = MessageDeltaEvent(**ids, stage_id=stage, block_id=f"blk-{stage}", text=text)
        return (None, encode_event(event), False)

    recovering = TurnRecoveringEvent(
        **ids, seq=4, stage_id="runtime", attempt=2, cause="lease-expired",
        resumed_from="checkpoint", last_seq=3,
    )  # fmt: skip
    taken_over = (4, encode_event(recovering), False)
    await buffer.publish("t1", [delta("Hel"), delta("lo, wor"), taken_over])
    await buffer.publish("t1", [delta("Hel"), delta("lo")])  # the new attempt, from the start
    reader_buffer = _Buffer(buffer, "t1")
    await reader_buffer.sync()
    [snapshot], partial = await _snapshots(reader_buffer, clock)
    assert b'"text":"Hello"' in snapshot.data  # not "Hello, worHello"
    assert partial == set()


@tool
async def look_up(n: int) -> int:
    """Look a number up."""
    return n


class LooksUpThenWrites(SlowWriter):
    """Calls `look_up`, then writes the answer as SlowWriter does: its block is still
    being written when the tool loop's stage ends, and completes in synthesize."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if not any(m.role == "tool" for m in request.messages):
            yield ToolCallDelta(index=0, tool_call_id="c1", name="look_up", arguments='{"n": 1}')
            yield Finish("tool_use", Usage(input_tokens=5, output_tokens=5))
            return
        async for chunk in super().stream(request):
            yield chunk


class _LosesItsData(InMemoryReplayBuffer):
    """Loses every entry of a turn once `after` deltas were published, as a Redis that
    restarted empty does; the next read fails (readers notice the outage)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.deltas = 0
        self.fail_reads = 0

    def publish_now(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        super().publish_now(turn_id, entries)
        self.deltas += sum(b'"message.delta"' in data for _, data, _ in entries)
        if self.deltas >= self.after and self.after:
            self.after = 0
            self._turns.pop(turn_id, None)  # positions go on above the old ones, as in Redis
            self.fail_reads = 1

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        if self.fail_reads:
            self.fail_reads -= 1
            raise ConnectionError("Redis restarted")
        return await super().read(turn_id, after=after, wait_s=wait_s, limit=limit)


async def test_a_buffer_that_lost_a_blocks_start_sends_no_snapshot_of_its_tail(
    tmp_path: Path,
) -> None:
    """Redis restarted empty mid-block: the reader follows the Store, comes back to the
    buffer, and must not send a snapshot built from the deltas published since (the
    block's tail, as if it were its text so far); the block arrives whole when complete."""
    buffer = _LosesItsData(after=10)
    agent = Agent(
        model=LooksUpThenWrites(), tools=[look_up], skip_stages=frozenset({"anchor-plan"})
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'lost.db'}")
    async with SessionRuntime(agent=agent, config=config, replay=buffer) as runtime:
        submission = await runtime.start("s1", "write")
        screen: dict[str, str] = {}
        snapshots: list[str] = []
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(submission.turn_id):
                if isinstance(event, MessageSnapshotEvent):
                    snapshots.append(event.text)
                    screen[event.block_id] = event.text
                elif isinstance(event, MessageDeltaEvent):
                    screen[event.block_id] = screen.get(event.block_id, "") + event.text
                elif isinstance(event, MessageCompleteEvent):
                    whole = event.block.text
                    assert whole.startswith(screen.get(event.block.block_id, "")), screen
    assert whole == "".join(WORDS)
    assert buffer.after == 0  # the buffer did lose its data mid-block
    assert all("".join(WORDS).startswith(text) for text in snapshots), snapshots


async def test_a_snapshot_of_a_block_whose_start_the_buffer_lacks_is_never_built() -> None:
    buffer, clock = InMemoryReplayBuffer(), SystemClock()
    ids = {"session_id": "s1", "turn_id": "t1", "ts": clock.now(), "stage_id": "tool-loop"}

    def delta(text: str) -> tuple[None, bytes, bool]:
        return (None, encode_event(MessageDeltaEvent(**ids, block_id="blk", text=text)), False)

    # What a stream holds after Redis restarted empty mid-block: the block's tail only.
    await buffer.publish("t1", [delta("word10 "), delta("word11 ")])
    reader_buffer = _Buffer(buffer, "t1")
    await reader_buffer.sync()
    assert await _snapshots(reader_buffer, clock) == ([], {"blk"})
    # A publisher whose publishes failed sends the text so far: whole again from there.
    so_far = MessageSnapshotEvent(**ids, block_id="blk", text="word0 word11 ")
    await buffer.publish("t1", [(None, encode_event(so_far), False), delta("word12 ")])
    await reader_buffer.sync()
    [snapshot], partial = await _snapshots(reader_buffer, clock)
    assert b'"text":"word0 word11 word12 "' in snapshot.data
    assert partial == set()


async def test_a_redis_restarted_empty_mid_block_leaves_no_hole_on_a_live_readers_screen(
    db: tuple[str, str | None], private_redis: PrivateRedis
) -> None:
    """Redis restarts empty while a reader is busy (its last deltas are in Redis, unread),
    so fast that no call fails: the reader would append the next deltas to text with a
    hole in it. The driver's next publish finds the stream gone and sends the block's text
    so far first."""
    from turnkit.replay.redis import RedisReplayBuffer

    url, schema = db
    buffer = RedisReplayBuffer.from_url(private_redis.url)
    agent = Agent(model=SlowWriter(), skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=url, database_schema=schema)
    screens: list[str] = []
    try:
        async with SessionRuntime(agent=agent, config=config, replay=buffer) as runtime:
            submission = await runtime.start("s1", "write")
            screen = ""
            async with asyncio.timeout(20):
                async for event in runtime.reader().events(submission.turn_id):
                    if isinstance(event, MessageSnapshotEvent):
                        screen = event.text
                    elif isinstance(event, MessageDeltaEvent):
                        screen += event.text
                        if screen == "".join(WORDS[:10]):
                            await asyncio.sleep(0.1)  # busy: the next deltas wait in Redis
                            private_redis.kill()
                            private_redis.start()
                    elif isinstance(event, MessageCompleteEvent):
                        complete = event.block.text
                        break
                    screens.append(screen)
    finally:
        await buffer.close()
    assert complete == "".join(WORDS)
    assert [s for s in screens if not complete.startswith(s)] == []
    assert screen == complete


async def test_a_redis_back_with_an_older_copy_mid_block_loses_nothing_for_any_reader(
    db: tuple[str, str | None], private_redis: PrivateRedis
) -> None:
    """Redis comes back from a snapshot older than the turn's stream, so fast that no call
    fails: the stream is there, without its newest entries. A live reader gets every
    durable event once and in order, and never shows text with a hole in it; so does a
    reader that reconnects with its cursor after the restart."""
    from turnkit.replay.redis import RedisReplayBuffer

    url, schema = db
    buffer = RedisReplayBuffer.from_url(private_redis.url)
    agent = Agent(model=SlowWriter(), skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=url, database_schema=schema)

    async def follow(turn_id: TurnId, after: int, restart: bool) -> tuple[list[int], list[str]]:
        seqs, screens, screen = [], [], ""
        async with asyncio.timeout(20):
            async for event in runtime.reader().events(turn_id, after_seq=after):
                if isinstance(event, DurableEvent):
                    seqs.append(event.seq)
                if isinstance(event, MessageSnapshotEvent):
                    screen = event.text
                elif isinstance(event, MessageDeltaEvent):
                    screen += event.text
                    if restart and screen == "".join(WORDS[:5]):
                        await buffer.client.save()  # the copy Redis comes back with
                    if restart and screen == "".join(WORDS[:10]):
                        await asyncio.sleep(0.1)  # busy: the next deltas wait in Redis
                        private_redis.kill()
                        private_redis.start()
                        cursor.append(seqs[-1])  # another reader reconnects with it now
                screens.append(screen)
        return seqs, screens

    try:
        async with SessionRuntime(agent=agent, config=config, replay=buffer) as runtime:
            submission = await runtime.start("s1", "write")
            cursor: list[int] = []
            live = asyncio.create_task(follow(submission.turn_id, 0, restart=True))
            async with asyncio.timeout(20):
                while not cursor and not live.done():
                    await asyncio.sleep(0.01)
            resumed = await follow(submission.turn_id, cursor[0], restart=False)
            seqs, screens = await live
            record = await runtime.store.get_turn(submission.turn_id)
    finally:
        await buffer.close()
    assert record is not None
    last = record.last_seq
    assert seqs == list(range(1, last + 1))  # each once, in order
    assert resumed[0] == list(range(cursor[0] + 1, last + 1))
    for shown in (screens, resumed[1]):
        assert [s for s in shown if not "".join(WORDS).startswith(s)] == []
        assert shown[-1] == "".join(WORDS)


async def test_progress_reported_after_redis_restarted_empty_does_not_make_the_stream_again(
    private_redis: PrivateRedis, tmp_path: Path
) -> None:
    """A job's progress report is the first publish after Redis restarted empty: made again
    by it, the stream would hide the loss from the driver. It is skipped; the turn's
    later events reach the stream, led by nothing that was lost."""
    from turnkit.replay.redis import RedisReplayBuffer
    from turnkit.tools import ToolContext

    handed: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
    finished = asyncio.Event()

    @tool
    async def hand_off(ctx: ToolContext) -> str:
        """Hand the work to another process and wait for it."""
        await handed.put((ctx.turn_id, ctx.tool_call_id, ctx.callback_token or ""))
        await finished.wait()
        return "done elsewhere"

    agent = Agent(
        model=ScriptedModel(
            [ModelStep.tool_call_reply(call("hand_off")), ModelStep.text_reply("It is done.")]
        ),
        tools=[hand_off],
        skip_stages=frozenset({"anchor-plan"}),
    )
    config = RuntimeConfig(
        database_url=f"sqlite:///{tmp_path / 'progress.db'}", callback_secret="a-long-shared-secret"
    )
    buffer = RedisReplayBuffer.from_url(private_redis.url)
    try:
        async with SessionRuntime(agent=agent, config=config, replay=buffer) as runtime:
            submission = await runtime.start("s1", "hand it off")
            async with asyncio.timeout(20):
                turn_id, call_id, token = await handed.get()
                while not any(  # the driver published up to the call (then Redis restarts)
                    b'"tool.started"' in e.data
                    for e in await buffer.read(submission.turn_id, after="0", wait_s=0)
                ):
                    await asyncio.sleep(0.01)
                private_redis.kill()
                private_redis.start()
                await runtime.report_job_progress(
                    turn_id, token, job_id="job-1", tool_call_id=call_id, progress=0.5
                )
                assert await buffer.read(submission.turn_id, after="0", wait_s=0) == []
                finished.set()
                events = [e async for e in runtime.reader().events(submission.turn_id)]
    finally:
        await buffer.close()
    assert [e.type for e in events][-1] == "done"
    assert "".join(e.text for e in events if isinstance(e, MessageDeltaEvent)) == "It is done."
