"""The run-queue side of `SqlStore`: submit, claim, renew, sweep.

Each function runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
Claims are optimistic: pick a candidate (PostgreSQL: `FOR UPDATE SKIP LOCKED`), then a
conditional UPDATE that only one contender can win; the epoch moves on with every claim.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, and_, bindparam, case, exists, or_, select, update
from sqlalchemy.orm import aliased

from turnkit.errors import (
    LeaseLostError,
    RequestConflictError,
    SessionNotFoundError,
    StaleEpochError,
)
from turnkit.events import DoneEvent, ErrorEvent, TurnStartedEvent, encode_event
from turnkit.ids import SessionId, TurnId, uuid7
from turnkit.store import Delivery, Lease, NewInput, Submission
from turnkit.store._schema import (
    UNFINISHED,
    attachments_json,
    aware,
    events,
    inputs,
    sessions,
    turn_record,
    turns,
)

_INSERT_INPUT = inputs.insert()
_INSERT_TURN = turns.insert()
_INSERT_EVENT = events.insert()
_BY_REQUEST = select(
    inputs.c.seq, inputs.c.turn_id, inputs.c.delivery, inputs.c.requested_delivery, inputs.c.content
).where(
    inputs.c.session_id == bindparam("q_session"), inputs.c.request_id == bindparam("q_request")
)
TURN_BY_ID = select(turns).where(turns.c.turn_id == bindparam("t_id"))
_GUIDED = (
    select(inputs.c.seq, inputs.c.content, inputs.c.request_id)
    .where(
        inputs.c.turn_id == bindparam("g_turn"),
        inputs.c.delivery == "guide",
        inputs.c.seq > bindparam("g_after"),
    )
    .order_by(inputs.c.seq)
)

__all__ = (
    "TURN_BY_ID",
    "Orphan",
    "guided_inputs",
    "requeue_guides",
    "cancel",
    "claim",
    "orphan",
    "renew",
    "submit",
    "sweep",
    "sweepable",
)


@dataclass(frozen=True, slots=True)
class Orphan:
    """A running turn the sweep may end, as it was when found."""

    turn_id: str
    session_id: str
    lease_epoch: int
    last_seq: int


def submit(conn: Connection, insert: Any, new: NewInput, now: datetime) -> Submission:
    """Commit the input, its queued turn and the turn's first event, or return the first try."""
    if new.request_id is not None:
        found = conn.execute(
            _BY_REQUEST, {"q_session": new.session_id, "q_request": new.request_id}
        ).first()
        if found is not None:
            if found.content != new.content:
                raise RequestConflictError(
                    f"request_id {new.request_id!r} was already used in session "
                    f"{new.session_id!r} for a different message; use a new request_id for "
                    "a new message (a retry must send the same content)",
                    request_id=new.request_id,
                    session_id=new.session_id,
                )
            return Submission(
                session_id=new.session_id,
                turn_id=TurnId(found.turn_id),
                input_seq=found.seq,
                delivery=cast(Delivery, found.delivery),
                requested_delivery=cast(Delivery, found.requested_delivery),
                is_new=False,
                guided=found.delivery == "guide",
            )
    if not new.create_session:
        exists_ = conn.execute(
            select(sessions.c.session_id).where(sessions.c.session_id == new.session_id)
        ).first()
        if exists_ is None:
            raise SessionNotFoundError(
                f"no session {new.session_id!r}: create it first", session_id=new.session_id
            )
    conn.execute(
        _ensure_session(insert),
        {"s_id": new.session_id, "s_principal": new.principal, "s_now": now},
    )
    seq = conn.execute(_next_input_seq(), {"s_id": new.session_id, "s_now": now}).scalar_one()
    if new.delivery == "guide":
        live = _live_turn(conn, new.session_id, now)
        if live is not None:
            conn.execute(
                inputs.insert().values(
                    session_id=new.session_id,
                    seq=seq,
                    request_id=new.request_id,
                    content=new.content,
                    requested_delivery="guide",
                    delivery="guide",
                    turn_id=live,
                    created_at=now,
                )
            )
            return Submission(
                session_id=new.session_id,
                turn_id=TurnId(live),
                input_seq=seq,
                delivery="guide",
                requested_delivery="guide",
                is_new=True,
                guided=True,
            )
    # No live attempt to guide: the message opens its own turn, and the log says so.
    _, started = _open_turn(conn, new, seq, now, requested=new.delivery)
    lease, record = None, None
    if new.claim_for is not None:
        lease = claim(
            conn,
            owner=new.claim_for.owner,
            ttl_s=new.claim_for.ttl_s,
            max_attempts=new.claim_for.max_attempts,
            turn_id=new.turn_id,
            now=now,
            skip_locked=False,
        )
        if lease is not None:
            row = conn.execute(TURN_BY_ID, {"t_id": new.turn_id}).one()
            record = turn_record(row)
    return Submission(
        session_id=new.session_id,
        turn_id=new.turn_id,
        input_seq=seq,
        delivery="queue",
        requested_delivery=new.delivery,
        is_new=True,
        lease=lease,
        record=record,
        started=started,
    )


