"""The pause side of `SqlStore`: save a request, answer it, hand the answer to the run."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, cast

from pydantic import JsonValue
from sqlalchemy import Connection, func, select, tuple_, update

from turnkit.audit import (
    DECISIONS,
    AuditPayloads,
    AuditRow,
    CallIdentity,
    PauseAnswerPayload,
)
from turnkit.errors import PauseAnsweredError, PauseNotFoundError
from turnkit.ids import TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import awaiting
from turnkit.store import TurnRecord
from turnkit.store._schema import (
    audit,
    audit_values,
    pauses,
    sessions,
    turn_record,
    turns,
)

__all__ = (
    "answer",
    "budget_pauses",
    "close_open_pauses",
    "get_pause",
    "open_pause",
    "open_pauses",
    "pending_answer",
)


def open_pause(
    conn: Connection,
    insert: Any,
    turn_id: TurnId,
    session_id: str,
    pause: PauseRequest,
    now: datetime,
) -> None:
    """Save the request a turn now waits on (a retried pause changes nothing)."""
    conn.execute(
        _open_pause(insert),
        {
            "request_id": pause.request_id,
            "turn_id": turn_id,
            "session_id": session_id,
            "kind": pause.kind,
            "payload": json.dumps({"tool_call_id": pause.tool_call_id, **pause.payload}),
            "status": "open",
            "created_at": now,
        },
    )


@functools.cache
def _open_pause(insert: Any) -> Any:
    # Built once: with the values inline, each pause would compile a statement of its own
    # and leave it, payload included, in the connection's statement cache.
    return insert(pauses).on_conflict_do_nothing(index_elements=["request_id"])


def answer(
    conn: Connection,
    turn_id: TurnId,
    request_id: str,
    value: dict[str, JsonValue],
    now: datetime,
    by: str | None = None,
) -> PauseRequest:
    """Answer an open request of this turn and move the turn back to `running`.

    Its `pauseAnswer` audit row (who, when, how) is written in the same transaction.
    """
    row = conn.execute(
        select(pauses).where(pauses.c.request_id == request_id, pauses.c.turn_id == turn_id)
    ).first()
    if row is None:
        raise PauseNotFoundError(
            f"turn {turn_id!r} has no request {request_id!r}",
            turn_id=turn_id,
            request_id=request_id,
        )
    if row.status != "open":
        raise PauseAnsweredError(
            f"request {request_id!r} is {row.status} already; nothing was changed",
            request_id=request_id,
            status=row.status,
        )
    moved = conn.execute(
        update(turns)
        .where(turns.c.turn_id == turn_id, turns.c.status == awaiting(row.kind))
        .values(
            status="running",
            # A resumed run is a new run: fresh attempts and a fresh ceiling.
            attempts=0,
            spent_attempts=0,  # the attempts that died before the pause were another run's
            started_at=None,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=now,
        )
    )
    if moved.rowcount != 1:
        raise PauseAnsweredError(
            f"turn {turn_id!r} is not waiting on {request_id!r} any more; nothing was changed",
            request_id=request_id,
        )
    conn.execute(
        update(pauses)
        .where(pauses.c.request_id == request_id, pauses.c.status == "open")
        .values(
            status="answered",
            answer=json.dumps(value),
            answered_at=now,
        )
    )
    _audit_answer(conn, row, value, now, by)
    return _request(request_id, row.kind, row.payload)


def _audit_answer(
    conn: Connection, row: Any, value: dict[str, JsonValue], now: datetime, by: str | None
) -> None:
    """Append the answer's `pauseAnswer` row after the turn's rows (no driver holds it)."""
    last = conn.execute(
        select(func.max(audit.c.seq_within_turn)).where(audit.c.turn_id == row.turn_id)
    ).scalar_one()
    entry = AuditRow(
        identity=CallIdentity(
            session_id=row.session_id,
            turn_id=row.turn_id,
            stage_id="runtime",
            seq_within_turn=(last or 0) + 1,
        ),
        call=None,
        payloads=AuditPayloads(
            pauseAnswer=PauseAnswerPayload(
                request_id=row.request_id,
                pause=row.kind,
                decision=next((d for d in DECISIONS if d == value.get("kind")), None),
                by=by,
                at=now,
                arguments_changed=value.get("arguments") is not None,
            )
        ),
    )
    conn.execute(audit.insert().values(**audit_values(entry)))


def close_open_pauses(
    conn: Connection, turn_id: TurnId, *, stopped_at: datetime | None = None, by: str | None = None
) -> None:
    """Close the turn's unanswered requests: it ended without their answers.

    `stopped_at`: a Stop ended it; each request gets its `pauseAnswer` row (decision
    `stopped`, by `by`), so the audit says who ended the wait.
    """
    if stopped_at is not None:
        unanswered = select(pauses).where(pauses.c.turn_id == turn_id, pauses.c.status == "open")
        for row in conn.execute(unanswered).all():
            _audit_answer(conn, row, {"kind": "stopped"}, stopped_at, by)
    conn.execute(
        update(pauses)
        .where(pauses.c.turn_id == turn_id, pauses.c.status == "open")
        .values(status="closed")
    )


def get_pause(conn: Connection, turn_id: TurnId, request_id: str) -> PauseRequest | None:
    """The turn's request `request_id`, as `open_pause` saved it."""
    row = conn.execute(
        select(pauses.c.kind, pauses.c.payload).where(
            pauses.c.request_id == request_id, pauses.c.turn_id == turn_id
        )
    ).first()
    return _request(request_id, row.kind, row.payload) if row is not None else None


