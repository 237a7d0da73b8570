"""Leases on turns: claim the next runnable turn, renew a lease, tell stale from lost.

Each function runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
Claims are optimistic: pick a candidate (PostgreSQL: `FOR UPDATE SKIP LOCKED`), then a
conditional UPDATE that only one contender can win; the epoch moves on with every claim.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, exists, or_, select, update
from sqlalchemy.orm import aliased

from turnkit.errors import LeaseLostError, StaleEpochError
from turnkit.ids import SessionId, TurnId
from turnkit.store import Lease
from turnkit.store._schema import UNFINISHED, aware, events, turns

__all__ = (
    "PROGRESS_TYPES",
    "claim",
    "lost_or_stale",
    "Renewal",
    "renew_many",
    "renew_many_pg",
    "renewed",
    "spent_after_claim",
)


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
    `max_attempts`, so restarts during a long turn never end it; a pause is progress.
    """
    progressed = exists().where(
        events.c.turn_id == turns.c.turn_id,
        events.c.seq > turns.c.claim_seq,
        events.c.type.in_(PROGRESS_TYPES),
    )
    fruitless = and_(turns.c.attempts > 0, ~progressed)
    return turns.c.spent_attempts + case((fruitless, 1), else_=0)


@functools.cache
def _claim_query(*, by_turn: bool, by_session: bool, skip_locked: bool) -> Any:
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
        or_(turns.c.lease_owner.is_(None), turns.c.lease_expires_at < bindparam("c_now")),
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
    query = query.order_by(turns.c.created_at, turns.c.input_seq).limit(1)
    if skip_locked:
        query = query.with_for_update(skip_locked=True, of=turns)
    return query


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
        .returning(turns.c.session_id, turns.c.last_seq, turns.c.started_at)
    )


def claim(
    conn: Connection,
    *,
    owner: str,
    ttl_s: float,
    max_attempts: int,
    turn_id: TurnId | None,
    now: datetime,
    skip_locked: bool,
    session_id: SessionId | None = None,
) -> Lease | None:
    """Claim one runnable turn for `owner`, or None."""
    query = _claim_query(
        by_turn=turn_id is not None, by_session=session_id is not None, skip_locked=skip_locked
    )
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
    started = aware(won.started_at)
    assert started is not None
    return Lease(
        turn_id=TurnId(row.turn_id),
        session_id=SessionId(won.session_id),
        owner=owner,
        epoch=row.lease_epoch + 1,
        expires_at=expires,
        attempt=row.attempts + 1,
        took_over=row.lease_owner is not None,
        last_seq=won.last_seq,
        started_at=started,
    )


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


def renew_many(
    conn: Connection, asked: Sequence[Renewal], now: datetime
) -> dict[Renewal, Lease | StaleEpochError | LeaseLostError]:
    """Extend each lease; a lease that is gone gets the error saying why (not raised)."""
    done: dict[Renewal, Lease | StaleEpochError | LeaseLostError] = {}
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
    AND t.status IN ({", ".join(f"'{s}'" for s in UNFINISHED)})
RETURNING t.turn_id, t.lease_epoch, t.lease_owner, t.cancel_requested
"""


async def renew_many_pg(
    conn: Any, asked: Sequence[Renewal], now: datetime
) -> dict[Renewal, Lease | None]:
    """`renew_many`'s updates as one statement on an asyncpg connection.

    A lease that is gone maps to None (the caller asks why). Rows are updated in turn id
    order, so two batches never wait on each other's rows in a cycle.
    """
    ordered = sorted(asked, key=lambda item: item[0].turn_id)
    expiry = [now + timedelta(seconds=ttl_s) for _, ttl_s in ordered]
    rows = await conn.fetch(
        _RENEW_PG,
        [lease.turn_id for lease, _ in ordered],
        [lease.epoch for lease, _ in ordered],
        [lease.owner for lease, _ in ordered],
        expiry,
    )
    flags = {
        (r["turn_id"], r["lease_epoch"], r["lease_owner"]): r["cancel_requested"] for r in rows
    }
    done: dict[Renewal, Lease | None] = {}
    for (lease, ttl_s), expires in zip(ordered, expiry, strict=True):
        flag = flags.get((lease.turn_id, lease.epoch, lease.owner))
        done[(lease, ttl_s)] = (
            None if flag is None else renewed(lease, expires, cancel_requested=bool(flag))
        )
    return done


def renewed(lease: Lease, expires: datetime, *, cancel_requested: bool) -> Lease:
    """`lease`, extended to `expires`."""
    return Lease(
        turn_id=lease.turn_id,
        session_id=lease.session_id,
        owner=lease.owner,
        epoch=lease.epoch,
        expires_at=expires,
        attempt=lease.attempt,
        took_over=lease.took_over,
        last_seq=lease.last_seq,
        started_at=lease.started_at,
        cancel_requested=cancel_requested,
    )


def lost_or_stale(conn: Connection, lease: Lease) -> StaleEpochError | LeaseLostError:
    """Why a renewal failed: another epoch (stale), or the turn ended under this lease."""
    row = conn.execute(
        select(turns.c.lease_epoch, turns.c.status).where(turns.c.turn_id == lease.turn_id)
    ).first()
    if row is None or row.lease_epoch != lease.epoch:
        return _stale(lease)
    return LeaseLostError(
        f"turn {lease.turn_id!r} is {row.status} now: the lease {lease.token} ended with it "
        "(cancelled, timed out or settled elsewhere); this driver must stop",
        turn_id=lease.turn_id,
        status=row.status,
    )