@functools.cache
def _ensure_session(insert: Any) -> Any:
    return (
        insert(sessions)
        .values(
            session_id=bindparam("s_id"),
            principal=bindparam("s_principal"),
            last_input_seq=0,
            created_at=bindparam("s_now"),
            updated_at=bindparam("s_now"),
        )
        .on_conflict_do_nothing(index_elements=["session_id"])
    )


@functools.cache
def _next_input_seq() -> Any:
    return (
        update(sessions)
        .where(sessions.c.session_id == bindparam("s_id"))
        .values(last_input_seq=sessions.c.last_input_seq + 1, updated_at=bindparam("s_now"))
        .returning(sessions.c.last_input_seq)
    )


def _live_turn(conn: Connection, session_id: str, now: datetime) -> str | None:
    """The session's turn a driver holds right now (its row locked on PostgreSQL)."""
    query = (
        select(turns.c.turn_id)
        .where(
            turns.c.session_id == session_id,
            turns.c.status == "running",
            turns.c.lease_owner.is_not(None),
            turns.c.lease_expires_at > now,
        )
        .order_by(turns.c.input_seq)
        .limit(1)
    )
    if conn.dialect.name == "postgresql":
        # Serialise with the driver's settle, which re-queues unread guides (seed 001 ⑦).
        query = query.with_for_update(of=turns)
    return conn.execute(query).scalar_one_or_none()


def _open_turn(
    conn: Connection,
    new: NewInput,
    seq: int,
    now: datetime,
    *,
    requested: Delivery,
    turn_id: TurnId | None = None,
    content: str | None = None,
    request_id: str | None = None,
    input_exists: bool = False,
) -> tuple[TurnId, TurnStartedEvent]:
    """Insert a queued turn for input `seq` (and the input row), with its `turn.started`."""
    turn_id = turn_id or new.turn_id
    content = new.content if content is None else content
    request_id = new.request_id if request_id is None else request_id
    delivery: Delivery = "queue"
    if not input_exists:
        conn.execute(
            _INSERT_INPUT,
            {
                "session_id": new.session_id,
                "seq": seq,
                "request_id": request_id,
                "content": content,
                "requested_delivery": requested,
                "delivery": delivery,
                "turn_id": turn_id,
                "created_at": now,
            },
        )
    conn.execute(
        _INSERT_TURN,
        {
            "turn_id": turn_id,
            "session_id": new.session_id,
            "input_seq": seq,
            "status": "running",
            "content": content,
            "request_id": request_id,
            "agent": new.agent,
            "model": new.model,
            "organisation": new.organisation,
            "department": new.department,
            "principal": new.principal,
            "last_seq": 1,
            "lease_epoch": 0,
            "lease_owner": None,
            "lease_expires_at": None,
            "attempts": 0,
            "cancel_requested": False,
            "pinned": json.dumps(new.pinned, sort_keys=True),
            "summary": None,
            "attachments": attachments_json(new.attachments),
            "started_at": None,
            "error_code": None,
            "created_at": now,
            "updated_at": now,
        },
    )
    started = TurnStartedEvent(
        session_id=new.session_id,
        turn_id=turn_id,
        stage_id="runtime",
        ts=now,
        seq=1,
        content=content,
        request_id=request_id,
        agent=new.agent,
        model=new.model,
        effort=new.effort,
        input_seq=seq,
        delivery=delivery,
        requested_delivery=requested,
        attachments=new.attachments,
    )
    conn.execute(
        _INSERT_EVENT,
        {"turn_id": turn_id, "seq": 1, "type": started.type, "data": encode_event(started)},
    )
    return turn_id, started


