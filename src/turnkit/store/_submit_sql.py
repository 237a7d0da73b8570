"""How an input becomes work: a queued turn of its own, or a guide for the live one.

`submit` commits the input, its queued turn and `turn.started` together (and may claim it
at once); `requeue_guides` gives guides an ended turn never read queued turns of their own.
Each function runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    Boolean,
    Connection,
    and_,
    bindparam,
    case,
    exists,
    func,
    null,
    or_,
    select,
    update,
)

from turnkit.errors import AskingTurnEndedError, RequestConflictError, SessionNotFoundError
from turnkit.events import TurnStartedEvent, encode_event
from turnkit.ids import SessionId, TurnId, new_turn_id
from turnkit.store import (
    ClaimRequest,
    Delivery,
    Lease,
    NewInput,
    Submission,
    TurnRecord,
    _sessions_sql as sessions_sql,
)
from turnkit.store._schema import (
    UNFINISHED,
    attachments_json,
    events,
    inputs,
    sessions,
    turn_record,
    turns,
)

_INSERT_INPUT = inputs.insert()
_INSERT_TURN = turns.insert()
_INSERT_EVENT = events.insert()
_BY_REQUEST = (
    select(
        inputs.c.seq,
        inputs.c.turn_id,
        inputs.c.delivery,
        inputs.c.requested_delivery,
        inputs.c.content,
        turns.c.turn_id.label("opened"),
        turns.c.attachments,
    )
    .select_from(
        inputs.outerjoin(  # the turn the message opened (a guide joins another's: none)
            turns, and_(turns.c.turn_id == inputs.c.turn_id, turns.c.input_seq == inputs.c.seq)
        )
    )
    .where(
        inputs.c.session_id == bindparam("q_session"),
        inputs.c.request_id == bindparam("q_request"),
    )
)
_NOTE_GUIDE = (
    update(turns)
    .where(turns.c.turn_id == bindparam("n_turn"))
    .values(
        newest_guide_seq=case(
            (turns.c.newest_guide_seq < bindparam("n_seq"), bindparam("n_seq")),
            else_=turns.c.newest_guide_seq,
        )
    )
)
_GUIDED = (
    select(inputs.c.seq, inputs.c.content, inputs.c.request_id)
    .where(
        inputs.c.turn_id == bindparam("g_turn"),
        inputs.c.delivery == "guide",
        inputs.c.seq > bindparam("g_after"),
    )
    .order_by(inputs.c.seq)
)
_HOLD_ASKING = (
    update(turns)
    .where(
        turns.c.turn_id == bindparam("h_turn"),
        turns.c.status.in_(UNFINISHED),
        turns.c.cancel_requested.is_(False),  # no Stop pending (flagged for its driver)
    )
    .values(updated_at=turns.c.updated_at)  # unchanged: the row is written, not edited
)
_STOP_PENDING = select(turns.c.turn_id).where(
    turns.c.turn_id == bindparam("h_turn"),
    turns.c.status.in_(UNFINISHED),
    turns.c.cancel_requested.is_(True),
)

__all__ = (
    "claim_of",
    "drop_refused_session",
    "guided_inputs",
    "hold_asking",
    "opened",
    "requeue_guides",
    "started_event",
    "submit",
)


def submit(conn: Connection, insert: Any, new: NewInput, now: datetime) -> Submission:
    """Commit the input, its queued turn and the turn's first event, or return the first try.

    Raises:
        AskingTurnEndedError: `new.asked_by` names a turn that has ended (see `hold_asking`).
    """
    if new.asked_by is not None:
        hold_asking(conn, new.asked_by)
    if new.request_id is not None:
        found = conn.execute(
            _BY_REQUEST, {"q_session": new.session_id, "q_request": new.request_id}
        ).first()
        if found is not None and not _owner_may_post(conn, new):
            raise SessionNotFoundError(f"no session {new.session_id!r}", session_id=new.session_id)
        if found is not None:
            pictures = found.opened is not None and found.attachments != attachments_json(
                new.attachments
            )
            if found.content != new.content or pictures:
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
    seq = conn.execute(
        _next_input_seq(insert),
        {
            "s_id": new.session_id,
            "s_principal": new.principal,
            "s_organisation": new.organisation if new.principal is not None else None,
            "s_now": now,
            "s_title": new.title,
            "s_app": not new.anonymous_caller,
        },
    ).scalar_one_or_none()
    if seq is None:  # another principal's session: as if there were none
        raise SessionNotFoundError(f"no session {new.session_id!r}", session_id=new.session_id)
    if new.delivery == "guide":
        live = _live_turn(conn, new, now)
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
            # On the row too: an ending that waited for this row sees the guide (0010).
            conn.execute(_NOTE_GUIDE, {"n_turn": live, "n_seq": seq})
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
    _, started, row = _open_turn(conn, new, seq, now, requested=new.delivery, claim=claim_of(new))
    return opened(new, seq, started, row)


def hold_asking(conn: Connection, asking: TurnId) -> None:
    """Hold the row of the turn that asks, until this transaction ends; refuse an ended one.

    A turn with a Stop pending counts as ended: a Stop from another process flags it
    (`cancel_requested`) for its live driver, which learns of it only at its next lease
    renewal and may ask an agent meanwhile; nobody would read that agent's answer either.

    An asked turn is inserted only while its asking turn is unfinished, so the ending of
    that turn, which stops the turns it asked (`_cancel_sql.stop_asked`), sees it. The row
    is written (with what it holds), not only locked: an ending waits for this
    transaction and then looks for asked turns afresh, and PostgreSQL's one-statement
    ending, which looked in a snapshot taken before, finds the row moved and leaves the
    ending to the full transaction (`_commit_pg.END`). On SQLite the writer lock
    serialises the two.

    Raises:
        AskingTurnEndedError: the asking turn ended (or is gone), or a Stop of it is
            pending (`stop_pending`): nothing is written.
    """
    if conn.execute(_HOLD_ASKING, {"h_turn": asking}).rowcount == 1:
        return
    if conn.execute(_STOP_PENDING, {"h_turn": asking}).first() is not None:
        raise AskingTurnEndedError(
            f"the turn {asking!r} that asks this agent as a tool was stopped (its Stop "
            "has not reached its driver yet): nobody reads the answer, so "
            "the agent is not asked (nothing was written)",
            turn_id=asking,
            stop_pending=True,
        )
    raise AskingTurnEndedError(
        f"the turn {asking!r} that asks this agent as a tool has ended: nobody reads "
        "the answer any more, so the agent is not asked (nothing was written)",
        turn_id=asking,
        stop_pending=False,
    )


def drop_refused_session(conn: Connection, session_id: SessionId, asking: TurnId) -> bool:
    """Delete the empty session an ask `hold_asking` refused had opened (False: none).

    Only a session the asking turn's session opened for an agent it asks (`parent_session`)
    that never took a message: a refusal of that turn's asks is final (it stays ended, its
    Stop stays pending), so no later ask of the same call would write into it.
    """
    asking_session = select(turns.c.session_id).where(turns.c.turn_id == asking)
    found = conn.execute(
        select(sessions.c.session_id)
        .where(
            sessions.c.session_id == session_id,
            sessions.c.parent_session == asking_session.scalar_subquery(),
            sessions.c.last_input_seq == 0,
        )
        .with_for_update(of=sessions)
    ).first()
    return found is not None and sessions_sql.remove_many(conn, [session_id]) == 1


def claim_of(new: NewInput) -> ClaimRequest | None:
    """The claim the message's turn is inserted with (none when it has no attempts)."""
    return new.claim_for if new.claim_for and new.claim_for.max_attempts > 0 else None


