"""The ReplayBuffer contract, against the in-memory buffer and the real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import cast

import pytest
from tests.conftest import REDIS_URL, require_service
from tests.support.services import PrivateRedis, private_redis

from turnkit.errors import ConfigurationError
from turnkit.events import DoneEvent, MessageDeltaEvent, encode_event
from turnkit.ids import TurnId
from turnkit.replay import BufferEntry, ReplayBuffer, ReplaySettings
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime._publish import BufferPublisher, Entry

__all__ = ("private_redis",)  # a fixture, re-exported for pytest


@pytest.fixture(params=["memory", "redis"])
async def buffer(request: pytest.FixtureRequest) -> AsyncIterator[ReplayBuffer]:
    settings = ReplaySettings(max_entries=50, ttl_s=60, terminal_grace_s=0.3)
    if request.param == "memory":
        yield InMemoryReplayBuffer(settings)
        return
    require_service("Redis", "127.0.0.1", 6379)
    from turnkit.replay.redis import RedisReplayBuffer

    redis_buffer = RedisReplayBuffer.from_url(
        REDIS_URL, settings=settings, prefix=f"tk-test-{uuid.uuid4().hex[:8]}"
    )
    try:
        yield redis_buffer
    finally:
        await redis_buffer.close()


def _turn() -> TurnId:
    return TurnId(f"turn_{uuid.uuid4().hex}")


async def test_entries_come_back_in_order_after_a_position(buffer: ReplayBuffer) -> None:
    turn = _turn()
    assert await buffer.tail(turn) == "0"
    await buffer.publish(turn, [(1, b"a", False), (None, b"delta", False), (2, b"b", False)])
    entries = await buffer.read(turn, after="0", wait_s=0)
    assert [(e.seq, e.data) for e in entries] == [(1, b"a"), (None, b"delta"), (2, b"b")]
    assert await buffer.tail(turn) == entries[-1].position
    after_first = await buffer.read(turn, after=entries[0].position, wait_s=0)
    assert [e.data for e in after_first] == [b"delta", b"b"]


async def test_a_reader_waits_for_the_next_entry(buffer: ReplayBuffer) -> None:
    turn = _turn()
    position = await buffer.tail(turn)

    async def later() -> None:
        await asyncio.sleep(0.05)
        await buffer.publish(turn, [(1, b"x", False)])

    task = asyncio.create_task(later())
    entries = await buffer.read(turn, after=position, wait_s=5)
    await task
    assert [e.data for e in entries] == [b"x"]
    assert await buffer.read(turn, after=entries[0].position, wait_s=0.05) == []


async def test_a_waiting_reader_gets_a_published_batch_in_one_read(buffer: ReplayBuffer) -> None:
    """One wake-up per batch: a reader does not get its first entry alone, then the rest."""
    turn = _turn()
    position = await buffer.tail(turn)
    batch: list[Entry] = [(1, b"a", False), (None, b"delta", False), (2, b"b", False)]

    async def later() -> None:
        await asyncio.sleep(0.05)
        await buffer.publish(turn, batch)

    task = asyncio.create_task(later())
    entries = await buffer.read(turn, after=position, wait_s=5)
    await task
    assert [(e.seq, e.data) for e in entries] == [(seq, data) for seq, data, _ in batch]


async def test_a_woken_memory_reader_takes_what_a_busy_publisher_adds_in_one_read() -> None:
    """A publisher adding an entry per loop iteration: the reader gets them together."""
    buffer, turn = InMemoryReplayBuffer(), _turn()

    async def stream(n: int) -> None:
        for i in range(n):
            buffer.publish_now(turn, [(None, b"%d" % i, False)])
            await asyncio.sleep(0)

    task = asyncio.create_task(stream(6))
    entries = await buffer.read(turn, after="0", wait_s=5)
    await task
    assert [e.data for e in entries] == [b"0", b"1", b"2", b"3", b"4", b"5"]
    # A lone entry is not held back: it comes as soon as its publisher pauses.
    position = entries[-1].position
    task = asyncio.create_task(stream(1))
    lone = await buffer.read(turn, after=position, wait_s=5)
    await task
    assert [e.data for e in lone] == [b"0"]


async def test_the_buffer_is_bounded(buffer: ReplayBuffer) -> None:
    turn = _turn()
    await buffer.publish(turn, [(n, str(n).encode(), False) for n in range(1, 201)])
    entries = await buffer.read(turn, after="0", wait_s=0, limit=1000)
    assert 50 <= len(entries) < 200  # trimmed (Redis trims approximately)
    assert entries[-1].seq == 200


async def test_a_finished_turn_is_dropped_after_the_grace(buffer: ReplayBuffer) -> None:
    turn = _turn()
    await buffer.publish(turn, [(1, b"a", False), (2, b"done", True)])
    entries = await buffer.read(turn, after="0", wait_s=0)
    assert entries[-1].is_terminal
    await asyncio.sleep(0.6)
    assert await buffer.read(turn, after="0", wait_s=0) == []


async def test_a_released_turn_is_dropped_after_the_grace(buffer: ReplayBuffer) -> None:
    """A paused turn: no terminal entry, no driver publishing; the TTL (60 s) never runs."""
    turn = _turn()
    await buffer.publish(turn, [(1, b"a", False), (2, b"approval.requested", False)])
    await buffer.release(turn)
    assert [e.seq for e in await buffer.read(turn, after="0", wait_s=0)] == [1, 2]
    await asyncio.sleep(0.6)
    assert await buffer.read(turn, after="0", wait_s=0) == []


async def test_a_turn_published_again_after_its_drop_goes_on_after_its_positions(
    buffer: ReplayBuffer,
) -> None:
    """A reader that followed a turn until it paused waits at its old position; once the
    resumed turn publishes, it reads every new entry."""
    turn = _turn()
    await buffer.publish(turn, [(n, b"x", False) for n in range(1, 6)])
    position = await buffer.tail(turn)
    await buffer.release(turn)
    await asyncio.sleep(0.6)
    await buffer.publish(turn, [(6, b"resumed", False), (7, b"done", True)])
    assert [e.seq for e in await buffer.read(turn, after=position, wait_s=0)] == [6, 7]


async def test_drop_forgets_a_turn(buffer: ReplayBuffer) -> None:
    turn = _turn()
    await buffer.publish(turn, [(1, b"a", False)])
    await buffer.drop(turn)
    assert await buffer.read(turn, after="0", wait_s=0) == []


async def test_a_redis_wait_longer_than_the_socket_timeout_returns_empty() -> None:
    """One XREAD blocking past redis-py's socket timeout would raise instead of waiting."""
    require_service("Redis", "127.0.0.1", 6379)
    import redis.asyncio as aioredis

    from turnkit.replay.redis import RedisReplayBuffer

    client = aioredis.Redis.from_url(REDIS_URL, socket_timeout=1.2)
    buffer = RedisReplayBuffer(client, prefix=f"tk-test-{uuid.uuid4().hex[:8]}")
    try:
        started = time.monotonic()
        assert await buffer.read(_turn(), after="0", wait_s=2.5) == []
        assert time.monotonic() - started >= 2.4
    finally:
        await client.aclose()


