"""The ReplayBuffer port: the hot tail of an active turn, for live readers on any process.

The Store is the source of truth; the buffer only carries what was published after it,
so a reader can follow a turn live. Entries are published strictly after their commit
(write before send). Positions are the buffer's own ordering tokens (Redis entry ids stay
inside the adapter); clients only ever see `seq`. Adapters: `InMemoryReplayBuffer`
(embedded default, one process) and `RedisReplayBuffer` (any number of processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from turnkit.errors import ConfigurationError
from turnkit.ids import TurnId

if TYPE_CHECKING:
    from turnkit.replay.memory import InMemoryReplayBuffer
    from turnkit.replay.redis import RedisReplayBuffer

__all__ = (
    "BufferEntry",
    "EntriesLostError",
    "InMemoryReplayBuffer",
    "RedisReplayBuffer",
    "ReplayBuffer",
    "ReplaySettings",
    "replay_from_url",
)

START = "0"
"""The position before the first entry of any turn."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferEntry:
    """One published event: its buffer position, `seq` (None: ephemeral) and wire bytes."""

    position: str
    seq: int | None
    data: bytes
    is_terminal: bool


class EntriesLostError(Exception):
    """A publish found the turn's earlier entries gone, and added nothing.

    The buffer restarted empty, or the entries expired: readers following the turn may
    have missed some of them.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySettings:
    """Bounds of a buffer.

    Attributes:
        max_entries: Entries kept per turn (older ones are trimmed; readers then read the
            gap from the Store).
        ttl_s: Expiry of a turn's entries, refreshed on every publish while it runs.
        terminal_grace_s: How long a finished turn's entries stay for readers that are
            mid-follow, before the turn is dropped; a paused turn's entries (and those of
            any turn no driver publishes for) stay this long too.
    """

    max_entries: int = 10_000
    ttl_s: float = 3600.0
    terminal_grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_entries < 1:
            raise ConfigurationError(f"max_entries is at least 1, not {self.max_entries}")
        if not self.ttl_s > 0:
            raise ConfigurationError(f"ttl_s is a number of seconds above 0, not {self.ttl_s}")
        if not self.terminal_grace_s >= 0:
            raise ConfigurationError(
                f"terminal_grace_s is a number of seconds, 0 or more, not {self.terminal_grace_s}"
            )


class ReplayBuffer(Protocol):
    """A bounded, expiring, per-turn log of published events.

    Contract: `publish` appends in the order given and refreshes the turn's expiry; a
    terminal entry, or `release`, starts the grace period after which the turn is
    dropped. `read` returns entries strictly after `after`, waiting up to `wait_s` for
    the first one; a turn dropped and published to again continues with positions after
    its old ones. Safe for concurrent use; one publisher per turn.
    """

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        """Append `(seq, data, is_terminal)` entries."""
        ...

    async def tail(self, turn_id: TurnId) -> str:
        """The position of the newest entry (`"0"` when there is none)."""
        ...

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        """Entries after `after` (at most `limit`), waiting up to `wait_s` for one."""
        ...

    async def release(self, turn_id: TurnId) -> None:
        """No driver publishes for the turn now (it paused, or its attempt ended).

        Its entries stay for the grace period only: readers of a paused turn read the
        Store, and a resumed turn publishes anew.
        """
        ...

    async def ping(self) -> None:
        """Raise if the buffer cannot be reached now (checked when a runtime opens)."""
        ...

    async def drop(self, turn_id: TurnId) -> None:
        """Forget a turn now."""
        ...

    async def close(self) -> None:
        """Release connections the buffer owns."""
        ...


def replay_from_url(url: str | None) -> ReplayBuffer:
    """The Redis buffer for a `redis://` URL, else the in-memory one (the embedded default)."""
    if url:
        from turnkit.replay.redis import RedisReplayBuffer

        return RedisReplayBuffer.from_url(url)
    from turnkit.replay.memory import InMemoryReplayBuffer

    return InMemoryReplayBuffer()


def __getattr__(name: str) -> Any:
    if name == "InMemoryReplayBuffer":
        from turnkit.replay.memory import InMemoryReplayBuffer

        return InMemoryReplayBuffer
    if name == "RedisReplayBuffer":
        from turnkit.replay.redis import RedisReplayBuffer

        return RedisReplayBuffer
    raise AttributeError(name)
