"""The Store port: where turns, durable events, audit rows and usage live.

The Store is the source of truth. Durable events are committed here before anyone sees
them; `(turn_id, seq)` is unique, so re-appending an event changes nothing. Audit rows
are written in the same transaction as the usage rollup, with no foreign key into the
chat tables. Adapters: `SqlStore` (SQLite embedded default; PostgreSQL in production).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from turnkit.audit import AuditRow, UsageDelta
from turnkit.events import DurableEvent, StreamEvent, decode_event
from turnkit.ids import SessionId, TurnId
from turnkit.states import TurnStatus

if TYPE_CHECKING:
    from turnkit.store.sql import SqlStore

__all__ = (
    "NewTurn",
    "SqlStore",
    "Store",
    "StoredEvent",
    "TurnRecord",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTurn:
    """A turn about to be written: the user's message and who answers it."""

    turn_id: TurnId
    session_id: SessionId
    content: str
    request_id: str | None
    agent: str
    model: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """A turn as the Store holds it."""

    turn_id: TurnId
    session_id: SessionId
    status: TurnStatus
    content: str
    request_id: str | None
    agent: str
    model: str
    error_code: str | None
    last_seq: int
    lease_epoch: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """A committed durable event: its position and the exact bytes clients receive."""

    turn_id: TurnId
    seq: int
    type: str
    data: bytes

    def decode(self) -> StreamEvent:
        """The typed event."""
        return decode_event(self.data)


class Store(Protocol):
    """Durable turn storage.

    Contract: `commit` is one transaction; it returns only after the data is durable,
    rejects a stale `epoch` with `StaleEpochError` and an illegal status move with
    `StoreError`, and treats an already-stored `(turn_id, seq)` as done (no error, no
    second row). `read_events` yields committed events in `seq` order, in bounded pages.
    Implementations are safe for concurrent use by many tasks.
    """

    async def start_turn(self, turn: NewTurn) -> tuple[TurnRecord, bool]:
        """Write the session (if new) and the turn as `running`.

        Returns the record and whether it is new: a `request_id` already used in the
        session returns the existing turn and `False`, writing nothing.
        """
        ...

    async def commit(
        self,
        turn_id: TurnId,
        *,
        epoch: int,
        events: Sequence[DurableEvent] = (),
        audit: Sequence[AuditRow] = (),
        status: TurnStatus | None = None,
        error_code: str | None = None,
    ) -> None:
        """Append events, audit rows (+ usage rollup) and an optional status move, atomically."""
        ...

    def read_events(
        self, turn_id: TurnId, *, after_seq: int = 0, page_size: int = 500
    ) -> AsyncIterator[StoredEvent]:
        """Committed events with `seq > after_seq`, in order."""
        ...

    async def get_turn(self, turn_id: TurnId) -> TurnRecord | None:
        """One turn, or None."""
        ...

    async def list_turns(self, session_id: SessionId) -> list[TurnRecord]:
        """A session's turns, oldest first."""
        ...

    async def read_audit(self, turn_id: TurnId) -> list[AuditRow]:
        """A turn's audit rows in `seq_within_turn` order."""
        ...

    async def read_usage(self, turn_id: TurnId) -> UsageDelta:
        """The turn's usage rollup."""
        ...

    async def close(self) -> None:
        """Release what the store owns (an engine it created); idempotent."""
        ...


def __getattr__(name: str) -> Any:
    if name == "SqlStore":
        from turnkit.store.sql import SqlStore

        return SqlStore
    raise AttributeError(name)