async def test_events_published_in_process_read_back_as_their_wire_bytes() -> None:
    """A driver in this process hands the in-memory buffer its events (no publisher task);
    readers get the same bytes a Store row or a Redis entry carries, a waiting reader
    wakes, and `done` ends it."""
    buffer = InMemoryReplayBuffer(ReplaySettings(terminal_grace_s=0.2))
    turn = _turn()
    publish = BufferPublisher(buffer, turn)
    now = datetime.now(UTC)
    delta = MessageDeltaEvent(
        session_id="s1", turn_id=turn, stage_id="synthesize", ts=now, block_id="b", text="hi"
    )
    done = DoneEvent(
        session_id="s1", turn_id=turn, stage_id="post-turn", ts=now, seq=2, status="succeeded"
    )
    waiting = asyncio.create_task(buffer.read(turn, after="0", wait_s=5))
    await asyncio.sleep(0.02)
    publish(delta)
    first = await asyncio.wait_for(waiting, 1)
    assert [(e.seq, e.data, e.is_terminal) for e in first] == [(None, encode_event(delta), False)]
    publish(done)
    rest = await buffer.read(turn, after=first[-1].position, wait_s=0)
    assert [(e.seq, e.data, e.is_terminal) for e in rest] == [(2, encode_event(done), True)]
    await asyncio.sleep(0.3)
    assert await buffer.tail(turn) == "0"  # dropped after the terminal grace


