"""Cancelling a turn: end it here when no live driver holds it, else flag it for the driver.

A turn ended here closes its open pause requests and gives the guide messages it never
presented turns of their own, as a driver's ending does.

Runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select, update

from turnkit.events import DoneEvent, InputGuidedEvent, decode_event, encode_event
from turnkit.ids import TurnId
from turnkit.store._pauses_sql import close_open_pauses
from turnkit.store._schema import UNFINISHED, aware, events, turns
from turnkit.store._submit_sql import requeue_guides

__all__ = ("cancel",)


def cancel(
    conn: Connection, turn_id: TurnId, now: datetime, stopped_owner: str | None = None
) -> str | None:
    """Cancel here if no live driver holds the turn, else flag it. None: no such turn.

    `stopped_owner`: a lease that owner holds counts as lapsed (its drivers have stopped).
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
        return cancel(conn, turn_id, now, stopped_owner)  # it moved under us: look again
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
    close_open_pauses(conn, turn_id)
    requeue_guides(conn, turn_id, _presented_through(conn, turn_id, row.input_seq), now)
    return "cancelled"


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
