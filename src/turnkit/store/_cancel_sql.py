"""Cancelling a turn: end it here when no live driver holds it, else flag it for the driver.

A turn ended here closes its open pause requests and gives the guide messages it never
presented turns of their own, as a driver's ending does. Any ending of a turn but a
success also stops, in its own transaction, the turns of the agents it asked
(`stop_asked`): nobody is left to read their answers. A turn flagged for its driver flags
the running turns it asked with it (`flag_asked`), so that a process that dies before it
learns of the Stop leaves none for a worker to run on. On PostgreSQL each turn flagged
is also announced (`NOTIFY turnkit_stop`, at commit), so a driver that listens stops at
once rather than at its next renewal.

Runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, select, text, update

from turnkit.audit import AskedTurnPayload, UsageDelta, asked_usage
from turnkit.events import (
    AskedUsage,
    DoneEvent,
    InputGuidedEvent,
    JobCompletedEvent,
    RunFinishedEvent,
    decode_event,
)
from turnkit.ids import TurnId
from turnkit.store import RunSummary
from turnkit.store._budgets_sql import release
from turnkit.store._jobs_sql import cut_jobs
from turnkit.store._pauses_sql import close_open_pauses
from turnkit.store._schema import (
    UNFINISHED,
    aware,
    event_values,
    events,
    pauses,
    turns,
)
from turnkit.store._submit_sql import requeue_guides
from turnkit.store._turns_sql import audit_blobs, read_usage

__all__ = (
    "ASKED_PAYLOAD",
    "cancel",
    "flag_asked",
    "notify_stop",
    "stop_asked",
    "unfinished_asked",
)

ASKED_PAYLOAD: Final = '%"asked":%'
"""A saved request an asked agent may have handed over (`LIKE`, loose on purpose: it holds
whatever way the JSON is spaced, and `stop_asked` reads each match exactly)."""

_DEPTH: Final = 16
"""How deep agents ask agents (as deep as delegated sessions go)."""


def cancel(
    conn: Connection,
    turn_id: TurnId,
    now: datetime,
    stopped_owner: str | None = None,
    by: str | None = None,
    depth: int = 0,
) -> str | None:
    """Cancel here if no live driver holds the turn, else flag it. None: no such turn.

    `stopped_owner`: a lease that owner holds counts as lapsed (its drivers have stopped).
    `by`: who pressed Stop, recorded on each request the turn waited on. A turn ended
    here stops what it asked (`stop_asked`), `depth` levels down already.
    """
    row = conn.execute(
        select(
            turns.c.session_id,
            turns.c.status,
            turns.c.lease_owner,
            turns.c.lease_expires_at,
            turns.c.lease_epoch,
            turns.c.last_seq,
            turns.c.input_seq,
            turns.c.attempts,
            turns.c.model,
        ).where(turns.c.turn_id == turn_id)
    ).first()
    if row is None:
        return None
    if row.status not in UNFINISHED:
        return str(row.status)
    expires = aware(row.lease_expires_at)
    live = (
        row.status == "running"
        and row.lease_owner not in (None, stopped_owner)
        and expires is not None
        and expires > now
    )
    if live:
        conn.execute(update(turns).where(turns.c.turn_id == turn_id).values(cancel_requested=True))
        notify_stop(conn, turn_id)
        flag_asked(conn, turn_id, depth=depth)
        return "running"
    spent_summary = _spent(row, read_usage(conn, turn_id), _asked_spent(conn, turn_id))
    ending = _ending(conn, row, turn_id, now, spent_summary)
    seq = ending[-1].seq
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
            **({"summary": spent_summary.model_dump_json()} if spent_summary else {}),
        )
    )
    if won.rowcount != 1:
        return cancel(conn, turn_id, now, stopped_owner, by, depth)  # it moved: look again
    conn.execute(events.insert(), [event_values(turn_id, e) for e in ending])
    release(conn, turn_id)  # a driver that died mid-call left its reservation
    close_open_pauses(conn, turn_id, stopped_at=now, by=by)
    requeue_guides(conn, turn_id, _presented_through(conn, turn_id, row.input_seq), now)
    stop_asked(conn, turn_id, now, by=by, depth=depth)
    return "cancelled"


def stop_asked(
    conn: Connection, turn_id: TurnId, now: datetime, *, by: str | None = None, depth: int = 0
) -> list[TurnId]:
    """Stop the unfinished turns of the agents `turn_id` asked as tools.

    Run in the transaction that ends `turn_id` without its success: each such turn no
    live driver holds ends `cancelled` here (and stops what it asked in turn); one a live
    driver holds is flagged, so that driver, or whoever takes it over, ends it
    `cancelled`. Returns the turns it stopped or flagged (found as `_asked_turns` says).
    """
    if depth >= _DEPTH:
        return []
    stopped: list[TurnId] = []
    for asked in _asked_turns(conn, turn_id):
        status = conn.execute(
            select(turns.c.status).where(turns.c.turn_id == asked)
        ).scalar_one_or_none()
        if status in UNFINISHED and cancel(conn, asked, now, by=by, depth=depth + 1):
            stopped.append(asked)
    return stopped


def flag_asked(conn: Connection, turn_id: TurnId, *, depth: int = 0) -> None:
    """Flag the running turns of the agents `turn_id` asked, as Stop flags `turn_id` itself.

    Run in the transaction that flags `turn_id` for a live driver: that driver stops them
    with it at its next renewal, but if it dies first, an asked turn's lease may lapse
    before the asking turn's does, and whoever takes the asked turn over then ends it
    `cancelled` instead of running it. A paused asked turn is left to the asking turn's
    ending (`stop_asked`).
    """
    if depth >= _DEPTH:
        return
    for asked in _asked_turns(conn, turn_id):
        flagged = conn.execute(
            update(turns)
            .where(turns.c.turn_id == asked, turns.c.status == "running")
            .values(cancel_requested=True)
        )
        if flagged.rowcount:
            notify_stop(conn, asked)
            flag_asked(conn, asked, depth=depth + 1)


def notify_stop(conn: Connection, turn_id: TurnId) -> None:
    """PostgreSQL: tell the turn's driver of its Stop now (`turnkit_stop`), not at its renewal.

    Sent when the flagging transaction commits; a process that drives the turn and listens
    renews its lease at once (see `Store.stop_signal`). SQLite has no notifications.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_notify('turnkit_stop', :turn_id)"), {"turn_id": turn_id})