async def test_a_publisher_sends_a_streaming_drivers_events_in_few_batches(
    buffer: ReplayBuffer,
) -> None:
    """Events sent one per loop iteration (a streaming model) share a round trip, in order."""
    batches: list[int] = []

    class Counting:
        """The buffer under test, without `publish_now`: the publisher's task batches."""

        async def publish(self, turn_id: TurnId, entries: Sequence[Entry]) -> None:
            batches.append(len(entries))
            await buffer.publish(turn_id, entries)

        async def release(self, turn_id: TurnId) -> None:
            await buffer.release(turn_id)

    turn, now = _turn(), datetime.now(UTC)
    async with BufferPublisher(cast(ReplayBuffer, Counting()), turn) as publish:
        for i in range(40):
            publish(
                MessageDeltaEvent(
                    session_id="s1", turn_id=turn, stage_id="synthesize", ts=now,
                    block_id="b", text=str(i),
                )
            )  # fmt: skip
            await asyncio.sleep(0)
    entries = await buffer.read(turn, after="0", wait_s=0)
    assert [json.loads(e.data)["text"] for e in entries] == [str(i) for i in range(40)]
    assert sum(batches) == 40
    assert len(batches) <= 10


async def test_a_publisher_releases_a_turn_only_when_its_end_did_not_set_the_grace(
    buffer: ReplayBuffer,
) -> None:
    """The batch with `done` sets the grace period itself; a paused attempt releases."""
    released: list[TurnId] = []

    class Counting:
        async def publish(self, turn_id: TurnId, entries: Sequence[Entry]) -> None:
            await buffer.publish(turn_id, entries)

        async def release(self, turn_id: TurnId) -> None:
            released.append(turn_id)
            await buffer.release(turn_id)

    now = datetime.now(UTC)
    done_turn, paused_turn = _turn(), _turn()
    for turn in (done_turn, paused_turn):
        async with BufferPublisher(cast(ReplayBuffer, Counting()), turn) as publish:
            publish(
                MessageDeltaEvent(
                    session_id="s1", turn_id=turn, stage_id="synthesize", ts=now,
                    block_id="b", text="hi",
                )
            )  # fmt: skip
            if turn == done_turn:
                publish(
                    DoneEvent(
                        session_id="s1", turn_id=turn, stage_id="post-turn", ts=now, seq=2,
                        status="succeeded",
                    )
                )  # fmt: skip
    assert released == [paused_turn]
    await asyncio.sleep(0.45)  # both are dropped after the grace (0.3 s)
    assert await buffer.tail(done_turn) == "0"
    assert await buffer.tail(paused_turn) == "0"


async def test_a_cancelled_redis_wait_leaves_no_reply_for_the_next_call() -> None:
    """A reader closed while its XREAD blocks must not leave that reply on a pooled
    connection, where the next call would take it for its own."""
    require_service("Redis", "127.0.0.1", 6379)
    import redis.asyncio as aioredis

    from turnkit.replay.redis import RedisReplayBuffer

    client = aioredis.Redis.from_url(REDIS_URL, max_connections=1)  # one connection, reused
    buffer = RedisReplayBuffer(client, prefix=f"tk-test-{uuid.uuid4().hex[:8]}")
    waiting, other = _turn(), _turn()
    try:
        reader = asyncio.create_task(buffer.read(waiting, after="0", wait_s=5))
        await asyncio.sleep(0.1)  # blocking in XREAD now
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        await buffer.publish(waiting, [(1, b"late", False)])  # would wake the old XREAD
        await buffer.publish(other, [(1, b"mine", False)])
        assert [e.data for e in await buffer.read(other, after="0", wait_s=0)] == [b"mine"]
        assert [e.data for e in await buffer.read(waiting, after="0", wait_s=0)] == [b"late"]
    finally:
        await client.aclose()


