"""Leases on turns: claim the next runnable turn, renew a lease, tell stale from lost.

Each function runs inside one transaction on a sync `Connection` (see `SqlStore._tx`),
except the `*_pg` ones: single statements on an asyncpg connection. A claim picks a
candidate, then takes it with a conditional UPDATE that only one contender can win (on
PostgreSQL, in one statement that locks the candidate with `FOR UPDATE SKIP LOCKED`); the
epoch moves on with every claim.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, exists, func, or_, select, text, update
from sqlalchemy.orm import aliased

from turnkit.errors import LeaseLostError, StaleEpochError
from turnkit.ids import SessionId, TurnId
from turnkit.store import Lease, TurnRecord
from turnkit.store._schema import (
    UNFINISHED,
    UNFINISHED_SQL,
    Fields,
    aware,
    events,
    turn_record,
    turns,
)

__all__ = (
    "PROGRESS_TYPES",
    "HANDED_OVER",
    "claim",
    "claim_pg",
    "hand_over",
    "Refusal",
    "repin",
    "Renewal",
    "renew_many",
    "renew_many_pg",
    "spent_after_claim",
)


HANDED_OVER = "(handed over)"
"""The `lease_owner` of a turn whose driver left it to the next claim (`hand_over`)."""


PROGRESS_TYPES: tuple[str, ...] = (
    "message.complete",
    "tool.completed",
    "tool.failed",
    "approval.requested",
    "clarification.requested",
    "compaction.completed",
)
"""Events that mean an attempt got somewhere (a model answered, a tool finished, it paused)."""


def spent_after_claim() -> Any:
    """`spent_attempts` once the previous attempt is judged: one more if it made no progress.

    An attempt that committed progress since its claim does not count against
    `max_attempts`, so restarts during a long turn never end it; a pause is progress. Nor
    does one its worker handed over as it shut down: a deploy is not the turn's failing.
    Nor does one made while an agent the turn asked as a tool had not ended: the asking
    turn's call waits, and commits nothing, while that agent's turn works in its own (and
    its own attempts, judged the same way, bound a crash loop).
    """
    progressed = exists().where(
        events.c.turn_id == turns.c.turn_id,
        events.c.seq > turns.c.claim_seq,
        events.c.type.in_(PROGRESS_TYPES),
    )
    asked = aliased(turns)
    asking = exists().where(asked.c.asked_by == turns.c.turn_id, asked.c.status.in_(UNFINISHED))
    left = func.coalesce(turns.c.lease_owner, "") == HANDED_OVER
    fruitless = and_(turns.c.attempts > 0, ~progressed, ~left, ~asking)
    return turns.c.spent_attempts + case((fruitless, 1), else_=0)


@functools.cache
def _claim_query(*, by_turn: bool, by_session: bool) -> Any:
    """The candidate query, built once per shape (values arrive as bind parameters)."""
    earlier = aliased(turns)
    query = select(
        turns.c.turn_id,
        turns.c.lease_epoch,
        turns.c.lease_owner,
        turns.c.attempts,
        spent_after_claim().label("spent"),
    ).where(
        turns.c.status == "running",
        or_(
            turns.c.lease_owner.is_(None),
            turns.c.lease_owner == HANDED_OVER,  # free now, whatever the clocks say
            turns.c.lease_expires_at < bindparam("c_now"),
        ),
        spent_after_claim() < bindparam("c_max"),
        ~exists().where(
            earlier.c.session_id == turns.c.session_id,
            earlier.c.input_seq < turns.c.input_seq,
            earlier.c.status.in_(UNFINISHED),
        ),
    )
    if by_turn:
        query = query.where(turns.c.turn_id == bindparam("c_turn"))
    if by_session:
        query = query.where(turns.c.session_id == bindparam("c_session"))
    return query.order_by(turns.c.created_at, turns.c.input_seq).limit(1)


@functools.cache
def _claim_update(*, first: bool) -> Any:
    """Take the lease if the epoch is still the one read (one winner per epoch)."""
    return (
        update(turns)
        .where(
            turns.c.turn_id == bindparam("c_turn"),
            turns.c.lease_epoch == bindparam("c_epoch"),
            turns.c.status == "running",
        )
        .values(
            lease_owner=bindparam("c_owner"),
            lease_epoch=bindparam("c_new_epoch"),
            lease_expires_at=bindparam("c_expires"),
            attempts=bindparam("c_attempts"),
            spent_attempts=bindparam("c_spent"),
            claim_seq=turns.c.last_seq,
            started_at=bindparam("c_now") if first else turns.c.started_at,
            updated_at=bindparam("c_now"),
        )
        .returning(
            turns.c.session_id, turns.c.last_seq, turns.c.started_at, turns.c.cancel_requested
        )
    )


def claim(
    conn: Connection,
    *,
    owner: str,
    ttl_s: float,
    max_attempts: int,
    turn_id: TurnId | None,
    session_id: SessionId | None,
    clock: Callable[[], datetime],
) -> Lease | None:
    """Claim one runnable turn for `owner`, or None (SQLite: the write lock is held)."""
    now = clock()
    query = _claim_query(by_turn=turn_id is not None, by_session=session_id is not None)
    params: dict[str, Any] = {"c_now": now, "c_max": max_attempts}
    if turn_id is not None:
        params["c_turn"] = turn_id
    if session_id is not None:
        params["c_session"] = session_id
    row = conn.execute(query, params).first()
    if row is None:
        return None
    expires = now + timedelta(seconds=ttl_s)
    won = conn.execute(
        _claim_update(first=not row.attempts),
        {
            "c_turn": row.turn_id,
            "c_epoch": row.lease_epoch,
            "c_owner": owner,
            "c_new_epoch": row.lease_epoch + 1,
            "c_expires": expires,
            "c_attempts": row.attempts + 1,
            "c_spent": row.spent,
            "c_now": now,
        },
    ).first()
    if won is None:
        return None  # another claimant moved the epoch first
    return _taken(row, won, owner, expires)


def _taken(
    candidate: Any, won: Any, owner: str, expires: datetime, record: TurnRecord | None = None
) -> Lease:
    """The lease a claim took: `candidate` as it was read, `won` as the update left it."""
    started = aware(won.started_at)
    assert started is not None  # set by this claim, if not by an earlier one
    return Lease(
        turn_id=TurnId(candidate.turn_id),
        session_id=SessionId(won.session_id),
        owner=owner,
        epoch=candidate.lease_epoch + 1,
        expires_at=expires,
        attempt=candidate.attempts + 1,
        took_over=candidate.lease_owner is not None,
        handed_over=candidate.lease_owner == HANDED_OVER,
        last_seq=won.last_seq,
        started_at=started,
        cancel_requested=bool(won.cancel_requested),
        record=record,
    )


@functools.cache
def _claim_pg_sql(*, by_turn: bool, by_session: bool) -> str:
    """`claim` as one statement for asyncpg: the candidate locked and taken at once.

    The same rules as `_claim_query` and `_claim_update`: `$1` now, `$2` max_attempts,
    `$3` owner, `$4` the expiry, then `$5` the turn or session asked for, if any.
    """
    progress = ", ".join(f"'{t}'" for t in PROGRESS_TYPES)
    only = ""
    if by_turn:
        only += " AND t.turn_id = $5"
    if by_session:
        only += f" AND t.session_id = ${5 + by_turn}"
    return f"""
