"""`SqlQueue`: `SqlStore`'s run queue — submitting, claiming, renewing and ending turns.

A base of `SqlStore`: the `RunQueue`, `Watchdog` and `Canceller` methods and the
operator's list of stuck turns, on the statements of `_submit_sql` / `_submit_pg`,
`_lease_sql`, `_sweep_sql`, `_cancel_sql` and `_turns_sql`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from pydantic import JsonValue
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from turnkit.clock import Clock
from turnkit.errors import AskingTurnEndedError, TurnNotFoundError
from turnkit.ids import SessionId, TurnId
from turnkit.states import TurnStatus
from turnkit.store import (
    Lease,
    NewInput,
    Submission,
    TurnRecord,
    _cancel_sql as cancel_sql,
    _lease_sql as lease_sql,
    _submit_pg as submit_pg,
    _submit_sql as submit_sql,
    _sweep_sql as sweep_sql,
    _turns_sql as turns_sql,
)
from turnkit.store._coalesce import Coalescer
from turnkit.store._engine import SqlEngine
from turnkit.store._schema import turn_record

__all__ = ("RENEW_BATCH", "UNIQUE_VIOLATION", "SqlQueue")

log = logging.getLogger("turnkit.store")

UNIQUE_VIOLATION = "23505"
"""PostgreSQL's SQLSTATE for a duplicate key."""
RENEW_BATCH = 256
"""Leases one renewal transaction extends (see `SqlQueue.renew`)."""