async def test_a_redis_restart_costs_no_publish(private_redis: PrivateRedis) -> None:
    """Pooled connections die with the server; the next call goes through on a new one."""
    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(private_redis.url)
    turn = _turn()
    try:
        await buffer.publish(turn, [(1, b"before", False)])
        assert [e.data for e in await buffer.read(turn, after="0", wait_s=0)] == [b"before"]
        private_redis.kill()
        private_redis.start()  # empty again: nothing is saved
        await buffer.publish(turn, [(2, b"after", False)])
        assert [e.seq for e in await buffer.read(turn, after="0", wait_s=0)] == [2]
    finally:
        await buffer.close()


async def test_a_publish_that_timed_out_is_not_sent_twice(private_redis: PrivateRedis) -> None:
    """A reply that is late may still come: Redis ran the batch, so sending it again would
    put every entry (deltas, which readers cannot tell apart) in the stream twice."""
    import redis.asyncio as aioredis

    from turnkit.replay.redis import RedisReplayBuffer

    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.2)
    buffer = RedisReplayBuffer(client, owns_client=True)
    turn = _turn()
    assert private_redis.proc is not None
    try:
        await buffer.publish(turn, [(None, b"warm", False)])
        proc = private_redis.proc
        proc.send_signal(signal.SIGSTOP)  # a server that stalls (a fork, a swap) for 0.3 s
        asyncio.get_running_loop().call_later(0.3, proc.send_signal, signal.SIGCONT)
        try:
            with pytest.raises(aioredis.TimeoutError):
                await buffer.publish(turn, [(None, b"delta", False), (1, b"a", False)])
        finally:
            await asyncio.sleep(0.4)  # the stalled server wakes and runs what it was sent
            proc.send_signal(signal.SIGCONT)
        entries = await buffer.read(turn, after="0", wait_s=0)
        assert [e.data for e in entries] == [b"warm", b"delta", b"a"]
    finally:
        await buffer.close()


async def test_a_refused_redis_command_leaves_no_reply_for_the_next_call() -> None:
    """A command Redis refuses raises, and the replies after it in the same round trip are
    not left for the next call on that connection."""
    require_service("Redis", "127.0.0.1", 6379)
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError

    from turnkit.replay.redis import RedisReplayBuffer

    client = aioredis.Redis.from_url(REDIS_URL, max_connections=1)  # one connection, reused
    prefix = f"tk-test-{uuid.uuid4().hex[:8]}"
    buffer = RedisReplayBuffer(client, prefix=prefix)
    clash, other = _turn(), _turn()
    try:
        await client.set(f"{prefix}:turn:{clash}", b"not a stream")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await buffer.publish(clash, [(1, b"a", False), (2, b"b", False)])
        await buffer.publish(other, [(1, b"mine", False)])
        assert [e.data for e in await buffer.read(other, after="0", wait_s=0)] == [b"mine"]
    finally:
        await client.delete(f"{prefix}:turn:{clash}", f"{prefix}:turn:{other}")
        await client.aclose()


async def test_a_redis_client_speaking_resp3_reads_the_same_entries() -> None:
    """Redis answers a RESP3 client's XREAD with a map, a RESP2 one's with an array."""
    require_service("Redis", "127.0.0.1", 6379)
    import redis.asyncio as aioredis

    from turnkit.replay.redis import RedisReplayBuffer

    client = aioredis.Redis.from_url(REDIS_URL, protocol=3)
    buffer = RedisReplayBuffer(client, prefix=f"tk-test-{uuid.uuid4().hex[:8]}")
    turn = _turn()
    try:
        await buffer.publish(turn, [(1, b"a", False), (None, b"delta", False), (2, b"b", True)])
        entries = await buffer.read(turn, after="0", wait_s=0)
        assert [(e.seq, e.data, e.is_terminal) for e in entries] == [
            (1, b"a", False),
            (None, b"delta", False),
            (2, b"b", True),
        ]
        assert [e.data for e in await buffer.read(turn, after=entries[0].position, wait_s=1)] == [
            b"delta",
            b"b",
        ]
    finally:
        await buffer.drop(turn)
        await client.aclose()