WITH candidate AS (
    SELECT t.turn_id, t.lease_epoch, t.lease_owner, t.attempts, judged.spent
    FROM tk_turns t
    CROSS JOIN LATERAL (
        SELECT t.spent_attempts + CASE WHEN t.attempts > 0
            AND COALESCE(t.lease_owner, '') <> '{HANDED_OVER}' AND NOT EXISTS (
            SELECT FROM tk_events e
            WHERE e.turn_id = t.turn_id AND e.seq > t.claim_seq AND e.type IN ({progress})
        ) AND NOT EXISTS (
            SELECT FROM tk_turns a WHERE a.asked_by = t.turn_id AND a.status IN ({UNFINISHED_SQL})
        ) THEN 1 ELSE 0 END AS spent
    ) judged
    WHERE t.status = 'running'
        AND (t.lease_owner IS NULL OR t.lease_owner = '{HANDED_OVER}' OR t.lease_expires_at < $1)
        AND judged.spent < $2
        AND NOT EXISTS (
            SELECT FROM tk_turns earlier
            WHERE earlier.session_id = t.session_id AND earlier.input_seq < t.input_seq
                AND earlier.status IN ({UNFINISHED_SQL})
        ){only}
    ORDER BY t.created_at, t.input_seq
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE tk_turns AS u SET
    lease_owner = $3, lease_epoch = c.lease_epoch + 1, lease_expires_at = $4,
    attempts = c.attempts + 1, spent_attempts = c.spent, claim_seq = u.last_seq,
    started_at = CASE WHEN c.attempts = 0 THEN $1 ELSE u.started_at END, updated_at = $1
FROM candidate c
WHERE u.turn_id = c.turn_id AND u.lease_epoch = c.lease_epoch AND u.status = 'running'
RETURNING u.*, c.lease_epoch AS was_epoch, c.attempts AS was_attempts,
    c.lease_owner AS was_owner
"""


async def claim_pg(
    conn: Any,
    *,
    owner: str,
    ttl_s: float,
    max_attempts: int,
    turn_id: TurnId | None,
    session_id: SessionId | None,
    clock: Callable[[], datetime],
) -> Lease | None:
    """`claim` on an asyncpg connection, as one statement (no BEGIN, no COMMIT)."""
    sql = _claim_pg_sql(by_turn=turn_id is not None, by_session=session_id is not None)
    now = clock()  # read once the connection is ours: a wait for it shortens no lease
    expires = now + timedelta(seconds=ttl_s)
    only = [x for x in (turn_id, session_id) if x is not None]
    row = await conn.fetchrow(sql, now, max_attempts, owner, expires, *only)
    if row is None:
        return None
    # The updated row, whole (the driver's record), and the candidate's columns as it was.
    won = Fields(row)
    was = _Was(row["turn_id"], row["was_epoch"], row["was_attempts"], row["was_owner"])
    return _taken(was, won, owner, expires, record=turn_record(won))


@dataclasses.dataclass(frozen=True, slots=True)
class _Was:
    """The claimed turn's row as the claim found it (what `_taken` reads of a candidate)."""

    turn_id: str
    lease_epoch: int
    attempts: int
    lease_owner: str | None


def hand_over(conn: Connection, lease: Lease, now: datetime) -> bool:
    """End `lease` now and mark the turn handed over; False when the lease was gone.

    The next claim takes the turn at once and knows its driver left it (a worker that
    shut down) rather than died: its `Lease.handed_over`.
    """
    result = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == lease.turn_id,
            turns.c.lease_epoch == lease.epoch,
            turns.c.lease_owner == lease.owner,
            turns.c.status == "running",
        )
        .values(lease_owner=HANDED_OVER, lease_expires_at=now)
    )
    if result.rowcount != 1:
        return False
    if conn.dialect.name == "postgresql":  # listening workers hear it now, not at their poll
        conn.execute(text("SELECT pg_notify('turnkit_work', current_schema())"))
    return True


