"""`RedisReplayBuffer` under a Redis user whose ACL refuses some commands, on a private Redis.

What an operator may configure: a user without XSETID, one that may EVALSHA but not EVAL
(and maybe not SCRIPT LOAD) across a Redis restart, one refused the stream commands or the
turn keys, a read-only replica, and the ACL line the operations guide gives.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from tests.conformance.test_replay import _delta, _screen, _turn
from tests.support.services import PrivateRedis, private_redis

from turnkit.errors import ConfigurationError
from turnkit.events import MessageDeltaEvent
from turnkit.replay.redis import _APPEND, RedisReplayBuffer
from turnkit.runtime._publish import BufferPublisher

__all__ = ("private_redis",)  # a fixture, re-exported for pytest

_DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.fixture(autouse=True)
def _untold() -> None:
    """A warning said for another test's Redis on the same port is said again."""
    import turnkit.replay.redis

    getattr(turnkit.replay.redis, "_told", set()).clear()


@pytest.fixture
async def admin(private_redis: PrivateRedis) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        yield client
    finally:
        await client.aclose()


async def _user(admin: aioredis.Redis, port: int, *rules: str) -> str:
    """A Redis user `tk` with `rules` (and no password); its URL."""
    await admin.execute_command("ACL", "SETUSER", "tk", "reset", "on", "nopass", *rules)
    return f"redis://tk@127.0.0.1:{port}/0"


def _user_again(port: int, *rules: str) -> None:
    """`_user` on a Redis that restarted (ACL SETUSER is not saved), before anything else
    runs on the event loop: no publish finds the user missing."""
    import redis

    with redis.Redis(port=port) as client:
        client.execute_command("ACL", "SETUSER", "tk", "reset", "on", "nopass", *rules)


def _warnings(caplog: pytest.LogCaptureFixture, words: str) -> int:
    return len([r for r in caplog.records if r.levelno >= logging.WARNING and words in r.message])


@pytest.mark.parametrize("stream", ["older copy", "gone", "past the floor"])
@pytest.mark.parametrize("refused", [(), ("-xsetid",)], ids=["all commands", "no XSETID"])
async def test_entries_published_after_a_floor_land_after_it_whatever_the_user(
    private_redis: PrivateRedis, admin: aioredis.Redis, stream: str, refused: tuple[str, ...]
) -> None:
    """A publisher whose newest entry Redis lost publishes after it (`floor`): its next
    entries get ids after the floor, even when the Redis that came back has a clock behind
    and its user may not XSETID, and after the stream's own newest when that is later."""
    url = await _user(admin, private_redis.port, "~*", "+@all", *refused)
    buffer = RedisReplayBuffer.from_url(url)
    turn = _turn()
    key = buffer._key(turn)
    floor = f"{int(time.time() * 1000) + 60_000}-3"  # written by a host a minute ahead
    if stream == "older copy":
        await admin.xadd(key, {"s": "", "d": "old", "t": "0"}, id="5-0")
    if stream == "past the floor":  # another process added after the floor since
        await admin.xadd(key, {"s": "", "d": "report", "t": "0"}, id=f"{floor[:-2]}-9")
    try:
        position = await buffer.publish_checked(
            turn, [_delta(turn, "Hel"), _delta(turn, "lo")], after=None, floor=floor
        )
        after_floor = await buffer.read(turn, after=floor, wait_s=0)
    finally:
        await buffer.close()
    assert after_floor, "the entries landed before the floor: a reader past it waits"
    assert _screen(after_floor[-2:]) == "Hello"
    assert after_floor[-1].position == position
    if stream == "past the floor":
        assert [e.data for e in after_floor[:1]] == [b"report"]


async def test_a_redis_back_behind_with_an_older_copy_leaves_no_hole_for_a_user_without_xsetid(
    private_redis: PrivateRedis, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The Redis that comes back with an older copy of the stream runs behind the one that
    wrote it, and the buffer's user may not XSETID: a live reader still gets every word."""
    rules = ("~*", "+@all", "-xsetid")
    url = await _user(admin, private_redis.port, *rules)
    buffer = RedisReplayBuffer.from_url(url)
    turn, now = _turn(), datetime.now(UTC)
    ahead = f"{int(time.time() * 1000) + 60_000}-0"  # the Redis that wrote it ran a minute ahead
    await admin.xadd(buffer._key(turn), {"s": ""}, id=ahead)
    await admin.xdel(buffer._key(turn), ahead)
    words = [f"w{i} " for i in range(15)]
    try:
        with caplog.at_level(logging.WARNING, "turnkit.replay"):
            async with BufferPublisher(buffer, turn) as publish:
                for i, word in enumerate(words):
                    if i == 6:
                        await buffer.client.save()  # w0 … w5: the copy Redis comes back with
                    if i == 11:  # the reader is between two reads; w10 is only in Redis
                        private_redis.kill()
                        private_redis.start()
                        _user_again(private_redis.port, *rules)
                    publish(MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                                              ts=now, block_id="b", text=word))  # fmt: skip
                    await asyncio.sleep(0.02)
                    if i == 9:
                        seen = await buffer.read(turn, after="0", wait_s=0)
                        text, position = _screen(seen), seen[-1].position
        assert text == "".join(words[:10])
        text = _screen(await buffer.read(turn, after=position, wait_s=0), text)
        assert text == "".join(words)
        assert _warnings(caplog, "") == 0
    finally:
        await buffer.close()