async def test_an_outage_of_the_buffer_is_one_warning_and_its_end_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every publish of every turn fails while Redis is away: the log says so twice, once
    when it starts and once when it ends, not once per publish with a traceback each."""
    down = [True]

    @dataclasses.dataclass  # a user's own buffer: unhashable, no weak references needed
    class Flaky:
        async def publish(self, turn_id: TurnId, entries: Sequence[Entry]) -> None:
            if down[0]:
                raise ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

        async def release(self, turn_id: TurnId) -> None:  # after each turn: it fails too
            if down[0]:
                raise ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    flaky, now = cast(ReplayBuffer, Flaky()), datetime.now(UTC)

    async def one_turn() -> None:
        turn = _turn()
        async with BufferPublisher(flaky, turn) as publish:
            publish(MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                                      ts=now, block_id="b", text="x"))  # fmt: skip

    with caplog.at_level(logging.DEBUG, logger="turnkit.replay"):
        for _ in range(5):
            await one_turn()
        down[0] = False
        await one_turn()
        await one_turn()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(" (")[0] for r in warnings] == [
        "replay buffer unavailable for publishing",
    ]
    back = [r for r in caplog.records if r.getMessage().startswith("replay buffer is back")]
    assert [r.levelno for r in back] == [logging.INFO]  # a recovery is news, not a warning
    assert "ConnectionError: Error 111" in warnings[0].getMessage()
    assert all(r.exc_info is None for r in warnings)  # no traceback per publish


async def test_after_a_failed_publish_a_publisher_sends_each_open_blocks_text_first() -> None:
    """A publish that failed (Redis away, or a timeout) lost deltas: a live reader would
    append the next ones to text with a hole in it. The next publish that goes through
    starts with a snapshot of each block still being written; a completed one gets none."""
    buffer, down = InMemoryReplayBuffer(), [False]

    class Flaky:
        async def publish(self, turn_id: TurnId, entries: Sequence[Entry]) -> None:
            if down[0]:
                raise ConnectionError("Redis is away")
            await buffer.publish(turn_id, entries)

        async def release(self, turn_id: TurnId) -> None:
            await buffer.release(turn_id)

    turn, now = _turn(), datetime.now(UTC)

    def delta(block: str, text: str) -> MessageDeltaEvent:
        return MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize", ts=now,
                                 block_id=block, text=text)  # fmt: skip

    async with BufferPublisher(cast(ReplayBuffer, Flaky()), turn) as publish:
        publish(delta("a", "Hel"))
        publish(delta("b", "one"))
        await asyncio.sleep(0.05)
        down[0] = True
        publish(delta("a", "lo, "))  # lost with its publish
        await asyncio.sleep(0.05)
        down[0] = False
        publish(delta("a", "world"))
        await asyncio.sleep(0.05)
    seen = [json.loads(e.data) for e in await buffer.read(turn, after="0", wait_s=0)]
    assert [(e["type"], e["block_id"], e["text"]) for e in seen] == [
        ("message.delta", "a", "Hel"),
        ("message.delta", "b", "one"),
        ("message.snapshot", "a", "Hello, "),  # the text so far, the lost delta included
        ("message.snapshot", "b", "one"),
        ("message.delta", "a", "world"),
    ]


async def test_a_redis_that_hung_mid_block_leaves_no_hole_in_a_live_readers_text(
    private_redis: PrivateRedis,
) -> None:
    """Redis stops answering while a block streams: the publishes meanwhile time out and
    their deltas are lost. What a reader following the stream assembles (deltas appended,
    a snapshot replacing) is the block's text so far, never text with a hole in it."""
    from redis import asyncio as aioredis

    from turnkit.replay.redis import RedisReplayBuffer

    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.3)
    buffer = RedisReplayBuffer(client)
    turn, now = _turn(), datetime.now(UTC)
    words = [f"w{i} " for i in range(30)]
    assert private_redis.proc is not None
    try:
        async with BufferPublisher(buffer, turn) as publish:
            for i, word in enumerate(words):
                if i == 10:
                    private_redis.proc.send_signal(signal.SIGSTOP)
                if i == 14:
                    await asyncio.sleep(0.5)  # a publish or two time out meanwhile
                    private_redis.proc.send_signal(signal.SIGCONT)
                publish(MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                                          ts=now, block_id="b", text=word))  # fmt: skip
                await asyncio.sleep(0.05)
        text = ""
        for entry in await buffer.read(turn, after="0", wait_s=0):
            event = json.loads(entry.data)
            text = event["text"] if event["type"] == "message.snapshot" else text + event["text"]
            assert "".join(words).startswith(text), text
        assert text == "".join(words)
    finally:
        if private_redis.proc.poll() is None:
            private_redis.proc.send_signal(signal.SIGCONT)
        await client.aclose()