def opened(new: NewInput, seq: int, started: TurnStartedEvent, row: Any) -> Submission:
    """The submission of message `seq`, which opened its turn; `row` is the turn, if claimed."""
    lease, record = None, None
    if row is not None and row.lease_owner is not None:
        record = turn_record(row)
        lease = _first_lease(record)
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


def started_event(
    new: NewInput,
    seq: int,
    now: datetime,
    *,
    turn_id: TurnId | None = None,
    content: str | None = None,
    request_id: str | None = None,
    requested: Delivery | None = None,
) -> TurnStartedEvent:
    """The `turn.started` of the turn input `seq` opens (by default: `new`'s own)."""
    return TurnStartedEvent(
        session_id=new.session_id,
        turn_id=turn_id or new.turn_id,
        stage_id="runtime",
        ts=now,
        seq=1,
        content=new.content if content is None else content,
        request_id=new.request_id if request_id is None else request_id,
        agent=new.agent,
        model=new.model,
        effort=new.effort,
        input_seq=seq,
        delivery="queue",
        requested_delivery=requested or new.delivery,
        attachments=new.attachments,
    )


@functools.cache
def _next_input_seq(insert: Any) -> Any:
    """The session's next input seq, creating the session with its first message.

    The first message also names a session nobody has named yet (`NewInput.title`).
    """
    new = insert(sessions).values(
        session_id=bindparam("s_id"),
        principal=bindparam("s_principal"),
        organisation=bindparam("s_organisation"),
        title=bindparam("s_title"),
        last_input_seq=1,
        created_at=bindparam("s_now"),
        updated_at=bindparam("s_now"),
    )
    unnamed_and_first = and_(sessions.c.last_input_seq == 0, sessions.c.title.is_(None))
    return new.on_conflict_do_update(
        index_elements=["session_id"],
        set_={
            "last_input_seq": sessions.c.last_input_seq + 1,
            "title": case((unnamed_and_first, new.excluded.title), else_=sessions.c.title),
            "organisation": owner_organisation(new.excluded),
            "updated_at": new.excluded.updated_at,
        },
        where=owner_may_post(new.excluded, app=bindparam("s_app", type_=Boolean)),
    ).returning(sessions.c.last_input_seq)


