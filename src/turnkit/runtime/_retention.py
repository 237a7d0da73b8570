"""A runtime's retention: deleting the sessions nobody has used for a while.

Sessions go in bounded batches, oldest first: a batch is one Store transaction, which
checks again that each session is still idle and deletes the rows of those that are
(audit and usage rows stay), then one deletion of those sessions' turns' graph
checkpoints. A session that came back meanwhile (a new message) keeps its rows and its
checkpoints. No transaction holds the database for long, and an interrupted run keeps
what it finished; one interrupted between a batch's rows and its checkpoints leaves
checkpoints of turns that no longer exist, which every later run deletes first
(`forget_orphaned_checkpoints`).
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
    "ORPHAN_PAGE",
    "RetentionBatch",
    "RetentionReport",
    "RuntimeRetention",
    "check_retention",
    "forget_orphaned_checkpoints",
    "idle_cutoff",
    "idle_session_batches",
)

log = logging.getLogger("turnkit.runtime")

BATCH_SESSIONS = 100
"""Sessions one batch deletes at most (and one page of the search lists)."""
BATCH_TURNS = 1_000
"""Turns one batch deletes at most, unless a single session has more (it goes alone)."""
ORPHAN_PAGE = 1_000
"""Checkpoint threads `forget_orphaned_checkpoints` checks at a time."""


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
    """How many batches it took (each one transaction and one checkpoint deletion)."""
    dry_run: bool
    """Nothing was deleted: the report says what would have been."""
    orphaned_turns: int = 0
    """Turns already deleted whose checkpoints this run deleted (an earlier run was
    interrupted between their sessions' rows and their checkpoints); 0 in a dry run."""


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
        `delete_session` it, to let it go). Each idle session goes with its inputs,
        turns, events, transcripts, files and its turns' checkpoints, as `delete_session`
        deletes one; audit and usage rows stay (budgets keep counting). A session that
        gets a message while this runs is kept whole: each batch checks again, in the
        transaction that deletes its rows, and only then deletes the checkpoints of the
        sessions it deleted. A run interrupted between the two leaves those checkpoints
        behind; the next run deletes them first (`orphaned_turns`).

        Args:
            idle_for: How long a session must have been idle; above zero.
            limit: Delete at most this many sessions (None: every idle one).
            dry_run: Delete nothing; report what would be deleted.

        Raises:
            InvalidInputError: `idle_for` is not a positive `timedelta`, or `limit` is
                not a whole number of 1 or more.
        """
        check_retention(idle_for, limit)
        await self.ensure_open()
        idle_before = idle_cutoff(self.clock.now(), idle_for)
        orphaned = 0 if dry_run else await forget_orphaned_checkpoints(self)
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
            orphaned_turns=orphaned,
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
    """The rows of those still idle first, then their turns' checkpoints, and only theirs.

    A session that came back since it was found keeps both. Interrupted between the two,
    the checkpoints stay behind, of turns that no longer exist: the next run deletes them
    (`forget_orphaned_checkpoints`). (The other way round, a session that came back kept
    its rows but lost its checkpoints.) A still idle session has no turn newer than the
    cutoff, so the turns it was found with are all it had.
    """
    deleted = set(
        await runtime.store.delete_idle_sessions(
            [s.session_id for s in chunk], idle_before=idle_before
        )
    )
    batch = RetentionBatch(sessions=tuple(s for s in chunk if s.session_id in deleted))
    turn_ids: list[TurnId] = [t for session in batch.sessions for t in session.turn_ids]
    for start in range(0, len(turn_ids), BATCH_TURNS):
        await runtime.forget_checkpoints(turn_ids[start : start + BATCH_TURNS])
    log.info("deleted %d idle session(s) with %d turn(s)", len(batch.sessions), batch.turns)
    return batch


async def forget_orphaned_checkpoints(runtime: RuntimeCore) -> int:
    """Delete the checkpoints of turns that no longer exist; how many turns' they were.

    A run interrupted after a batch's rows and before its checkpoints leaves them. The
    checkpointer's threads named as turns are checked a page at a time against the
    Store: those whose turn is gone are deleted. (A turn's row is stored before its
    first checkpoint, so a thread whose turn is missing was deleted.) A checkpointer of
    the app's own that cannot list its threads is left as it is: 0. So is a runtime whose
    Store is in another database than its checkpoints: those may be shared with other
    Stores, whose turns this one does not know.
    """
    existing = getattr(runtime.store, "existing_turns", None)
    if not runtime.store_beside_checkpoints or existing is None:
        return 0
    after, forgotten = "", 0
    while True:
        page = await runtime.turn_threads(after=after, limit=ORPHAN_PAGE)
        if not page:
            break
        kept = await existing([TurnId(t) for t in page])
        gone = [t for t in page if t not in kept]
        if gone:
            await runtime.forget_checkpoints(gone)
            forgotten += len(gone)
        if len(page) < ORPHAN_PAGE:
            break
        after = page[-1]
    if forgotten:
        log.info("deleted the checkpoints of %d turn(s) already deleted", forgotten)
    return forgotten
