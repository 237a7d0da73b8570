"""Cancelling a turn: end it here when no live driver holds it, else flag it for the driver.

A turn ended here closes its open pause requests and gives the guide messages it never
presented turns of their own, as a driver's ending does.

Runs inside one transaction on a sync `Connection` (see `SqlStore._tx`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from turnkit.audit import UsageDelta
from turnkit.events import (
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
    turns,
)
from turnkit.store._submit_sql import requeue_guides
from turnkit.store._turns_sql import read_usage

__all__ = ("cancel",)


def cancel(
    conn: Connection,
    turn_id: TurnId,
    now: datetime,
    stopped_owner: str | None = None,
    by: str | None = None,
) -> str | None:
    """Cancel here if no live driver holds the turn, else flag it. None: no such turn.

    `stopped_owner`: a lease that owner holds counts as lapsed (its drivers have stopped).
    `by`: who pressed Stop, recorded on each request the turn waited on.
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
        return "running"
    spent_summary = _spent(row, read_usage(conn, turn_id))
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
        return cancel(conn, turn_id, now, stopped_owner, by)  # it moved under us: look again
    conn.execute(events.insert(), [event_values(turn_id, e) for e in ending])
    release(conn, turn_id)  # a driver that died mid-call left its reservation
    close_open_pauses(conn, turn_id, stopped_at=now, by=by)
    requeue_guides(conn, turn_id, _presented_through(conn, turn_id, row.input_seq), now)
    return "cancelled"


def _spent(row: Any, spent: UsageDelta) -> RunSummary | None:
    """The turn's whole account (its attempts before a pause, say), if it spent anything."""
    if not (spent.model_calls or spent.input_tokens or spent.cost_usd):
        return None
    return RunSummary(
        status="cancelled",
        stop_reason="aborted",
        model=row.model,
        attempt=max(1, row.attempts),
        **spent.model_dump(),  # calls, tokens and cost, as RunSummary names them
    )


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