def repin(conn: Connection, lease: Lease, pinned: str, model: str, now: datetime) -> None:
    """Pin the leased turn anew (`pinned` as JSON), only while it holds what submit wrote.

    Fenced on the lease, and on the turn's log holding nothing past `turn.started`.

    Raises:
        StaleEpochError: the lease is gone, or the turn got further meanwhile.
    """
    result = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == lease.turn_id,
            turns.c.lease_epoch == lease.epoch,
            turns.c.lease_owner == lease.owner,
            turns.c.status == "running",
            turns.c.last_seq <= 1,
        )
        .values(pinned=pinned, model=model, updated_at=now)
    )
    if result.rowcount != 1:
        raise _stale(lease)


def _stale(lease: Lease) -> StaleEpochError:
    return StaleEpochError(
        f"the lease {lease.token} on turn {lease.turn_id!r} is gone: another driver or the "
        "sweep owns the turn now; this driver must stop",
        turn_id=lease.turn_id,
        epoch=lease.epoch,
    )


_RENEW = (
    update(turns)
    .where(
        turns.c.turn_id == bindparam("r_turn"),
        turns.c.lease_epoch == bindparam("r_epoch"),
        turns.c.lease_owner == bindparam("r_owner"),
        turns.c.status.in_(UNFINISHED),
    )
    .values(lease_expires_at=bindparam("r_exp"))
    .returning(turns.c.cancel_requested)
)


Renewal = tuple[Lease, float]
"""A lease to renew and its ttl in seconds."""
Refusal = StaleEpochError | LeaseLostError
"""Why a lease could not be renewed."""