def guided_inputs(
    conn: Connection, turn_id: TurnId, after_input_seq: int
) -> list[tuple[int, str, str | None]]:
    """Guide messages attached to a turn, after an input seq."""
    rows = conn.execute(_GUIDED, {"g_turn": turn_id, "g_after": after_input_seq}).all()
    return [(r.seq, r.content, r.request_id) for r in rows]


def requeue_guides(conn: Connection, turn_id: TurnId, consumed_through: int, now: datetime) -> int:
    """Give every guide message the ended turn never presented a queued turn of its own."""
    unread = guided_inputs(conn, turn_id, consumed_through)
    if not unread:
        return 0
    ended = conn.execute(
        select(
            turns.c.session_id, turns.c.agent, turns.c.model, turns.c.pinned,
            turns.c.organisation, turns.c.department, turns.c.principal,
        ).where(turns.c.turn_id == turn_id)
    ).one()  # fmt: skip
    pinned = json.loads(ended.pinned) if ended.pinned else {}
    template = NewInput(
        session_id=SessionId(ended.session_id),
        turn_id=turn_id,
        content="",
        request_id=None,
        delivery="queue",
        agent=ended.agent,
        model=ended.model,
        effort=pinned.get("effort", "off"),
        pinned=pinned,
        organisation=ended.organisation,
        department=ended.department,
        principal=ended.principal,
    )
    for seq, content, request_id in unread:
        new_id = TurnId(f"turn_{uuid7()}")
        _open_turn(
            conn, template, seq, now, requested="guide", turn_id=new_id, content=content,
            request_id=request_id, input_exists=True,
        )  # fmt: skip
        conn.execute(
            update(inputs)
            .where(inputs.c.session_id == ended.session_id, inputs.c.seq == seq)
            .values(turn_id=new_id, delivery="queue")
        )
    return len(unread)


PROGRESS_TYPES: tuple[str, ...] = (
    "message.complete",
    "tool.completed",
    "tool.failed",
    "approval.requested",
    "clarification.requested",
    "compaction.completed",
)
"""Events that mean an attempt got somewhere (a model answered, a tool finished, it paused)."""


def _spent_after_claim() -> Any:
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
        _spent_after_claim().label("spent"),
    ).where(
        turns.c.status == "running",
        or_(turns.c.lease_owner.is_(None), turns.c.lease_expires_at < bindparam("c_now")),
        _spent_after_claim() < bindparam("c_max"),
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


def renew(conn: Connection, lease: Lease, *, ttl_s: float, now: datetime) -> Lease:
    """Extend the lease or raise `StaleEpochError`."""
    expires = now + timedelta(seconds=ttl_s)
    flag = conn.execute(
        _RENEW,
        {"r_turn": lease.turn_id, "r_epoch": lease.epoch, "r_owner": lease.owner, "r_exp": expires},
    ).scalar_one_or_none()
    if flag is None:
        raise _lost_or_stale(conn, lease)
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
        cancel_requested=bool(flag),
    )


def _lost_or_stale(conn: Connection, lease: Lease) -> StaleEpochError | LeaseLostError:
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


