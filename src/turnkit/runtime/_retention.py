"""A runtime's retention: deleting the sessions nobody has used for a while.

Each session goes the way `delete_session` deletes one: its turns' graph checkpoints
first, then its rows (audit and usage rows stay). Sessions go in bounded batches, oldest
first: a batch is one checkpoint deletion and one Store transaction, so no transaction
holds the database for long and an interrupted run keeps what it finished.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from turnkit.errors import InvalidInputError
from turnkit.ids import SessionId, TurnId
from turnkit.runtime._core import RuntimeCore
from turnkit.store import IdleSession

__all__ = (
    "BATCH_SESSIONS",
    "BATCH_TURNS",
    "RetentionBatch",
    "RetentionReport",
    "RuntimeRetention",
    "check_retention",
    "idle_cutoff",
    "idle_session_batches",
)

log = logging.getLogger("turnkit.runtime")

BATCH_SESSIONS = 100
"""Sessions one batch deletes at most (and one page of the search lists)."""
BATCH_TURNS = 1_000
"""Turns one batch deletes at most, unless a single session has more (it goes alone)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionBatch:
    """One batch of idle sessions: deleted together (or, in a dry run, found together)."""

    sessions: tuple[IdleSession, ...]
    """The sessions, oldest first: deleted, or in a dry run those that would be."""

    @property
    def session_ids(self) -> tuple[SessionId, ...]:
        """The sessions' ids."""
        return tuple(s.session_id for s in self.sessions)

    @property
    def turns(self) -> int:
        """Their turns (with their checkpoints, events and transcripts)."""
        return sum(len(s.turn_ids) for s in self.sessions)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionReport:
    """What `SessionRuntime.delete_idle_sessions` deleted, or with `dry_run` would delete."""

    idle_before: datetime
    """The cutoff: sessions last active before it, with no unfinished turn, were idle."""
    session_ids: tuple[SessionId, ...]
    """The sessions deleted (in a dry run: found), oldest first."""
    turns: int
    """Their turns."""
    batches: int
    """How many batches it took (each one checkpoint deletion and one transaction)."""
    dry_run: bool
    """Nothing was deleted: the report says what would have been."""


class RuntimeRetention(RuntimeCore):
    """`SessionRuntime`'s retention: `delete_idle_sessions`."""

    async def delete_idle_sessions(
        self, idle_for: timedelta, *, limit: int | None = None, dry_run: bool = False
    ) -> RetentionReport:
        """Delete the sessions nobody has used for `idle_for`, oldest first, in batches.

        A session is idle when its last activity (its newest message or rename, and its
        turns' last change: an ending, a Stop) is older than `idle_for` and none of its
        turns is unfinished. A session with a running, queued or **paused** turn is
        never deleted here, however old: a paused turn waits for a person (Stop it, or
        `delete_session` it, to let it go). Each idle session goes as `delete_session`
        deletes one: its turns' checkpoints first, then its inputs, turns, events,
        transcripts and files; audit and usage rows stay (budgets keep counting).

        Args:
            idle_for: How long a session must have been idle; above zero.
            limit: Delete at most this many sessions (None: every idle one).
            dry_run: Delete nothing; report what would be deleted.

        Raises:
            InvalidInputError: `idle_for` is not a positive `timedelta`, or `limit` is
                not a whole number of 1 or more.
        """
        check_retention(idle_for, limit)
        await self._ensure_open()
        idle_before = idle_cutoff(self.clock.now(), idle_for)
        batches = idle_session_batches(self, idle_before=idle_before, limit=limit, dry_run=dry_run)
        found: list[SessionId] = []
        turns = count = 0
        async for batch in batches:
            found += batch.session_ids
            turns += batch.turns
            count += 1
        return RetentionReport(
            idle_before=idle_before,
            session_ids=tuple(found),
            turns=turns,
            batches=count,
            dry_run=dry_run,
        )


def check_retention(idle_for: object, limit: object) -> None:
    """Refuse an `idle_for` that is not a positive `timedelta`, or a `limit` below 1.

    Raises:
        InvalidInputError: either is out of range (nothing is deleted).
    """
    if not isinstance(idle_for, timedelta) or idle_for <= timedelta(0):
        raise InvalidInputError(f"idle_for must be a timedelta above zero, not {idle_for!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"limit must be a whole number of 1 or more, not {limit!r}")


def idle_cutoff(now: datetime, idle_for: timedelta) -> datetime:
    """`now - idle_for`: sessions last active before it are idle.

    Raises:
        InvalidInputError: `idle_for` reaches back past the first year of the calendar.
    """
    try:
        return now - idle_for
    except OverflowError:
        raise InvalidInputError(
            f"idle_for {idle_for} reaches back before the year 1; nothing is that old"
        ) from None


async def idle_session_batches(
    runtime: RuntimeCore, *, idle_before: datetime, limit: int | None, dry_run: bool
) -> AsyncIterator[RetentionBatch]:
    """Delete (or in a dry run, find) the sessions idle since before `idle_before`.

    Yields each batch once it is done. The runtime is open and the arguments checked
    (`check_retention`). The search pages forward through the sessions by their time and
    id, so it ends: each page starts past the last one.
    """
    left = limit
    after: IdleSession | None = None
    while left is None or left > 0:
        asked = BATCH_SESSIONS if left is None else min(BATCH_SESSIONS, left)
        page = await runtime.store.idle_sessions(idle_before=idle_before, limit=asked, after=after)
        for chunk in _chunks(page):
            if dry_run:
                yield RetentionBatch(sessions=tuple(chunk))
            else:
                yield await _delete(runtime, chunk, idle_before)
        if len(page) < asked:
            return
        after = page[-1]
        if left is not None:
            left -= len(page)


def _chunks(page: Sequence[IdleSession]) -> list[list[IdleSession]]:
    """The page in batches of at most `BATCH_TURNS` turns (a larger session goes alone)."""
    chunks: list[list[IdleSession]] = []
    turns = 0
    for session in page:
        if chunks and turns + len(session.turn_ids) <= BATCH_TURNS:
            chunks[-1].append(session)
            turns += len(session.turn_ids)
        else:
            chunks.append([session])
            turns = len(session.turn_ids)
    return chunks


async def _delete(
    runtime: RuntimeCore, chunk: Sequence[IdleSession], idle_before: datetime
) -> RetentionBatch:
    """The checkpoints first: if deleting them fails, the sessions are all still there."""
    turn_ids: list[TurnId] = [t for session in chunk for t in session.turn_ids]
    for start in range(0, len(turn_ids), BATCH_TURNS):
        await runtime.forget_checkpoints(turn_ids[start : start + BATCH_TURNS])
    deleted = set(
        await runtime.store.delete_idle_sessions(
            [s.session_id for s in chunk], idle_before=idle_before
        )
    )
    batch = RetentionBatch(sessions=tuple(s for s in chunk if s.session_id in deleted))
    log.info("deleted %d idle session(s) with %d turn(s)", len(batch.sessions), batch.turns)
    return batch