@pytest.mark.parametrize("loads", [True, False], ids=["may SCRIPT LOAD", "may not load"])
async def test_a_user_without_eval_keeps_publishing_across_a_redis_restart(
    private_redis: PrivateRedis,
    admin: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    loads: bool,
) -> None:
    """A user that may EVALSHA but not EVAL: Redis restarts empty and forgets the script.
    One that may SCRIPT LOAD loads it again and keeps the check; one that may not gets one
    warning and publishes unscripted; no publish fails, and a live reader gets every word."""
    rules = ("~*", "+@all", "-eval", *(() if loads else ("-script|load",)))
    url = await _user(admin, private_redis.port, *rules)
    if not loads:  # an operator loaded it
        await admin.script_load(_APPEND)
    buffer = RedisReplayBuffer.from_url(url)
    turn, now = _turn(), datetime.now(UTC)
    words = [f"w{i} " for i in range(15)]
    try:
        with caplog.at_level(logging.WARNING, "turnkit.replay"):
            async with BufferPublisher(buffer, turn) as publish:
                for i, word in enumerate(words):
                    if i == 11:  # the reader is between two reads; w10 is only in Redis
                        private_redis.kill()
                        private_redis.start()
                        _user_again(private_redis.port, *rules)
                    publish(MessageDeltaEvent(session_id="s1", turn_id=turn, stage_id="synthesize",
                                              ts=now, block_id="b", text=word))  # fmt: skip
                    await asyncio.sleep(0.02)
                    if i == 9:
                        seen = await buffer.read(turn, after="0", wait_s=0)
                        text, position = _screen(seen), seen[-1].position
        assert text == "".join(words[:10])
        text = _screen(await buffer.read(turn, after=position, wait_s=0), text)
        assert text == "".join(words)
        assert _warnings(caplog, "unavailable for publishing") == 0
        assert _warnings(caplog, "refuses this replay buffer's script") == (0 if loads else 1)
        assert buffer._scripts is loads
    finally:
        await buffer.close()


@pytest.mark.parametrize(
    "rules",
    [("-eval", "-evalsha"), ("-@scripting",), ("-evalsha", "-eval", "-script")],
    ids=["no EVAL or EVALSHA", "no scripting", "no EVALSHA, EVAL or SCRIPT"],
)
async def test_a_user_refused_scripts_is_told_once_at_startup(
    private_redis: PrivateRedis,
    admin: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    rules: tuple[str, ...],
) -> None:
    """The warning comes when the buffer is pinged (at startup), once; publishes go."""
    url = await _user(admin, private_redis.port, "~*", "+@all", *rules)
    buffer = RedisReplayBuffer.from_url(url)
    turn = _turn()
    try:
        with caplog.at_level(logging.WARNING, "turnkit.replay"):
            await buffer.ping()
            assert _warnings(caplog, "refuses this replay buffer's script") == 1
            await buffer.ping()
            position = await buffer.publish_checked(turn, [_delta(turn, "Hel")], after=None)
            await buffer.publish_checked(turn, [_delta(turn, "lo")], after=position)
        assert _screen(await buffer.read(turn, after="0", wait_s=0)) == "Hello"
        assert _warnings(caplog, "refuses this replay buffer's script") == 1
    finally:
        await buffer.close()


@pytest.mark.parametrize(
    ("rules", "named"),
    [
        (("~*", "+@all", "-xadd"), "xadd"),
        (("~*", "+@all", "-xread"), "xread"),
        (("~*", "+@all", "-xrevrange"), "xrevrange"),
        (("~*", "+@all", "-pexpire"), "pexpire"),
        (("~*", "+@all", "-del"), "del"),
        (("~other:*", "+@all"), "keys"),
        (("~*", "+@all", "-@write"), "xadd"),
    ],
    ids=["no XADD", "no XREAD", "no XREVRANGE", "no PEXPIRE", "no DEL", "other keys", "read only"],
)
async def test_a_user_refused_the_stream_commands_is_a_configuration_error_at_startup(
    private_redis: PrivateRedis, admin: aioredis.Redis, rules: tuple[str, ...], named: str
) -> None:
    """A user that may not run a command every publish or read needs (or may not touch the
    turns' keys) is refused when the buffer is pinged, naming what is missing, instead of
    every publish failing later."""
    url = await _user(admin, private_redis.port, *rules)
    buffer = RedisReplayBuffer.from_url(url)
    try:
        with pytest.raises(ConfigurationError, match=f"(?i)refuses.*{named}.*ACL"):
            await buffer.ping()
    finally:
        await buffer.close()