def _owner_may_post(conn: Connection, new: NewInput) -> bool:
    """Whether `new`'s principal may post into its session (no principal: the app may)."""
    found = sessions_sql.get(conn, new.session_id)
    if found is None or (new.principal is None and not new.anonymous_caller):
        return True
    return found.visible_to(new.principal, new.organisation)


def owner_organisation(sent: Any) -> Any:
    """The session's organisation after a message from `sent.principal` (see `_submit_pg`).

    An owned session older than the column takes its owner's on the owner's next message.
    """
    return case(
        (
            sessions.c.principal.is_not(None),
            func.coalesce(sessions.c.organisation, sent.organisation),
        ),
        else_=sessions.c.organisation,
    )


def owner_may_post(sent: Any, *, app: Any) -> Any:
    """Whether a message from `sent.principal` may go into the session (see `_submit_pg`).

    Into one it owns (in its organisation) or nobody owns; a message with no principal
    into any when `app` holds (the app's own code, not a caller nobody signed in).
    """
    return or_(
        and_(sent.principal.is_(None), app),
        sessions.c.principal.is_(None),
        and_(
            sessions.c.principal == sent.principal,
            or_(
                sessions.c.organisation.is_(None),
                sessions.c.organisation == sent.organisation,
            ),
        ),
    )


def _live_turn(conn: Connection, new: NewInput, now: datetime) -> str | None:
    """The session's turn a driver holds right now (its row locked on PostgreSQL).

    Only one `new`'s sender may guide: a turn runs as its sender (tools, roles, budgets),
    so a guide joins only a turn sent by the same principal of the same organisation (a
    caller nobody signed in: a turn nobody sent). The app's own message joins any.
    """
    query = (
        select(turns.c.turn_id)
        .where(
            turns.c.session_id == new.session_id,
            turns.c.status == "running",
            turns.c.lease_owner.is_not(None),
            turns.c.lease_expires_at > now,
        )
        .order_by(turns.c.input_seq)
        .limit(1)
    )
    if new.principal is not None:
        query = query.where(
            turns.c.principal == new.principal, turns.c.organisation == new.organisation
        )
    elif new.anonymous_caller:
        query = query.where(turns.c.principal.is_(None))
    if conn.dialect.name == "postgresql":
        # Serialise with the driver's settle, which re-queues guides the turn never read.
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
    claim: ClaimRequest | None = None,
) -> tuple[TurnId, TurnStartedEvent, Any]:
    """Insert a queued turn for input `seq` (and the input row), with its `turn.started`.

    With `claim`, the turn is inserted already claimed unless an earlier turn of its
    session is unfinished (the rule every claim follows), and its row comes back.
    """
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
    values = _turn_values(new, turn_id, seq, content, request_id, now)
    row = None
    if claim is None:
        conn.execute(_INSERT_TURN, values)
    else:
        row = conn.execute(_insert_claimed(tuple(values)), _claimed(values, claim, now)).one()
    started = started_event(
        new, seq, now, turn_id=turn_id, content=content, request_id=request_id,
        requested=requested,
    )  # fmt: skip
    conn.execute(
        _INSERT_EVENT,
        {"turn_id": turn_id, "seq": 1, "type": started.type, "data": encode_event(started)},
    )
    return turn_id, started, row


