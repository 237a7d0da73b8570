"""The commit path: events, audit rows, usage, a status move and settling, in one transaction.

Every write a driver makes goes through `commit`, fenced on the lease epoch: if the turn's
epoch moved on (or the status move is not allowed), nothing is written and it says why.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, case, delete, select, update

from turnkit.audit import AuditRow, UsageDelta
from turnkit.clock import Clock
from turnkit.errors import StaleEpochError, StoreError, TurnNotFoundError
from turnkit.events import DurableEvent
from turnkit.ids import TurnId
from turnkit.pauses import PauseRequest
from turnkit.states import TERMINAL_STATES, TurnStatus
from turnkit.store import (
    CommitResult,
    _pauses_sql as pauses_sql,
    _transcripts_sql as transcripts_sql,
)
from turnkit.store._budget_counts import ADD_SPEND, spend_params
from turnkit.store._cancel_sql import stop_asked
from turnkit.store._schema import (
    SOURCES as _SOURCES,
    audit as _audit,
    audit_values,
    event_values,
    events as _events,
    reservations as _reservations,
    turns as _turns,
    usage as _usage,
)
from turnkit.store._submit_sql import requeue_guides

__all__ = ("HotStatements", "commit", "commit_rows")


class HotStatements:
    """The statements of the append path, built once (SQLAlchemy then only looks them up)."""

    def __init__(self, insert: Any) -> None:
        last_seq = case(
            (_turns.c.last_seq < bindparam("k_top"), bindparam("k_top")),
            else_=_turns.c.last_seq,
        )
        fenced = (
            _turns.c.turn_id == bindparam("k_turn"),
            _turns.c.lease_epoch == bindparam("k_epoch"),
        )
        # Every commit also reports the newest guide message for the turn, so the driver
        # only asks for guides when one arrived (no extra query per model request).
        newest_guide = _turns.c.newest_guide_seq
        self.touch_turn = (
            update(_turns)
            .where(*fenced)
            .values(updated_at=bindparam("k_now"), last_seq=last_seq)
            .returning(newest_guide)
        )
        # A status move also says whose turn it is (for the transcript it may keep) and
        # may settle the turn in the same statement (see `_settled`).
        self.move_turn = {
            (target, summary, release): update(_turns)
            .where(*fenced, _turns.c.status.in_(sources))
            .values(
                updated_at=bindparam("k_now"),
                last_seq=last_seq,
                status=bindparam("k_status"),
                error_code=bindparam("k_error"),
                **_settled(summary=summary, release=release),
            )
            .returning(newest_guide, _turns.c.session_id, _turns.c.input_seq)
            for target, sources in _SOURCES.items()
            for summary in (False, True)
            for release in (False, True)
        }
        self.insert_event = insert(_events).on_conflict_do_nothing()
        self.insert_audit = (
            insert(_audit).on_conflict_do_nothing().returning(_audit.c.seq_within_turn)
        )
        usage = insert(_usage)
        self.add_usage = usage.on_conflict_do_update(
            index_elements=["turn_id"],
            set_={
                name: getattr(_usage.c, name) + getattr(usage.excluded, name)
                for name in UsageDelta.model_fields
            },
        )
        # A call's spend is recorded: what it reserved of a budget is spent, not held. A row
        # that spent nothing (a failed rung its cascade went on from, a failed background
        # call) settles nothing: the call that reserved may still stream.
        self.release_reservation = delete(_reservations).where(
            _reservations.c.turn_id == bindparam("turn_id")
        )


def commit_rows(
    turn_id: TurnId, events: Sequence[DurableEvent], audit: Sequence[AuditRow]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], tuple[str | None, dict[int, UsageDelta]]]:
    """A commit's event rows, audit rows and (session id, usage per audit row), encoded.

    What both `commit` and `_commit_pg`'s statements take.
    """
    event_rows = [event_values(turn_id, e) for e in events]
    audit_rows = [{**audit_values(row), "turn_id": turn_id} for row in audit]
    usage = {row.identity.seq_within_turn: UsageDelta.of(row.call) for row in audit}
    session_id = audit[0].identity.session_id if audit else None
    return event_rows, audit_rows, (session_id, usage)


def commit(
    conn: Connection,
    hot: HotStatements,
    insert: Any,
    clock: Clock,
    turn_id: TurnId,
    epoch: int,
    event_rows: list[dict[str, Any]],
    audit_rows: list[dict[str, Any]],
    usage: tuple[str | None, dict[int, UsageDelta]],
    status: TurnStatus | None,
    error_code: str | None,
    settle: tuple[str | None, bool, dict[str, Any] | None] = (None, False, None),
    pause: PauseRequest | None = None,
    guides_consumed_through: int | None = None,
) -> CommitResult:
    """Apply one `SqlStore.commit` (rows already encoded); `clock` stamps it."""
    top = max((r["seq"] for r in event_rows), default=0)
    params: dict[str, Any] = {
        "k_turn": turn_id,
        "k_epoch": epoch,
        "k_now": clock.now(),
        "k_top": top,
    }
    summary_json, release, transcript = settle
    if status is None:
        statement = hot.touch_turn
    else:  # the move settles the turn too
        statement = hot.move_turn[status, summary_json is not None, release]
        params |= {"k_status": status, "k_error": error_code, "k_summary": summary_json}
    moved = conn.execute(statement, params).first()
    if moved is None:
        _explain_refusal(conn, turn_id, epoch, status)
    newest_guide = int(moved[0] or 0) if moved is not None else 0
    requeued = 0
    if status is None and (summary_json is not None or release):
        conn.execute(
            _settle(summary=summary_json is not None, release=release),
            {"k_turn": turn_id, "k_epoch": epoch, "k_summary": summary_json},
        )
    if transcript is not None:
        owner = (moved[1], moved[2]) if moved is not None and status is not None else None
        transcripts_sql.keep(conn, insert, turn_id, transcript, owner=owner)
    if guides_consumed_through is not None and status in TERMINAL_STATES:
        # The guides themselves, in a statement of their own: on PostgreSQL it reads a
        # snapshot taken after the move above, which saw any guide that waited for the row.
        requeued = requeue_guides(conn, turn_id, guides_consumed_through, clock.now())
    stopped: tuple[TurnId, ...] = ()
    if status in TERMINAL_STATES and status != "succeeded":
        # Nobody reads the answers of the agents it asked any more (see `stop_asked`).
        stopped = tuple(stop_asked(conn, turn_id, clock.now()))
    if pause is not None:
        session_id = conn.execute(_SESSION_OF, {"p_turn": turn_id}).scalar_one()
        pauses_sql.open_pause(conn, insert, turn_id, session_id, pause, clock.now())
    if event_rows:
        conn.execute(hot.insert_event, event_rows)
    if audit_rows:
        # Only rows this commit inserted count: re-appending a row repeats no usage.
        inserted = conn.execute(hot.insert_audit, audit_rows).scalars()
        session_id, per_row = usage
        delta = sum((per_row[seq] for seq in inserted), UsageDelta())
        if delta.model_calls or delta.cost_usd:
            conn.execute(
                hot.add_usage,
                {"turn_id": turn_id, "session_id": session_id, **delta.model_dump()},
            )
            tokens = delta.input_tokens + delta.output_tokens
            if tokens or delta.cost_usd:
                conn.execute(hot.release_reservation, {"turn_id": turn_id})
                spend = spend_params(turn_id, delta.cost_usd, tokens, clock.now())
                conn.execute(ADD_SPEND, spend)
    return CommitResult(newest_guide_seq=newest_guide, requeued=requeued, stopped_asked=stopped)


def _settled(*, summary: bool, release: bool) -> dict[str, Any]:
    """The columns settling a turn sets: the run summary, and/or the lease released."""
    values: dict[str, Any] = {}
    if summary:
        values["summary"] = bindparam("k_summary")
    if release:
        values["lease_owner"] = None
        values["lease_expires_at"] = None
    return values


@functools.cache
def _settle(*, summary: bool, release: bool) -> Any:
    """Record the run summary and/or release the lease (fenced on the epoch)."""
    return (
        update(_turns)
        .where(
            _turns.c.turn_id == bindparam("k_turn"), _turns.c.lease_epoch == bindparam("k_epoch")
        )
        .values(**_settled(summary=summary, release=release))
    )


_SESSION_OF = select(_turns.c.session_id).where(_turns.c.turn_id == bindparam("p_turn"))


def _explain_refusal(
    conn: Connection, turn_id: TurnId, epoch: int, status: TurnStatus | None
) -> None:
    row = conn.execute(
        select(_turns.c.status, _turns.c.lease_epoch).where(_turns.c.turn_id == turn_id)
    ).first()
    if row is None:
        raise TurnNotFoundError(f"no turn {turn_id!r}", turn_id=turn_id)
    if row.lease_epoch != epoch:
        raise StaleEpochError(
            f"turn {turn_id!r} is leased at epoch {row.lease_epoch}, not {epoch}: "
            "another driver owns it now; this driver must stop",
            turn_id=turn_id,
            epoch=epoch,
            current_epoch=row.lease_epoch,
        )
    raise StoreError(
        f"turn {turn_id!r} cannot move from {row.status!r} to {status!r}",
        turn_id=turn_id,
        current=row.status,
        target=status,
    )