def pending_answer(conn: Connection, turn_id: TurnId) -> dict[str, JsonValue] | None:
    """The newest answered request's answer."""
    row = conn.execute(
        select(pauses.c.answer)
        .where(pauses.c.turn_id == turn_id, pauses.c.status == "answered")
        .order_by(pauses.c.answered_at.desc())
        .limit(1)
    ).first()
    return cast(dict[str, JsonValue], json.loads(row.answer)) if row is not None else None


def budget_pauses(
    conn: Connection, organisation: str | None
) -> list[tuple[TurnRecord, PauseRequest]]:
    """Turns paused `awaiting_budget` (of one organisation when given), with their requests."""
    return _paused(conn, ("budget",), organisation=organisation)


def open_pauses(
    conn: Connection,
    session_id: str | None,
    organisation: str | None,
    limit: int,
    after: tuple[datetime, str] | None,
    asked: bool,
) -> list[tuple[TurnRecord, PauseRequest]]:
    """Paused turns (of one session, one organisation when given), with their requests.

    `asked=False` leaves out those of sessions with a parent (agents asked as tools).
    """
    kinds = ("approval", "clarification", "budget")
    return _paused(
        conn,
        kinds,
        organisation=organisation,
        session_id=session_id,
        limit=limit,
        after=after,
        asked=asked,
    )


def _paused(
    conn: Connection,
    kinds: tuple[str, ...],
    *,
    organisation: str | None = None,
    session_id: str | None = None,
    limit: int | None = None,
    after: tuple[datetime, str] | None = None,
    asked: bool = True,
) -> list[tuple[TurnRecord, PauseRequest]]:
    query = (
        select(
            turns,
            pauses.c.request_id.label("pause_request_id"),  # the turn has a request_id too
            pauses.c.kind.label("pause_kind"),
            pauses.c.payload.label("pause_payload"),
        )
        .join(pauses, pauses.c.turn_id == turns.c.turn_id)
        .where(
            turns.c.status.in_([awaiting(kind) for kind in kinds]),
            pauses.c.kind.in_(kinds),
            pauses.c.status == "open",
        )
        .order_by(turns.c.created_at, turns.c.turn_id, pauses.c.request_id)
        .limit(limit)
    )
    if after is not None:  # keyset: a page is not shifted by turns answered meanwhile
        query = query.where(tuple_(turns.c.created_at, turns.c.turn_id) > tuple_(*after))
    if organisation is not None:
        query = query.where(turns.c.organisation == organisation)
    if session_id is not None:
        query = query.where(turns.c.session_id == session_id)
    if not asked:
        children = select(sessions.c.session_id).where(sessions.c.parent_session.is_not(None))
        query = query.where(turns.c.session_id.not_in(children))
    return [
        (turn_record(row), _request(row.pause_request_id, row.pause_kind, row.pause_payload))
        for row in conn.execute(query)
    ]


def _request(request_id: str, kind: str, payload_json: str) -> PauseRequest:
    """A saved request as `open_pause` wrote it (the tool call id kept in the payload)."""
    payload = json.loads(payload_json)
    payload.pop("spent_when_answered", None)  # a note earlier versions kept beside it
    return PauseRequest(
        request_id=request_id,
        kind=cast(Any, kind),
        tool_call_id=str(payload.pop("tool_call_id", "")),
        payload=payload,
    )