def _turn_values(
    new: NewInput, turn_id: TurnId, seq: int, content: str, request_id: str | None, now: datetime
) -> dict[str, Any]:
    """A queued turn's row; the lease columns keep their defaults (nobody holds it yet)."""
    return {
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
        "asked_by": new.asked_by,
        "last_seq": 1,
        "cancel_requested": False,
        "pinned": json.dumps(new.pinned, sort_keys=True),
        "summary": None,
        "attachments": attachments_json(new.attachments),
        "error_code": None,
        "created_at": now,
        "updated_at": now,
    }


def _claimed(values: dict[str, Any], claim: ClaimRequest, now: datetime) -> dict[str, Any]:
    """`_insert_claimed`'s parameters: the row, and what its lease columns are decided from."""
    return values | {
        "c_owner": claim.owner,
        "c_expires": now + timedelta(seconds=claim.ttl_s),
        "c_now": now,
        "c_session": values["session_id"],
        "c_input_seq": values["input_seq"],
    }


@functools.cache
def _insert_claimed(plain: tuple[str, ...]) -> Any:
    """Insert a turn with its first lease taken, unless its session has an earlier turn.

    `INSERT … SELECT` from one `EXISTS`, so the session's earlier turns are looked at once;
    `plain` names the columns that arrive as they are (the rest the statement decides).
    """
    c = turns.c
    blocked = exists().where(
        c.session_id == bindparam("c_session"),
        c.input_seq < bindparam("c_input_seq"),
        c.status.in_(UNFINISHED),
    )
    claim = select(blocked.label("blocked")).subquery("claim")

    def unless_blocked(claimed: Any, queued: Any) -> Any:
        return case((claim.c.blocked, queued), else_=claimed)

    decided = {
        "lease_owner": unless_blocked(bindparam("c_owner", type_=c.lease_owner.type), null()),
        "lease_epoch": unless_blocked(1, 0),
        "lease_expires_at": unless_blocked(
            bindparam("c_expires", type_=c.lease_expires_at.type), null()
        ),
        "attempts": unless_blocked(1, 0),
        "claim_seq": unless_blocked(1, 0),
        "started_at": unless_blocked(bindparam("c_now", type_=c.started_at.type), null()),
    }
    row = [bindparam(name, type_=c[name].type) for name in plain] + list(decided.values())
    return (
        turns.insert()
        .from_select([*plain, *decided], select(*row).select_from(claim))
        .returning(*turns.c)
    )


def _first_lease(record: TurnRecord) -> Lease:
    """The lease a turn inserted already claimed holds (see `_insert_claimed`)."""
    assert record.lease_owner is not None
    assert record.lease_expires_at is not None
    assert record.started_at is not None
    return Lease(
        turn_id=record.turn_id,
        session_id=record.session_id,
        owner=record.lease_owner,
        epoch=record.lease_epoch,
        expires_at=record.lease_expires_at,
        attempt=record.attempts,
        took_over=False,
        last_seq=record.last_seq,
        started_at=record.started_at,
    )


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
    pinned.pop("repinned_from", None)  # pinned so from the start: it was not re-pinned
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
        new_id = new_turn_id()
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