def _screen(entries: Sequence[BufferEntry], text: str = "") -> str:
    """A block's text as a live reader assembles it: deltas appended, a snapshot replacing."""
    for entry in entries:
        event = json.loads(entry.data)
        text = event["text"] if event["type"] == "message.snapshot" else text + event["text"]
    return text


async def test_a_redis_restarted_empty_between_two_publishes_leaves_no_hole_in_a_live_reader(
    private_redis: PrivateRedis,
) -> None:
    """Redis restarts empty so fast that no call fails (each is tried again on a new
    connection): a delta the reader had not read yet is gone with it. The next publish
    notices the stream is gone and sends the block's text so far first."""
    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(private_redis.url)
    turn, now = _turn(), datetime.now(UTC)
    words = [f"w{i} " for i in range(15)]
    try:
        async with BufferPublisher(buffer, turn) as publish:
            for i, word in enumerate(words):
                if i == 11:  # the reader is between two reads; w10 is only in Redis
                    private_redis.kill()
                    private_redis.start()
                publish(MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                                          ts=now, block_id="b", text=word))  # fmt: skip
                await asyncio.sleep(0.02)
                if i == 9:
                    seen = await buffer.read(turn, after="0", wait_s=0)
                    text, position = _screen(seen), seen[-1].position
        assert text == "".join(words[:10])
        text = _screen(await buffer.read(turn, after=position, wait_s=0), text)
        assert text == "".join(words)  # not w0 … w9 w11 … w14: w10 came in the snapshot
    finally:
        await buffer.close()


@pytest.mark.parametrize("clock", ["in step", "behind"])
async def test_a_redis_back_with_an_older_copy_between_two_publishes_leaves_no_hole(
    private_redis: PrivateRedis, clock: str
) -> None:
    """Redis comes back from a snapshot older than the stream (an RDB, an AOF synced a
    second before, a replica promoted before it caught up), so fast that no call fails:
    the deltas after the snapshot are gone, but the stream is there. The next publish
    notices its last entry is gone and sends the block's text so far first. "behind": the
    Redis that came back gives ids below those readers read already (its clock is behind
    the one that wrote them); the publisher's entries still come after them."""
    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(private_redis.url)
    turn, now = _turn(), datetime.now(UTC)
    if clock == "behind":  # the Redis that wrote the stream ran a minute ahead
        ahead = f"{int(time.time() * 1000) + 60_000}-0"
        await buffer.client.xadd(buffer._key(turn), {"s": ""}, id=ahead)
        await buffer.client.xdel(buffer._key(turn), ahead)
    words = [f"w{i} " for i in range(15)]
    try:
        async with BufferPublisher(buffer, turn) as publish:
            for i, word in enumerate(words):
                if i == 6:
                    await buffer.client.save()  # w0 … w5: the copy Redis comes back with
                if i == 11:  # the reader is between two reads; w10 is only in Redis
                    private_redis.kill()
                    private_redis.start()
                publish(MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                                          ts=now, block_id="b", text=word))  # fmt: skip
                await asyncio.sleep(0.02)
                if i == 9:
                    seen = await buffer.read(turn, after="0", wait_s=0)
                    text, position = _screen(seen), seen[-1].position
        assert text == "".join(words[:10])
        text = _screen(await buffer.read(turn, after=position, wait_s=0), text)
        assert text == "".join(words)  # not w0 … w9 w11 … w14: w10 came in the snapshot
        joining = _screen(await buffer.read(turn, after="0", wait_s=0))
        assert joining == "".join(words)  # a reader from the start: w6 … w10 in the snapshot
    finally:
        await buffer.close()