def renew_many(
    conn: Connection, asked: Sequence[Renewal], clock: Callable[[], datetime]
) -> dict[Renewal, Lease | Refusal]:
    """Extend each lease; a lease that is gone gets the error saying why (not raised).

    The expiry counts from `clock()` read inside the transaction, not from when asked.
    """
    now = clock()
    done: dict[Renewal, Lease | Refusal] = {}
    for lease, ttl_s in asked:
        expires = now + timedelta(seconds=ttl_s)
        flag = conn.execute(
            _RENEW,
            {
                "r_turn": lease.turn_id,
                "r_epoch": lease.epoch,
                "r_owner": lease.owner,
                "r_exp": expires,
            },
        ).scalar_one_or_none()
        done[(lease, ttl_s)] = (
            lost_or_stale(conn, lease)
            if flag is None
            else renewed(lease, expires, cancel_requested=bool(flag))
        )
    return done


_RENEW_PG = f"""
UPDATE tk_turns AS t SET lease_expires_at = r.expires
FROM unnest($1::varchar[], $2::integer[], $3::varchar[], $4::timestamptz[])
    AS r(turn_id, epoch, owner, expires)
WHERE t.turn_id = r.turn_id AND t.lease_epoch = r.epoch AND t.lease_owner = r.owner
    AND t.status IN ({UNFINISHED_SQL})
RETURNING t.turn_id, t.lease_epoch, t.lease_owner, t.cancel_requested
"""
_WHY_PG = "SELECT turn_id, lease_epoch, status FROM tk_turns WHERE turn_id = ANY($1::varchar[])"


async def renew_many_pg(
    conn: Any, asked: Sequence[Renewal], clock: Callable[[], datetime]
) -> dict[Renewal, Lease | Refusal]:
    """`renew_many` on an asyncpg connection, as one statement.

    A second one reads, only when some lease is gone, why it could not be renewed. The
    same lease asked twice (with two ttls) is extended once, to the later expiry.
    """
    now = clock()
    expiry: dict[tuple[str, int, str], datetime] = {}
    for lease, ttl_s in asked:
        key = _key(lease)
        expiry[key] = max(expiry.get(key, now), now + timedelta(seconds=ttl_s))
    keys = list(expiry)
    rows = await conn.fetch(
        _RENEW_PG,
        [turn_id for turn_id, _, _ in keys],
        [epoch for _, epoch, _ in keys],
        [owner for _, _, owner in keys],
        [expiry[key] for key in keys],
    )
    flags = {(r["turn_id"], r["lease_epoch"], r["lease_owner"]): r[3] for r in rows}
    gone = [lease.turn_id for lease, _ in asked if _key(lease) not in flags]
    now_held = {r["turn_id"]: r for r in await conn.fetch(_WHY_PG, gone)} if gone else {}
    done: dict[Renewal, Lease | Refusal] = {}
    for lease, ttl_s in asked:
        flag = flags.get(_key(lease))
        if flag is None:
            row = now_held.get(lease.turn_id)
            done[(lease, ttl_s)] = refusal(
                lease, None if row is None else (row["lease_epoch"], row["status"])
            )
        else:
            done[(lease, ttl_s)] = renewed(lease, expiry[_key(lease)], cancel_requested=bool(flag))
    return done


def _key(lease: Lease) -> tuple[str, int, str]:
    return (lease.turn_id, lease.epoch, lease.owner)


def renewed(lease: Lease, expires: datetime, *, cancel_requested: bool) -> Lease:
    """`lease`, extended to `expires` (the record its claim read is not carried on)."""
    return dataclasses.replace(
        lease, expires_at=expires, cancel_requested=cancel_requested, record=None
    )


def lost_or_stale(conn: Connection, lease: Lease) -> Refusal:
    """Why a renewal failed: another epoch (stale), or the turn ended under this lease."""
    row = conn.execute(
        select(turns.c.lease_epoch, turns.c.status).where(turns.c.turn_id == lease.turn_id)
    ).first()
    return refusal(lease, None if row is None else (row.lease_epoch, row.status))


def refusal(lease: Lease, now_held: tuple[int, str] | None) -> Refusal:
    """The error for a lease that could not be renewed, from the turn's epoch and status."""
    if now_held is None or now_held[0] != lease.epoch:
        return _stale(lease)
    return LeaseLostError(
        f"turn {lease.turn_id!r} is {now_held[1]} now: the lease {lease.token} ended with it "
        "(cancelled, timed out or settled elsewhere); this driver must stop",
        turn_id=lease.turn_id,
        status=now_held[1],
    )