def unfinished_asked(conn: Connection, turn_id: TurnId) -> list[TurnId]:
    """The turns `stop_asked` would stop now (those `_asked_turns` finds unfinished)."""
    asked = _asked_turns(conn, turn_id)
    if not asked:
        return []
    open_ = set(
        conn.execute(
            select(turns.c.turn_id).where(
                turns.c.turn_id.in_(asked), turns.c.status.in_(UNFINISHED)
            )
        ).scalars()
    )
    return [TurnId(t) for t in asked if t in open_]


def _asked_turns(conn: Connection, turn_id: TurnId) -> list[TurnId]:
    """The turns of the agents `turn_id` asked (those it names, unfinished), oldest first.

    An asked turn names the turn that asked it (`asked_by`, since revision 0018); one an
    older turnkit wrote is found through the asking turn's saved requests it was handed.
    """
    rows = conn.execute(
        select(pauses.c.payload).where(
            pauses.c.turn_id == turn_id, pauses.c.payload.like(ASKED_PAYLOAD)
        )
    ).all()
    linked = conn.execute(
        select(turns.c.turn_id)
        .where(turns.c.asked_by == turn_id, turns.c.status.in_(UNFINISHED))
        .order_by(turns.c.created_at, turns.c.turn_id)
    ).scalars()
    handed = (_asked_turn(payload) for (payload,) in rows)
    return [t for t in dict.fromkeys([*handed, *(TurnId(t) for t in linked)]) if t is not None]


def _asked_turn(payload: str) -> TurnId | None:
    """The asked agent's turn a saved request stands for (None: the turn's own request)."""
    try:
        asked = json.loads(payload).get("asked")
    except (ValueError, AttributeError):
        return None
    turn = asked.get("turn_id") if isinstance(asked, dict) else None
    return TurnId(turn) if isinstance(turn, str) else None


def _spent(row: Any, spent: UsageDelta, asked: AskedUsage | None) -> RunSummary | None:
    """The turn's whole account (its attempts before a pause, say), if it spent anything."""
    if not (spent.model_calls or spent.input_tokens or spent.cost_usd or asked):
        return None
    return RunSummary(
        status="cancelled",
        stop_reason="aborted",
        model=row.model,
        attempt=max(1, row.attempts),
        asked=asked,
        **spent.model_dump(),  # calls, tokens and cost, as RunSummary names them
    )


def _asked_spent(conn: Connection, turn_id: TurnId) -> AskedUsage | None:
    """What the agents the turn asked spent, as its `askedTurn` audit rows recorded it."""
    spent: list[AskedTurnPayload] = []
    for blob in audit_blobs(conn, turn_id):
        if b'"askedTurn":{' not in blob:  # most rows are model calls: decode only these
            continue
        try:
            spent.append(AskedTurnPayload.model_validate(json.loads(blob)["payloads"]["askedTurn"]))
        except (ValueError, KeyError, TypeError):  # written by a newer turnkit: not counted
            continue
    return asked_usage(spent)


def _ending(
    conn: Connection, row: Any, turn_id: TurnId, now: datetime, summary: RunSummary | None
) -> list[JobCompletedEvent | RunFinishedEvent | DoneEvent]:
    """The events that end the turn here: `done`, after `run.finished` with `summary`.

    So its history and usage say what it cost, as a turn its driver ended does; a job a
    driver that died left running is completed first, as an error.
    """
    common: dict[str, Any] = {"session_id": row.session_id, "turn_id": turn_id, "ts": now}
    ending: list[JobCompletedEvent | RunFinishedEvent | DoneEvent] = [
        *cut_jobs(conn, turn_id, row.last_seq + 1, common)
    ]
    seq = row.last_seq + 1 + len(ending)
    if summary is not None:
        fields = summary.event_fields()
        ending.append(RunFinishedEvent(**common, stage_id="runtime", seq=seq, **fields))
        seq += 1
    ending.append(DoneEvent(**common, stage_id="runtime", seq=seq, status="cancelled"))
    return ending


def _presented_through(conn: Connection, turn_id: TurnId, input_seq: int) -> int:
    """The newest input seq the turn presented: its own, or its last `input.guided`'s.

    Guides after it were never read by the model: they get turns of their own.
    """
    newest = input_seq
    for (data,) in conn.execute(
        select(events.c.data).where(events.c.turn_id == turn_id, events.c.type == "input.guided")
    ):
        try:
            event = decode_event(data)
        except ValueError:  # unreadable (damaged, or a newer turnkit's): skipped, as readers do
            continue
        if isinstance(event, InputGuidedEvent):
            newest = max(newest, event.input_seq)
    return newest
