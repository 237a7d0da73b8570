"""`RedisReplayBuffer`: the replay buffer on Redis Streams (production, many processes).

One stream per turn (`{prefix}:turn:{turn_id}`), trimmed with `MAXLEN ~`, its expiry
refreshed on every publish and shortened to the grace period once a terminal event lands
or the turn is released (paused).
Redis entry ids are the buffer positions; they never leave turnkit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Self

from turnkit.ids import TurnId
from turnkit.replay import START, BufferEntry, ReplaySettings

try:
    import redis.asyncio as aioredis
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        'RedisReplayBuffer needs the "redis" extra: pip install "turnkit[redis]"'
    ) from exc

__all__ = ("RedisReplayBuffer",)


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

    @classmethod
    def from_url(
        cls, url: str, *, settings: ReplaySettings | None = None, prefix: str = "turnkit"
    ) -> RedisReplayBuffer:
        """A buffer with its own client for `url` (`redis://127.0.0.1:6379/0`)."""
        client = aioredis.Redis.from_url(url, decode_responses=False)
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
        """XADD the entries in one round trip and refresh the stream's expiry."""
        if not entries:
            return
        key = self._key(turn_id)
        ttl = self.settings.ttl_s
        pipe = self.client.pipeline(transaction=False)
        for seq, data, terminal in entries:
            fields: dict[Any, Any] = {
                b"s": b"" if seq is None else str(seq).encode(),
                b"d": data,
                b"t": b"1" if terminal else b"0",
            }
            pipe.xadd(key, fields, maxlen=self.settings.max_entries, approximate=True)
            if terminal:
                ttl = self.settings.terminal_grace_s
        pipe.pexpire(key, int(ttl * 1000))
        await pipe.execute()

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
        key: dict[Any, Any] = {self._key(turn_id): after}
        deadline = time.monotonic() + wait_s
        for _ in range(int(wait_s / _MAX_BLOCK_S) + 2):  # bounded; usually one round
            remaining = deadline - time.monotonic()
            block = max(1, int(min(remaining, _MAX_BLOCK_S) * 1000)) if remaining > 0 else None
            # redis-py types replies as loose unions; with decode_responses=False: bytes.
            reply: Any = await self.client.xread(key, count=limit, block=block)
            if reply or block is None or remaining <= _MAX_BLOCK_S:
                break
        entries: list[BufferEntry] = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
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

    async def release(self, turn_id: TurnId) -> None:
        """Shorten the stream's expiry to the grace period (no driver publishes now)."""
        await self.client.pexpire(self._key(turn_id), int(self.settings.terminal_grace_s * 1000))

    async def ping(self) -> None:
        """Raise if Redis cannot be reached."""
        await self.client.ping()

    async def drop(self, turn_id: TurnId) -> None:
        """DEL the turn's stream."""
        await self.client.delete(self._key(turn_id))

    async def close(self) -> None:
        """Close the client if this buffer created it."""
        if self._owns:
            self._owns = False
            await self.client.aclose()


def _id(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
