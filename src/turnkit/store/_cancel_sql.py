"""Cancelling a turn: end it here when no live driver holds it, else flag it for the driver.

Runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select, update

from turnkit.events import DoneEvent, encode_event
from turnkit.ids import TurnId
from turnkit.store._schema import UNFINISHED, aware, events, turns

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
    return "cancelled"
