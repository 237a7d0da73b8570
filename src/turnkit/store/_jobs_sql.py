"""Jobs a turn's log left open, for endings written without its driver (a Stop, a sweep)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from turnkit.events import JobCompletedEvent, JobDispatchedEvent, decode_event
from turnkit.ids import TurnId
from turnkit.store._schema import events

__all__ = ("cut_jobs",)

_JOB_TYPES = ("job.dispatched", "job.completed")


def cut_jobs(
    conn: Connection, turn_id: TurnId, first_seq: int, common: dict[str, Any]
) -> list[JobCompletedEvent]:
    """`job.completed` (an error) for each job the turn dispatched and never completed.

    Numbered from `first_seq`; `common` holds the session, turn and time of the ending.
    """
    open_jobs: dict[str, str] = {}
    rows = conn.execute(
        select(events.c.data)
        .where(events.c.turn_id == turn_id, events.c.type.in_(_JOB_TYPES))
        .order_by(events.c.seq)
    )
    for (data,) in rows:
        try:
            event = decode_event(data)
        except ValueError:  # unreadable (damaged, or a newer turnkit's): skipped, as readers do
            continue
        if isinstance(event, JobDispatchedEvent):
            open_jobs[event.job_id] = event.tool_call_id
        elif isinstance(event, JobCompletedEvent):
            open_jobs.pop(event.job_id, None)
    return [
        JobCompletedEvent(
            **common,
            stage_id="tool-loop",
            seq=first_seq + n,
            job_id=job_id,
            tool_call_id=call_id,
            is_error=True,
        )
        for n, (job_id, call_id) in enumerate(open_jobs.items())
    ]