def sweepable(
    conn: Connection, *, now: datetime, ceiling_s: float, max_attempts: int
) -> list[Orphan]:
    """Running turns nobody can finish: past the ceiling, or out of attempts and unleased."""
    deadline = now - timedelta(seconds=ceiling_s)
    rows = conn.execute(
        select(turns.c.turn_id, turns.c.session_id, turns.c.lease_epoch, turns.c.last_seq).where(
            turns.c.status == "running",
            or_(
                and_(turns.c.started_at.is_not(None), turns.c.started_at < deadline),
                and_(
                    _spent_after_claim() >= max_attempts,
                    or_(turns.c.lease_owner.is_(None), turns.c.lease_expires_at < now),
                ),
            ),
        )
    ).all()
    return [Orphan(r.turn_id, r.session_id, r.lease_epoch, r.last_seq) for r in rows]


def orphan(conn: Connection, turn_id: TurnId) -> Orphan | None:
    """The turn as the sweep needs it, if it is running."""
    r = conn.execute(
        select(turns.c.turn_id, turns.c.session_id, turns.c.lease_epoch, turns.c.last_seq).where(
            turns.c.turn_id == turn_id, turns.c.status == "running"
        )
    ).first()
    return Orphan(r.turn_id, r.session_id, r.lease_epoch, r.last_seq) if r is not None else None


def sweep(conn: Connection, row: Orphan, now: datetime, reason: str) -> bool:
    """Time one orphaned turn out: bump its epoch, append `error` + `done`. False if it moved."""
    seq = row.last_seq + 1
    won = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == row.turn_id,
            turns.c.lease_epoch == row.lease_epoch,
            turns.c.last_seq == row.last_seq,
            turns.c.status == "running",
        )
        .values(
            status="timed_out",
            error_code="deadline-exceeded",
            lease_epoch=row.lease_epoch + 1,
            lease_owner=None,
            last_seq=seq + 1,
            updated_at=now,
        )
    )
    if won.rowcount != 1:
        return False
    common: dict[str, Any] = {
        "session_id": row.session_id,
        "turn_id": row.turn_id,
        "stage_id": "runtime",
        "ts": now,
    }
    error = ErrorEvent(seq=seq, code="deadline-exceeded", message=reason, **common)
    done = DoneEvent(seq=seq + 1, status="timed_out", error_code="deadline-exceeded", **common)
    conn.execute(
        events.insert(),
        [
            {"turn_id": row.turn_id, "seq": e.seq, "type": e.type, "data": encode_event(e)}
            for e in (error, done)
        ],
    )
    return True


def cancel(conn: Connection, turn_id: TurnId, now: datetime) -> str | None:
    """Cancel here if no live driver holds the turn, else flag it. None: no such turn."""
    row = conn.execute(
        select(
            turns.c.session_id,
            turns.c.status,
            turns.c.lease_owner,
            turns.c.lease_expires_at,
            turns.c.lease_epoch,
            turns.c.last_seq,
        ).where(turns.c.turn_id == turn_id)
    ).first()
    if row is None:
        return None
    if row.status not in UNFINISHED:
        return str(row.status)
    expires = aware(row.lease_expires_at)
    live = row.status == "running" and row.lease_owner is not None and expires is not None
    if live and expires is not None and expires > now:
        conn.execute(update(turns).where(turns.c.turn_id == turn_id).values(cancel_requested=True))
        return "running"
    seq = row.last_seq + 1
    won = conn.execute(
        update(turns)
        .where(
            turns.c.turn_id == turn_id,
            turns.c.lease_epoch == row.lease_epoch,
            turns.c.last_seq == row.last_seq,
            turns.c.status == row.status,
        )
        .values(
            status="cancelled",
            error_code=None,
            lease_epoch=row.lease_epoch + 1,
            lease_owner=None,
            last_seq=seq,
            updated_at=now,
        )
    )
    if won.rowcount != 1:
        return cancel(conn, turn_id, now)  # it moved under us: look again
    done = DoneEvent(
        session_id=row.session_id,
        turn_id=turn_id,
        stage_id="runtime",
        ts=now,
        seq=seq,
        status="cancelled",
    )
    conn.execute(
        events.insert().values(turn_id=turn_id, seq=seq, type=done.type, data=encode_event(done))
    )
    return "cancelled"
