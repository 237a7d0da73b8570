"""Table handles and row mapping shared by the SQL modules (private)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table

from turnkit.audit import AuditRow
from turnkit.blocks import ImagePart
from turnkit.events import DurableEvent, encode_event
from turnkit.ids import SessionId, TurnId
from turnkit.states import TRANSITIONS, TurnStatus
from turnkit.store import RunSummary, TurnRecord
from turnkit.store._tables import (
    AuditRowTable,
    BudgetLimitRow,
    BudgetReservationRow,
    EventRow,
    InputRow,
    PauseRow,
    SessionRow,
    TranscriptRow,
    TurnRow,
    UsageRollupRow,
    WorkspaceFileRow,
)

sessions: Table = SessionRow.__table__  # type: ignore[attr-defined]
inputs: Table = InputRow.__table__  # type: ignore[attr-defined]
turns: Table = TurnRow.__table__  # type: ignore[attr-defined]
events: Table = EventRow.__table__  # type: ignore[attr-defined]
audit: Table = AuditRowTable.__table__  # type: ignore[attr-defined]
usage: Table = UsageRollupRow.__table__  # type: ignore[attr-defined]
pauses: Table = PauseRow.__table__  # type: ignore[attr-defined]
workspace_files: Table = WorkspaceFileRow.__table__  # type: ignore[attr-defined]
budget_limits: Table = BudgetLimitRow.__table__  # type: ignore[attr-defined]
reservations: Table = BudgetReservationRow.__table__  # type: ignore[attr-defined]
transcripts: Table = TranscriptRow.__table__  # type: ignore[attr-defined]

SOURCES: dict[TurnStatus, tuple[TurnStatus, ...]] = {
    target: tuple(s for s, targets in TRANSITIONS.items() if target in targets)
    for target in TRANSITIONS
}
"""For each status, the statuses a turn may move to it from."""

UNFINISHED: tuple[TurnStatus, ...] = (
    "running",
    "awaiting_approval",
    "awaiting_input",
    "awaiting_budget",
)
UNFINISHED_SQL = ", ".join(f"'{s}'" for s in UNFINISHED)
"""`UNFINISHED` as a SQL list (`status IN (...)` in hand-written statements)."""


def event_values(turn_id: str, event: DurableEvent) -> dict[str, Any]:
    """`event`'s row in `tk_events` (its wire bytes, as readers receive them)."""
    return {"turn_id": turn_id, "seq": event.seq, "type": event.type, "data": encode_event(event)}  # type: ignore[attr-defined]


def audit_values(row: AuditRow) -> dict[str, Any]:
    """`row`'s row in `tk_audit`."""
    identity = row.identity
    return {
        "turn_id": identity.turn_id,
        "seq_within_turn": identity.seq_within_turn,
        "session_id": identity.session_id,
        "stage_id": identity.stage_id,
        "data": row.model_dump_json(by_alias=True).encode(),
    }


def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every stored time is UTC."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Fields:
    """An asyncpg record read by attribute, as SQLAlchemy rows are (`row.turn_id`)."""

    __slots__ = ("_record",)

    def __init__(self, record: Any) -> None:
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return self._record[name]


def turn_record(row: Any) -> TurnRecord:
    """Map a `tk_turns` row (or anything with its attributes) to a `TurnRecord`."""
    created = aware(row.created_at)
    updated = aware(row.updated_at)
    assert created is not None
    assert updated is not None
    return TurnRecord(
        turn_id=TurnId(row.turn_id),
        session_id=SessionId(row.session_id),
        input_seq=row.input_seq,
        status=cast(TurnStatus, row.status),
        content=row.content,
        request_id=row.request_id,
        agent=row.agent,
        model=row.model,
        error_code=row.error_code,
        last_seq=row.last_seq,
        lease_epoch=row.lease_epoch,
        lease_owner=row.lease_owner,
        lease_expires_at=aware(row.lease_expires_at),
        attempts=row.attempts,
        pinned=json.loads(row.pinned) if row.pinned else {},
        summary=RunSummary.model_validate_json(row.summary) if row.summary else None,
        started_at=aware(row.started_at),
        created_at=created,
        updated_at=updated,
        attachments=_attachments(row.attachments),
    )


def _attachments(raw: str | None) -> tuple[ImagePart, ...]:
    if not raw:
        return ()
    return tuple(ImagePart.model_validate(item) for item in json.loads(raw))


def attachments_json(parts: tuple[ImagePart, ...]) -> str | None:
    """Pictures as stored in `tk_turns.attachments` (None when there are none)."""
    if not parts:
        return None
    return json.dumps([p.model_dump(mode="json") for p in parts])