class SqlQueue(SqlEngine):
    """Submit, claim, renew (those asked together in one transaction), sweep, cancel, time out."""

    def __init__(self, url: str, *, clock: Clock | None = None, schema: str | None = None) -> None:
        super().__init__(url, clock=clock, schema=schema)
        self._renewals = Coalescer(self._renew_many, most=RENEW_BATCH)

    async def submit(self, new: NewInput) -> Submission:
        """Commit a user message, its queued turn and `turn.started` in one transaction.

        A refused ask (`AskingTurnEndedError`) deletes the empty session it had opened.
        """
        try:
            return await self._submit(new)
        except AskingTurnEndedError:
            assert new.asked_by is not None
            try:
                await self._tx(submit_sql.drop_refused_session, new.session_id, new.asked_by)
            except Exception:  # the refusal is what the caller must hear
                log.warning("could not delete the empty session %s", new.session_id, exc_info=True)
            raise

    async def _submit(self, new: NewInput) -> Submission:
        if self._async_engine is not None and submit_pg.can_submit(new):
            try:
                done = await self._pg_driver(submit_pg.submit, new, self._clock.now())
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != UNIQUE_VIOLATION:
                    raise
                done = None  # a concurrent retry of the same request: the first answers
            if done is not None:
                return done
        now = self._clock.now()
        try:  # a new message waits behind the writes of running turns (group commit)
            return await self._hot_tx(submit_sql.submit, self._insert, new, now, behind=True)
        except IntegrityError:
            # A concurrent submit with the same request_id won the race: it answers.
            if new.request_id is None:
                raise
            return await self._hot_tx(submit_sql.submit, self._insert, new, self._clock.now())

    async def claim(
        self,
        owner: str,
        *,
        ttl_s: float,
        max_attempts: int,
        turn_id: TurnId | None = None,
        session_id: SessionId | None = None,
    ) -> Lease | None:
        """Claim the next runnable turn (or `turn_id`, or one of `session_id`) for `owner`."""
        asked: dict[str, Any] = {
            "owner": owner,
            "ttl_s": ttl_s,
            "max_attempts": max_attempts,
            "turn_id": turn_id,
            "session_id": session_id,
            "clock": self._clock.now,
        }
        if self._async_engine is None:
            return await self._hot_tx(functools.partial(lease_sql.claim, **asked))
        return await self._pg_driver(functools.partial(lease_sql.claim_pg, **asked))

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend the lease or raise `StaleEpochError`; renewals asked together share one."""
        outcome = await self._renewals.get((lease, ttl_s))
        if isinstance(outcome, Exception):
            raise outcome
        assert outcome is not None  # every asked renewal gets an outcome
        return outcome

    async def hand_over(self, lease: Lease) -> bool:
        """End `lease` at once for the next claim, saying its driver left (see `Queue`)."""
        now = self._clock.now()
        return bool(await self._tx(lease_sql.hand_over, lease, now))

    async def repin(self, lease: Lease, *, pinned: dict[str, JsonValue], model: str) -> None:
        """Pin a turn that has not started to another agent version (see `RunQueue`)."""
        text = json.dumps(pinned, sort_keys=True)
        await self._tx(lease_sql.repin, lease, text, model, self._clock.now())

    async def _renew_many(
        self, asked: Sequence[lease_sql.Renewal]
    ) -> dict[lease_sql.Renewal, Lease | lease_sql.Refusal]:
        if self._async_engine is None:
            return await self._hot_tx(lease_sql.renew_many, asked, self._clock.now)
        return await self._pg_driver(lease_sql.renew_many_pg, asked, self._clock.now)

    async def sweep(self, *, ceiling_s: float, max_attempts: int) -> list[TurnId]:
        """Time out orphaned running turns; returns the ones this call ended."""
        now = self._clock.now()
        rows = await self._tx(
            lambda conn: sweep_sql.sweepable(
                conn, now=now, ceiling_s=ceiling_s, max_attempts=max_attempts
            )
        )
        reason = (
            f"the run outlived its ceiling of {ceiling_s:g} s or ran out of attempts "
            "with no live driver; the sweep ended it"
        )
        ended: list[TurnId] = []
        for row in rows:
            if await self._tx(sweep_sql.sweep, row, now, reason):
                ended.append(TurnId(row.turn_id))
        return ended

    async def cancel(
        self, turn_id: TurnId, *, stopped_owner: str | None = None, by: str | None = None
    ) -> TurnStatus:
        """Cancel a turn here, or flag it for its live driver (see `Canceller`)."""
        now = self._clock.now()
        status = await self._tx(cancel_sql.cancel, turn_id, now, stopped_owner, by)
        if status is None:
            raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
        return cast(TurnStatus, status)

    async def asked_turns(self, turn_id: TurnId) -> list[TurnId]:
        """The unfinished turns of the agents `turn_id` asked (see `Canceller`)."""
        return await self._tx(cancel_sql.unfinished_asked, turn_id, write=False)

    async def note_activity(self, turn_id: TurnId) -> None:
        """Stamp a running turn's `updated_at` (see `Watchdog.note_activity`)."""
        await self._tx(turns_sql.note_activity, turn_id, self._clock.now())

    async def time_out(self, turn_id: TurnId, *, reason: str) -> bool:
        """End one running turn as `timed_out` (a reader found its driver gone)."""
        now = self._clock.now()

        def run(conn: Connection) -> bool:
            row = sweep_sql.orphan(conn, turn_id)
            return row is not None and sweep_sql.sweep(conn, row, now, reason)

        return await self._tx(run)

    async def stuck(
        self, *, ceiling_s: float, unclaimed_s: float = 60.0
    ) -> list[tuple[TurnRecord, str]]:
        """Running turns an operator should look at, with why (`turnkit turns --stuck`).

        No live driver (claimed before, lease lapsed), past the ceiling, with attempts
        that died before any progress, or next in its session and claimed by no process
        for `unclaimed_s` (no worker is running, or none hosts its agent).
        """
        now = self._clock.now()
        rows = await self._tx(
            turns_sql.stuck_rows,
            now - timedelta(seconds=ceiling_s),
            now,
            now - timedelta(seconds=unclaimed_s),
            write=False,
        )
        found: list[tuple[TurnRecord, str]] = []
        for row in rows:
            record = turn_record(row)
            reasons = []
            if record.started_at is not None and record.started_at < now - timedelta(
                seconds=ceiling_s
            ):
                reasons.append("past the ceiling")
            if record.attempts and (
                record.lease_expires_at is None or record.lease_expires_at < now
            ):
                reasons.append("no live driver")
            if row.spent_attempts:
                reasons.append(f"{row.spent_attempts} attempt(s) died without progress")
            if not record.attempts and not reasons:
                waited = (now - record.updated_at).total_seconds()
                reasons.append(f"no process claimed it in {waited:.0f} s")
            found.append((record, "; ".join(reasons)))
        return found