async def test_a_publish_after_a_progress_report_finds_nothing_lost(
    private_redis: PrivateRedis,
) -> None:
    """Another process added to the turn's stream after the publisher's last entry (a
    job's progress report): that entry is still there, so nothing was lost and no text
    is sent again."""
    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(private_redis.url)
    turn = _turn()
    try:
        position = await buffer.publish_checked(turn, [_delta(turn, "Hel")], after=None)
        await buffer.publish_after(turn, [_delta(turn, "(a report)")])
        assert await buffer.publish_checked(turn, [_delta(turn, "lo")], after=position)
        assert _screen(await buffer.read(turn, after="0", wait_s=0)) == "Hel(a report)lo"
    finally:
        await buffer.close()


async def test_a_redis_user_refused_scripts_still_gets_its_publishes(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis user without EVAL and EVALSHA: publishes go as before (one warning says
    what goes unnoticed), and a stream that is gone is still noticed."""
    import redis.asyncio as aioredis

    from turnkit.replay import EntriesLostError
    from turnkit.replay.redis import RedisReplayBuffer

    admin = aioredis.Redis.from_url(private_redis.url)
    await admin.execute_command(
        "ACL", "SETUSER", "noscripts", "on", "nopass", "~*", "&*", "+@all", "-eval", "-evalsha"
    )
    url = f"redis://noscripts@127.0.0.1:{private_redis.port}/0"
    buffer = RedisReplayBuffer.from_url(url)
    turn = _turn()
    try:
        with caplog.at_level(logging.WARNING, "turnkit.replay"):
            position = await buffer.publish_checked(turn, [_delta(turn, "Hel")], after=None)
            position = await buffer.publish_checked(
                turn, [_delta(turn, "lo"), _delta(turn, ", ")], after=position
            )
            assert position == (await buffer.read(turn, after="0", wait_s=0))[-1].position
            await buffer.publish_checked(turn, [_delta(turn, "world")], after=position)
        assert _screen(await buffer.read(turn, after="0", wait_s=0)) == "Hello, world"
        assert len([r for r in caplog.records if "refuses" in r.getMessage()]) == 1
        await admin.delete(buffer._key(turn))  # as a Redis that restarted empty
        with pytest.raises(EntriesLostError):
            await buffer.publish_checked(turn, [_delta(turn, "!")], after=position)
    finally:
        await buffer.close()
        await admin.aclose()


def _delta(turn: TurnId, text: str) -> Entry:
    """A `message.delta` of block `b` as a publisher hands it to the buffer."""
    event = MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                              ts=datetime.now(UTC), block_id="b", text=text)  # fmt: skip
    return (None, encode_event(event), False)


class _ReplyDropper:
    """A TCP proxy to Redis that passes a command containing `trigger` on, waits for its
    reply, and closes the client's connection instead of passing the reply back (as a
    Redis that died after running it, keeping its data, or a proxy that failed, does)."""

    def __init__(self, port: int, trigger: bytes) -> None:
        self.port, self.trigger, self.armed = port, trigger, 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while chunk := await reader.read(65536):
                if self.armed and self.trigger in chunk:
                    self.armed -= 1
                    back.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await back
                    up_writer.write(chunk)
                    await up_reader.read(65536)  # it ran; the reply goes nowhere
                    return
                up_writer.write(chunk)
        finally:
            back.cancel()
            writer.close()
            up_writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while chunk := await source.read(65536):
            sink.write(chunk)


@pytest.mark.parametrize("size", [1, 3])
async def test_a_publish_whose_reply_was_lost_is_not_streamed_twice(
    private_redis: PrivateRedis, size: int
) -> None:
    """The connection breaks after Redis ran a publish, before its reply came: the publish
    is tried again on a new connection only if its entries are not in the stream yet."""
    from turnkit.replay.redis import RedisReplayBuffer

    dropper = _ReplyDropper(private_redis.port, b"XADD")
    turn = _turn()

    async with dropper as url:
        buffer = RedisReplayBuffer.from_url(url)
        try:
            await buffer.publish(turn, [_delta(turn, "Hel")])
            dropper.armed = 1
            await buffer.publish(turn, [_delta(turn, f"lo{i}, ") for i in range(size)])
            assert dropper.armed == 0  # its reply was lost
            entries = await buffer.read(turn, after="0", wait_s=0)
            ttl_ms = await buffer.client.pttl(buffer._key(turn))
        finally:
            await buffer.close()
    assert _screen(entries) == "Hel" + "".join(f"lo{i}, " for i in range(size))  # once each
    assert ttl_ms > 0


async def test_a_passing_refusal_of_a_publish_keeps_the_check_that_redis_lost_the_stream(
    private_redis: PrivateRedis,
) -> None:
    """A publish Redis refuses for a while (NOREPLICAS here; OOM or BUSY alike) is a
    failed publish, not a Redis too old for NOMKSTREAM: later publishes still notice a
    Redis that restarted empty, instead of starting the stream anew with a hole in it."""
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError

    from turnkit.replay import EntriesLostError
    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(private_redis.url)
    admin = aioredis.Redis.from_url(private_redis.url)
    send, refused = buffer._send, []

    async def refusing_once(packed: bytes, replies: int) -> list[object]:
        if b"NOMKSTREAM" in packed and not refused:  # a replica away for one publish
            refused.append(packed)
            await admin.config_set("min-replicas-to-write", 1)
            try:
                return await send(packed, replies)
            finally:
                await admin.config_set("min-replicas-to-write", 0)
        return await send(packed, replies)

    buffer._send = refusing_once  # type: ignore[method-assign]
    turn = _turn()

    try:
        await buffer.publish(turn, [_delta(turn, "a")])
        with pytest.raises(ResponseError, match="NOREPLICAS"):
            await buffer.publish_after(turn, [_delta(turn, "b")])  # failed: the publisher repairs
        assert refused
        await admin.delete(buffer._key(turn))  # as a Redis that restarted empty
        with pytest.raises(EntriesLostError):
            await buffer.publish_after(turn, [_delta(turn, "c")])
        assert await buffer.read(turn, after="0", wait_s=0) == []
    finally:
        await buffer.close()
        await admin.aclose()


async def test_a_redis_older_than_6_2_gets_its_publishes_without_nomkstream(
    private_redis: PrivateRedis,
) -> None:
    """Redis 5 and 6.0 read NOMKSTREAM as the entry's id and refuse it (running nothing):
    the publish goes again as before, and so do the next ones."""
    from redis.exceptions import ResponseError

    from turnkit.replay.redis import RedisReplayBuffer

    buffer = RedisReplayBuffer.from_url(private_redis.url)
    send, refused = buffer._send, []

    async def old_redis(packed: bytes, replies: int) -> list[object]:
        if b"NOMKSTREAM" in packed:  # what Redis 6.0 answers, as redis-py raises it
            refused.append(packed)
            raise ResponseError("Invalid stream ID specified as stream command argument")
        return await send(packed, replies)

    buffer._send = old_redis  # type: ignore[method-assign]
    turn = _turn()

    try:
        await buffer.publish(turn, [_delta(turn, "a")])
        await buffer.publish_after(turn, [_delta(turn, "b")])
        await buffer.publish_after(turn, [_delta(turn, "c"), _delta(turn, "d")])
        assert len(refused) == 1  # asked once
        assert _screen(await buffer.read(turn, after="0", wait_s=0)) == "abcd"
    finally:
        await buffer.close()


@pytest.mark.parametrize(
    "bad", [{"max_entries": 0}, {"ttl_s": 0.0}, {"ttl_s": float("nan")}, {"terminal_grace_s": -1.0}]
)
def test_replay_settings_out_of_range_are_refused(bad: dict[str, float]) -> None:
    """A buffer that keeps no entry, or expires them at once, is a mistake said at once."""
    with pytest.raises(ConfigurationError, match=next(iter(bad))):
        ReplaySettings(**bad)  # type: ignore[arg-type]