async def test_a_read_only_replica_is_a_configuration_error_at_startup(
    private_redis: PrivateRedis,
) -> None:
    """A URL that points at a replica: every publish would fail; the ping says so."""
    replica = PrivateRedis()
    replica.start()
    buffer = RedisReplayBuffer.from_url(replica.url)
    try:
        await buffer.client.replicaof("127.0.0.1", str(private_redis.port))
        with pytest.raises(ConfigurationError, match="read-only replica"):
            await buffer.ping()
    finally:
        await buffer.close()
        replica.close()


def _documented_acl() -> list[str]:
    """The `ACL SETUSER` line of the operations guide, as words."""
    lines = [s.strip() for s in _DOCS.read_text().splitlines() if "ACL SETUSER turnkit " in s]
    assert len(lines) == 1, "the operations guide gives one ACL line for turnkit's user"
    return lines[0].split()[2:]


async def test_the_documented_acl_is_all_the_buffer_needs(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The operations guide's ACL line, on a real Redis: no warning, nothing refused,
    every call the buffer makes goes through, across a Redis restart too."""
    name, *rules = _documented_acl()
    rules = [re.sub(r"^>.*", ">secret", rule) for rule in rules]

    def setuser() -> None:  # before anything else runs on the event loop
        import redis

        with redis.Redis(port=private_redis.port) as client:
            client.execute_command("ACL", "SETUSER", name, *rules)

    setuser()
    buffer = RedisReplayBuffer.from_url(f"redis://{name}:secret@127.0.0.1:{private_redis.port}/0")
    turn, other = _turn(), _turn()
    try:
        with caplog.at_level(logging.WARNING, "turnkit.replay"):
            await buffer.ping()
            position = await buffer.publish_checked(turn, [_delta(turn, "Hel")], after=None)
            position = await buffer.publish_checked(
                turn, [_delta(turn, "lo"), _delta(turn, ", ")], after=position
            )
            await buffer.publish(other, [_delta(other, "a"), _delta(other, "b")])
            await buffer.publish_after(other, [_delta(other, "c")])
            assert _screen(await buffer.read(other, after="0", wait_s=0.01)) == "abc"
            assert await buffer.tail(turn) == position
            private_redis.kill()
            private_redis.start()
            setuser()
            await buffer.ping()
            position = await buffer.publish_checked(
                turn, [_delta(turn, "world")], after=None, floor=position
            )
            assert await buffer.tail(turn) == position
            await buffer.release(turn)
            await buffer.drop(other)
        assert _screen(await buffer.read(turn, after="0", wait_s=0)) == "world"
        assert await buffer.read(other, after="0", wait_s=0) == []
        assert buffer._scripts
        assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        await buffer.close()


class _Cutter:
    """A TCP proxy to Redis that closes the client's connection instead of passing on a
    command containing `trigger` (as a connection that broke before Redis read it)."""

    def __init__(self, port: int, trigger: bytes) -> None:
        self.port, self.trigger, self.armed = port, trigger, 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://tk@127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

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


async def test_a_script_refused_when_a_publish_is_sent_again_is_told_not_raised(
    private_redis: PrivateRedis, admin: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection breaks before Redis read a publish, and the publish sent again on a
    new connection finds the script gone (Redis restarted) and its user may not load it:
    one warning, and the publish goes without the script instead of failing."""
    await _user(admin, private_redis.port, "~*", "+@all", "-eval", "-script|load")
    await admin.script_load(_APPEND)
    cutter = _Cutter(private_redis.port, b"EVALSHA")
    turn = _turn()
    async with cutter as url:
        buffer = RedisReplayBuffer.from_url(url)
        try:
            with caplog.at_level(logging.WARNING, "turnkit.replay"):
                position = await buffer.publish_checked(turn, [_delta(turn, "Hel")], after=None)
                await admin.script_flush()  # as a Redis that restarted
                cutter.armed = 1
                position = await buffer.publish_checked(turn, [_delta(turn, "lo")], after=position)
                assert cutter.armed == 0
            assert _screen(await buffer.read(turn, after="0", wait_s=0)) == "Hello"
            assert position == await buffer.tail(turn)
            assert _warnings(caplog, "refuses this replay buffer's script") == 1
        finally:
            await buffer.close()


@pytest.mark.parametrize("command", [["serve", "--port", "1"], ["worker"]])
def test_serve_and_worker_refuse_a_redis_user_without_the_stream_commands_in_one_line(
    private_redis: PrivateRedis, tmp_path: Path, command: list[str]
) -> None:
    """`TURNKIT_REDIS_URL` names a user refused XADD: the process stops at start (exit 2,
    one line naming what Redis refused), not once its turns publish."""
    import os
    import subprocess
    import sys

    import redis

    with redis.Redis(port=private_redis.port) as client:
        client.execute_command("ACL", "SETUSER", "tk", "on", "nopass", "~*", "+@all", "-xadd")
    env = {**os.environ, "TURNKIT_GC": "python", "TURNKIT_REDIS_URL": _url(private_redis)}
    env.pop("TURNKIT_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *command],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "turnkit: Redis refuses this replay buffer's commands or keys (this user has no "
        "permissions to run the 'xadd' command)"
    ), done.stderr
    assert done.stderr.count("\n") == 1


def _url(server: PrivateRedis) -> str:
    return f"redis://tk@127.0.0.1:{server.port}/0"
