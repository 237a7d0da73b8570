"""`RedisReplayBuffer`: the replay buffer on Redis Streams (production, many processes).

One stream per turn (`{prefix}:turn:{turn_id}`), trimmed with `MAXLEN ~`, its expiry
refreshed on every publish and shortened to the grace period once a terminal event lands
or the turn is released (paused).
Redis entry ids are the buffer positions; they never leave turnkit.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import urlsplit

from turnkit.errors import ConfigurationError, missing_extra
from turnkit.ids import TurnId
from turnkit.replay import START, BufferEntry, EntriesLostError, ReplaySettings

try:
    import redis.asyncio as aioredis
    from redis.exceptions import NoPermissionError, NoScriptError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("RedisReplayBuffer", "redis", exc) from exc

__all__ = ("RedisReplayBuffer",)

log = logging.getLogger("turnkit.replay")


_told: set[tuple[object, ...]] = set()
"""The Redis servers and users whose refusal of the script this process warned of."""

_MAX_BLOCK_S = 1.0
"""The longest one XREAD blocks (well under redis-py's default 5 s socket timeout)."""


class RedisReplayBuffer:
    """Redis Streams behind the `ReplayBuffer` port.

    `RedisReplayBuffer.from_url(url)` owns its client (closed by `close()`);
    `RedisReplayBuffer(client)` borrows one.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        settings: ReplaySettings | None = None,
        prefix: str = "turnkit",
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.settings = settings or ReplaySettings()
        self.prefix = prefix
        self._owns = owns_client
        self._nomkstream = True
        """Redis takes XADD NOMKSTREAM (6.2 and newer)."""
        self._scripts = True
        """Redis runs this buffer's scripts (a Redis user may be refused EVAL)."""

    @classmethod
    def from_url(
        cls, url: str, *, settings: ReplaySettings | None = None, prefix: str = "turnkit"
    ) -> RedisReplayBuffer:
        """A buffer with its own client for `url` (`redis://127.0.0.1:6379/0`).

        Raises:
            ConfigurationError: `url` is not a Redis URL.
        """
        shown = re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", url)  # no password in logs
        path = urlsplit(url).path.strip("/")
        if url.startswith(("redis://", "rediss://")) and path and not path.isdigit():
            # redis-py ignores a database it cannot read and takes db 0: someone else's.
            raise ConfigurationError(
                f"the Redis URL {shown!r} cannot be used: its database {path!r} is not a "
                "number (redis://host:port/0)"
            )
        try:
            client = aioredis.Redis.from_url(url, decode_responses=False)
        except ValueError as exc:  # a scheme redis-py does not know, a bad port or db
            raise ConfigurationError(f"the Redis URL {shown!r} cannot be used: {exc}") from None
        return cls(client, settings=settings, prefix=prefix, owns_client=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _key(self, turn_id: TurnId) -> str:
        return f"{self.prefix}:turn:{turn_id}"

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        """XADD the entries in one round trip and refresh the stream's expiry.

        Several entries go in one MULTI/EXEC: a reader blocked on the stream wakes once
        with all of them, where pipelined XADDs wake it after the first (one more XREAD
        round trip, and one more write to its client, per batch).
        """
        await self._publish(turn_id, entries, follows=False)

    async def publish_after(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        """`publish`, for a caller whose earlier publish of the turn went through.

        The XADDs carry NOMKSTREAM, which costs nothing more: a stream that is gone (Redis
        restarted empty, or it expired) is not made again.

        Raises:
            EntriesLostError: The turn's stream is gone, with entries readers may not
                have read; nothing of `entries` was added.
        """
        await self._publish_after(turn_id, entries)

    async def _publish_after(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> str | None:
        if not self._nomkstream:
            return await self._publish(turn_id, entries, follows=False)
        try:
            return await self._publish(turn_id, entries, follows=True)
        except aioredis.ResponseError as exc:
            if not _refuses_nomkstream(exc):
                raise  # refused for now (OOM, BUSY, NOREPLICAS): a failed publish
            # A Redis older than 6.2 refuses NOMKSTREAM (and ran nothing): publish as before.
            position = await self._publish(turn_id, entries, follows=False)
            self._nomkstream = False
            return position

    async def publish_checked(
        self,
        turn_id: TurnId,
        entries: Sequence[tuple[int | None, bytes, bool]],
        *,
        after: str | None,
        floor: str | None = None,
    ) -> str | None:
        """`publish`, for the one publisher of a turn: checked, and the last entry's position.

        Args:
            turn_id: The turn whose stream gets the entries.
            entries: `(seq, wire bytes, is_terminal)` each, in order.
            after: The position `publish_checked` returned to this caller last (None: it added
                nothing yet, so nothing is checked).
            floor: The entries come after this position, whatever ids the stream gives
                now: the caller's last position, when Redis lost it. A Redis that came
                back with an older copy of the stream (a snapshot, an AOF synced up to a
                second before, a replica promoted before it caught up) gives new entries
                ids after its own newest, which, on a host whose clock is behind, readers
                already read past.

        Returns:
            The position of the last entry added (None: `entries` is empty).

        Raises:
            EntriesLostError: The stream has no entry at `after` (Redis lost it, and maybe
                more, with the stream or with an older copy of it); nothing was added.
        """
        if not entries:
            return None
        if not self._scripts:  # as before: only a stream that is gone is noticed
            if after is None:
                return await self._publish(turn_id, entries, follows=False)
            return await self._publish_after(turn_id, entries)
        key = self._key(turn_id).encode()
        ttl = self.settings.ttl_s
        args: list[bytes] = []
        for seq, data, terminal in entries:
            args += _fields(seq, data, terminal)[1::2]
            if terminal:
                ttl = self.settings.terminal_grace_s
        head = (
            (after or "").encode(),
            _next(floor).encode() if floor else b"",
            str(self.settings.max_entries).encode(),
            str(int(ttl * 1000)).encode(),
        )
        tail = (b"1", key, *head, *args)
        try:
            try:
                reply = await self._script(tail)
            except (aioredis.ConnectionError, OSError):
                # As `_publish`: sent again only if it did not run before the connection broke.
                landed = await self._landed(key, entries)
                if landed is not None:
                    await self._round_trip(_command(b"PEXPIRE", key, head[-1]), 1)
                    return landed
                reply = await self._script(tail)
        except aioredis.ResponseError as exc:
            if not self._refused(exc):
                raise  # refused for now (OOM, BUSY, NOREPLICAS): a failed publish
            return await self.publish_checked(turn_id, entries, after=after, floor=floor)
        if reply is None:
            raise EntriesLostError(f"the replay buffer lost entries of turn {turn_id}")
        return _id(reply)

    def _refused(self, exc: aioredis.ResponseError) -> bool:
        """Whether `exc` refuses this buffer's script for good.

        If so, this buffer publishes without it from now on, and says so once.
        """
        if not _refuses_scripts(exc):
            return False
        if self._scripts:
            self._scripts = False
            pool = self.client.connection_pool.connection_kwargs
            user = tuple(pool.get(k) for k in ("host", "port", "path", "db", "username"))
            if user in _told:  # another buffer of this process said so already (a CLI check)
                return True
            _told.add(user)
            log.warning(
                "Redis refuses this replay buffer's script (%s): publishes go without it, "
                "and a Redis that comes back with an older copy of a turn's stream goes "
                "unnoticed (allow its user EVALSHA, and EVAL or SCRIPT LOAD)",
                exc,
            )
        return True

    async def _script(self, tail: tuple[bytes, ...]) -> Any:
        """`_APPEND` run on `tail` (EVALSHA; loaded first when Redis does not have it).

        A Redis that restarted forgot it: EVAL runs it and keeps it, or, for a user that
        may not EVAL, SCRIPT LOAD loads it (a user refused both refuses the script).
        """
        try:
            [reply] = await self._send(_command(b"EVALSHA", _APPEND_SHA, *tail), 1)
        except NoScriptError:
            try:
                [reply] = await self._send(_command(b"EVAL", _APPEND, *tail), 1)
            except NoPermissionError:
                await self._send(_command(b"SCRIPT", b"LOAD", _APPEND), 1)
                [reply] = await self._send(_command(b"EVALSHA", _APPEND_SHA, *tail), 1)
        return reply

    async def _publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]], *, follows: bool
    ) -> str | None:
        """MULTI/EXEC the XADDs; the position of the last entry added."""
        if not entries:
            return None
        key = self._key(turn_id).encode()
        ttl = self.settings.ttl_s
        head = (b"XADD", key, *((b"NOMKSTREAM",) if follows else ()), b"MAXLEN", b"~")
        maxlen = str(self.settings.max_entries).encode()
        commands = []
        for seq, data, terminal in entries:
            commands.append(_command(*head, maxlen, b"*", *_fields(seq, data, terminal)))
            if terminal:
                ttl = self.settings.terminal_grace_s
        expire = _command(b"PEXPIRE", key, str(int(ttl * 1000)).encode())
        commands.append(expire)
        if len(entries) == 1:
            packed, count = b"".join(commands), len(commands)
        else:
            packed, count = b"".join((_MULTI, *commands, _EXEC)), len(commands) + 2
        try:
            replies = await self._send(packed, count)
        except (aioredis.ConnectionError, OSError):
            # Tried once more on a new connection (a pooled one dies with a Redis restart),
            # unless Redis ran it before the connection broke: sent again, its entries
            # would be streamed twice. Not after a timeout: Redis may yet run it.
            landed = await self._landed(key, entries)
            if landed is not None:
                await self._round_trip(expire, 1)
                return landed
            replies = await self._send(packed, count)
        if len(entries) == 1:
            first = last = replies[0]
        else:
            results = replies[-1] or ()  # EXEC's; None: the transaction was aborted
            for reply in results:
                if isinstance(reply, Exception):
                    raise reply
            first = results[0] if results else None
            last = results[-2] if results else None  # the last XADD's (PEXPIRE is last)
        if follows and first is None:  # NOMKSTREAM: the stream is gone, nothing was added
            raise EntriesLostError(f"the replay buffer lost the entries of turn {turn_id}")
        return None if last is None else _id(last)

    async def _landed(
        self, key: bytes, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> str | None:
        """The position of the last of `entries`, if the stream ends with them; else None.

        A publish whose reply was lost ran when it does. One publisher writes a turn, and
        every entry's data has its event's time to the microsecond: the newest entries
        equal to these are these.
        """
        count = str(len(entries)).encode()
        [newest] = await self._round_trip(
            _command(b"XREVRANGE", key, b"+", b"-", b"COUNT", count), 1
        )
        if not newest or len(newest) < len(entries):
            return None
        for (_, fields), entry in zip(newest, reversed(entries), strict=False):
            if list(fields) != list(_fields(*entry)):
                return None
        return _id(newest[0][0])

    async def tail(self, turn_id: TurnId) -> str:
        """The newest entry id, or "0"."""
        newest: Any = await self.client.xrevrange(self._key(turn_id), count=1)
        return _id(newest[0][0]) if newest else START

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        """XREAD after `after`, blocking up to `wait_s`.

        A long wait is split into blocks of at most `_MAX_BLOCK_S`: a single XREAD that
        blocks longer than the client's socket timeout (redis-py: 5 s) fails instead.
        """
        key = self._key(turn_id).encode()
        deadline = time.monotonic() + wait_s
        reply: Any = None
        for _ in range(int(wait_s / _MAX_BLOCK_S) + 2):  # bounded; usually one round
            remaining = deadline - time.monotonic()
            block = max(1, int(min(remaining, _MAX_BLOCK_S) * 1000)) if remaining > 0 else None
            head = [b"XREAD", b"COUNT", str(limit).encode()]
            if block is not None:
                head += [b"BLOCK", str(block).encode()]
            [reply] = await self._round_trip(_command(*head, b"STREAMS", key, after.encode()), 1)
            if reply or block is None or remaining <= _MAX_BLOCK_S:
                break
        # RESP2 replies [[key, items]], RESP3 ones {key: items}; None when nothing came.
        streams = reply.values() if isinstance(reply, dict) else (s[1] for s in reply or ())
        entries: list[BufferEntry] = []
        for items in streams:
            for entry_id, flat in items:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                raw_seq = fields.get(b"s", b"")
                entries.append(
                    BufferEntry(
                        position=_id(entry_id),
                        seq=int(raw_seq) if raw_seq else None,
                        data=bytes(fields[b"d"]),
                        is_terminal=fields.get(b"t") == b"1",
                    )
                )
        return entries

    async def _round_trip(self, packed: bytes, replies: int) -> list[Any]:
        """Send `packed` (RESP commands) on one pooled connection and read their replies.

        The per-call work of redis-py's command and pipeline objects cost more than the
        round trip itself. A call that failed on its connection is tried once more on a
        fresh one (a pooled connection dies with a Redis restart), as redis-py's commands
        retry. Only for calls that may run twice: a publish checks first (`_publish`).
        """
        try:
            return await self._send(packed, replies)
        except (aioredis.ConnectionError, aioredis.TimeoutError, OSError):
            return await self._send(packed, replies)

    async def _send(self, packed: bytes, replies: int, *, errors: bool = False) -> list[Any]:
        """The replies to `packed`; a refusal raises, or with `errors`, is a reply."""
        pool = self.client.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(packed, check_health=False)
            out: list[Any] = []
            for _ in range(replies):
                try:
                    out.append(await conn.read_response())
                except aioredis.ResponseError as exc:  # the reply is read: the next follows
                    if not errors:
                        raise
                    out.append(exc)
            return out
        except BaseException:
            await conn.disconnect()  # broken, or unread replies would answer the next caller
            raise
        finally:
            await pool.release(conn)

    async def release(self, turn_id: TurnId) -> None:
        """Shorten the stream's expiry to the grace period (no driver publishes now)."""
        grace_ms = str(int(self.settings.terminal_grace_s * 1000)).encode()
        await self._round_trip(_command(b"PEXPIRE", self._key(turn_id).encode(), grace_ms), 1)

    async def ping(self) -> None:
        """Raise if Redis cannot be reached, or refuses what this buffer needs.

        Every command the buffer sends is tried on a key no turn has, changing nothing. A
        user refused the script gets one warning here (publishes go without it).

        Raises:
            ConfigurationError: Redis answered but refused the connection's setup (a
                database number it does not have, a wrong password or user), the
                commands or keys the buffer needs (its user's ACL), or writes (a
                read-only replica): waiting will not mend it.
        """
        try:  # on a fresh connection if a pooled one died with a Redis restart
            await self._round_trip(_command(b"PING"), 1)
        except (aioredis.ResponseError, aioredis.AuthenticationError) as exc:
            raise ConfigurationError(
                f"Redis refused this replay buffer's connection: {exc} (check the database "
                "number, user and password in the Redis URL)"
            ) from None
        key = self._key(TurnId("ping")).encode()  # no turn's: their ids start with "turn_"
        probes = (
            _command(
                b"XADD", key, b"NOMKSTREAM", b"MAXLEN", b"~", b"1", b"*", *_fields(None, b"", False)
            ),
            _command(b"XRANGE", key, b"-", b"+", b"COUNT", b"1"),
            _command(b"XREVRANGE", key, b"+", b"-", b"COUNT", b"1"),
            _command(b"XREAD", b"COUNT", b"1", b"STREAMS", key, b"0-0"),
            _command(b"PEXPIRE", key, b"1"),
            _command(b"DEL", key),
        )
        packed = b"".join(probes)
        try:  # they change nothing: sent again on a fresh connection if one died
            replies = await self._send(packed, len(probes), errors=True)
        except (aioredis.ConnectionError, aioredis.TimeoutError, OSError):
            replies = await self._send(packed, len(probes), errors=True)
        for reply in replies:
            if not isinstance(reply, aioredis.ResponseError) or _refuses_nomkstream(reply):
                continue  # a Redis older than 6.2 refuses NOMKSTREAM: publishes go without
            if isinstance(reply, aioredis.ReadOnlyError):
                raise ConfigurationError(
                    f"the replay buffer's Redis is a read-only replica ({reply}): point the "
                    "Redis URL at the primary"
                ) from None
            if isinstance(reply, NoPermissionError) or "unknown command" in str(reply):
                raise ConfigurationError(
                    f"Redis refuses this replay buffer's commands or keys ({reply}): give its "
                    "user the ACL in the operations guide (Redis persistence and failover)"
                ) from None
            raise reply  # refused for now (out of memory, busy): ridden out
        if self._scripts:
            head = (b"", b"", str(self.settings.max_entries).encode(), b"1")
            try:
                await self._script((b"1", key, *head))  # no entries: it adds nothing
            except aioredis.ResponseError as exc:
                if not self._refused(exc):
                    raise

    async def drop(self, turn_id: TurnId) -> None:
        """DEL the turn's stream."""
        await self.client.delete(self._key(turn_id))

    async def close(self) -> None:
        """Close the client if this buffer created it."""
        if self._owns:
            self._owns = False
            await self.client.aclose()


def _fields(seq: int | None, data: bytes, terminal: bool) -> tuple[bytes, ...]:
    """An entry's fields as XADD writes them and XRANGE reads them back."""
    s = b"" if seq is None else str(seq).encode()
    return (b"s", s, b"d", data, b"t", b"1" if terminal else b"0")


def _refuses_nomkstream(exc: Exception) -> bool:
    """Whether `exc` is a Redis older than 6.2 refusing XADD's NOMKSTREAM.

    It reads the word as the entry's id; any other refusal (out of memory, busy, too few
    replicas) passes, and the next publish may take NOMKSTREAM again.
    """
    return "Invalid stream ID" in str(exc) or "syntax error" in str(exc)


def _refuses_scripts(exc: Exception) -> bool:
    """Whether `exc` is Redis refusing the script commands themselves.

    A user without EVALSHA, or without both EVAL and SCRIPT LOAD, or scripting off; not a
    key, nor a command the script runs.
    """
    said = str(exc).lower()
    if "unknown command" in said:
        return True
    refused = isinstance(exc, NoPermissionError) or "noperm" in said
    return refused and re.search(r"'(evalsha|eval|script)\b", said) is not None


def _command(*parts: bytes) -> bytes:
    """One command in RESP, the protocol's array of bulk strings."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


_APPEND = b"""
local key, after, first = KEYS[1], ARGV[1], ARGV[2]
if after ~= '' and #redis.call('XRANGE', key, after, after) == 0 then
  return false
end
local id = first ~= '' and first or '*'
local added
for i = 5, #ARGV, 3 do
  local entry = {'XADD', key, 'MAXLEN', '~', ARGV[3], id,
                 's', ARGV[i], 'd', ARGV[i + 1], 't', ARGV[i + 2]}
  if id == '*' then
    added = redis.call(unpack(entry))
  else
    added = redis.pcall(unpack(entry))
    if type(added) == 'table' and added.err then
      entry[6] = '*'
      added = redis.call(unpack(entry))
    end
  end
  id = '*'
end
redis.call('PEXPIRE', key, ARGV[4])
return added
"""
"""`publish_checked` as one script: nothing is added after a hole, and nothing before the floor.

The entry at `after` is the caller's newest: if it is gone, so is what followed it on the
Redis that lost it. `first` (the id right after the floor) is the first entry's id, unless
the stream has an id at or past it already (XADD refuses it, adding nothing): then the
entries come after the stream's own. No XSETID, which a Redis user may be refused, and which
may lower a stream's last id.
"""
_APPEND_SHA = hashlib.sha1(_APPEND).hexdigest().encode()  # Redis names a script by its SHA-1


def _next(position: str) -> str:
    """The entry id right after `position` (`ms-seq`)."""
    ms, _, seq = position.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


_MULTI = _command(b"MULTI")
_EXEC = _command(b"EXEC")


def _id(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
