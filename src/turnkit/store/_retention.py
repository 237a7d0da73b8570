"""Retention: the Store side of deleting idle sessions (re-exported by `turnkit.store`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from turnkit.ids import SessionId, TurnId

__all__ = ("IdleSession", "Retention")


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleSession:
    """A session retention may delete: no unfinished turn, nothing since a cutoff."""

    session_id: SessionId
    updated_at: datetime
    """The session row's own time: its newest message or rename (the listing's order)."""
    last_active: datetime
    """The later of `updated_at` and its turns' last change (an ending, a Stop)."""
    turn_ids: tuple[TurnId, ...]
    """Its turns, oldest first (each is one checkpoint thread)."""


class Retention(Protocol):
    """Finding and deleting sessions nobody has used for a while."""

    async def idle_sessions(
        self, *, idle_before: datetime, limit: int, after: IdleSession | None = None
    ) -> list[IdleSession]:
        """Sessions idle since before `idle_before`, oldest `updated_at` first, at most `limit`.

        Idle: the session's row and every one of its turns last changed before
        `idle_before`, and no turn is unfinished (running, queued or paused). `after`:
        continue past that session (keyset paging; nothing is skipped or repeated).
        """
        ...

    async def delete_idle_sessions(
        self, session_ids: Sequence[SessionId], *, idle_before: datetime
    ) -> list[SessionId]:
        """Delete those of `session_ids` that are still idle, in one transaction.

        Each goes as `delete_session` deletes one (audit and usage rows stay, usage rows
        keep who spent and when). A session that became active since it was listed (a
        new message) is left as it is. Returns the sessions deleted.
        """
        ...

    async def existing_turns(self, turn_ids: Sequence[TurnId]) -> set[TurnId]:
        """Those of `turn_ids` the Store still holds (a deleted session's turns are gone)."""
        ...
