"""PostgreSQL's submit as one statement: the message, its turn and `turn.started`.

Through SQLAlchemy a new message is BEGIN, four statements and COMMIT: six round trips
before the turn can start. Here the common case — a message that opens a turn of its own
in a session that may be new — is one statement (data-modifying CTEs) on the driver's
connection, prepared once. Everything else (a request id seen before, a guide, a session
that must already exist) returns nothing here and goes through the full transaction.

Every part of a statement reads one snapshot, taken when it starts. Whether the new turn
may be claimed at once ("no earlier turn of the session is unfinished") is read from that
snapshot; a message committed to the same session meanwhile is not in it, but it did move
the session's input seq, which the upsert returns as it is now. If the seq moved by more
than this message, the turn is inserted queued, not claimed: the next claim takes it.

A turn asked by another (`asked_by`) goes in only while the asking turn is unfinished and
has no Stop pending, its row held as `_submit_sql.hold_asking` holds it (`SUBMIT_ASKED`, a
statement of its own so other messages pay nothing for it); otherwise nothing is written
here, and the full transaction refuses it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import ColumnElement, true
from sqlalchemy.dialects import postgresql

from turnkit.events import TurnStartedEvent, encode_event
from turnkit.store import NewInput, Submission
from turnkit.store._schema import UNFINISHED_SQL, attachments_json, sessions
from turnkit.store._submit_sql import (
    claim_of,
    opened,
    owner_may_post,
    owner_organisation,
    started_event,
)

__all__ = ("SUBMIT", "SUBMIT_ASKED", "can_submit", "submit")


def _pg(expression: ColumnElement[object]) -> str:
    """The full transaction's SQLAlchemy expression as this statement's SQL (one rule)."""
    return str(expression.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]


_SENT = postgresql.insert(sessions).excluded
_OWNER_MAY_POST = _pg(owner_may_post(_SENT, app=true()))
"""A message with a principal goes only into a session that principal owns or nobody does
(another's session: nothing is written here, and the full transaction refuses it)."""

_SEQ_MARK = 9_007_199_254_740_881
"""A stand-in input seq: the encoded `turn.started` is cut around it, the server fills it."""

_ASKING = f"""asking AS (
    -- The turn that asks is unfinished, with no Stop pending, and held (written) until
    -- this commits.
    UPDATE tk_turns SET updated_at = updated_at
    WHERE turn_id = $18 AND status IN ({UNFINISHED_SQL}) AND NOT cancel_requested
    RETURNING turn_id
), """

_SUBMIT = f"""
WITH {{asking}}found AS (
    SELECT FROM tk_inputs
    WHERE $3::varchar IS NOT NULL AND session_id = $1 AND request_id = $3
), seen AS (
    SELECT last_input_seq FROM tk_sessions WHERE session_id = $1
), session AS (
    INSERT INTO tk_sessions (session_id, principal, organisation, title, last_input_seq,
                             created_at, updated_at)
    SELECT $1, $9, CASE WHEN $9::varchar IS NULL THEN NULL ELSE $7 END, $12, 1, $13, $13
    WHERE NOT EXISTS (SELECT FROM found){{held}}
    ON CONFLICT (session_id) DO UPDATE SET
        last_input_seq = tk_sessions.last_input_seq + 1,
        title = CASE WHEN tk_sessions.last_input_seq = 0 AND tk_sessions.title IS NULL
                     THEN excluded.title ELSE tk_sessions.title END,
        organisation = {_pg(owner_organisation(_SENT))},
        updated_at = excluded.updated_at
    WHERE {_OWNER_MAY_POST}
    RETURNING last_input_seq AS seq
), decided AS (
    SELECT s.seq, (
        $14::varchar IS NULL
        OR s.seq - 1 <> COALESCE((SELECT last_input_seq FROM seen), 0)
        OR EXISTS (
            SELECT FROM tk_turns t
            WHERE t.session_id = $1 AND t.input_seq < s.seq
                AND t.status IN ({UNFINISHED_SQL})
        )
    ) AS queued
    FROM session s
), new_input AS (
    INSERT INTO tk_inputs (session_id, seq, request_id, content, requested_delivery,
                           delivery, turn_id, created_at)
    SELECT $1, d.seq, $3, $4, 'queue', 'queue', $2, $13 FROM decided d
), started AS (
    INSERT INTO tk_events (turn_id, seq, type, data)
    SELECT $2, 1, 'turn.started', $16::bytea || convert_to(d.seq::text, 'UTF8') || $17::bytea
    FROM decided d
)
INSERT INTO tk_turns (turn_id, session_id, input_seq, status, content, request_id, agent,
                      model, organisation, department, principal, last_seq,
                      cancel_requested, pinned, summary, attachments, error_code,
                      created_at, updated_at, lease_owner, lease_epoch, lease_expires_at,
                      attempts, claim_seq, started_at, asked_by)
SELECT $2, $1, d.seq, 'running', $4, $3, $5, $6, $7, $8, $9, 1, false, $10, NULL, $11, NULL,
       $13, $13,
       CASE WHEN d.queued THEN NULL ELSE $14 END,
       CASE WHEN d.queued THEN 0 ELSE 1 END,
       CASE WHEN d.queued THEN NULL ELSE $15::timestamptz END,
       CASE WHEN d.queued THEN 0 ELSE 1 END,
       CASE WHEN d.queued THEN 0 ELSE 1 END,
       CASE WHEN d.queued THEN NULL ELSE $13 END,
       $18
FROM decided d
RETURNING *
"""
SUBMIT = _SUBMIT.replace("{asking}", "").replace("{held}", "")
"""A message no turn asked: the common case."""
SUBMIT_ASKED = _SUBMIT.replace("{asking}", _ASKING).replace(
    "{held}", " AND EXISTS (SELECT FROM asking)"
)
"""A message an asking turn sends the agent it asks (`asked_by`, `$18`)."""


def _around_seq(started: TurnStartedEvent) -> tuple[bytes, bytes]:
    """`started` encoded, cut where its input seq (the stand-in) goes."""
    head, mark, tail = encode_event(started).partition(b'"input_seq":%d' % _SEQ_MARK)
    if not mark or mark in tail:
        raise AssertionError("turn.started must hold its input seq exactly once")
    return head + b'"input_seq":', tail


def can_submit(new: NewInput) -> bool:
    """Whether `submit` handles `new` (otherwise: the full transaction).

    Not a message of a caller nobody signed in: its owner check is the full transaction's.
    """
    return new.delivery == "queue" and new.create_session and not new.anonymous_caller


async def submit(conn: Any, new: NewInput, now: datetime) -> Submission | None:
    """Run `SUBMIT` on an asyncpg connection; None if nothing was written.

    Nothing is written when the session already has the message's request id, or the turn
    that asks has ended or has a Stop pending: the full transaction answers (the first
    submission, a refusal).
    """
    claim = claim_of(new)
    started = started_event(new, _SEQ_MARK, now)
    head, tail = _around_seq(started)
    row = await conn.fetchrow(
        SUBMIT if new.asked_by is None else SUBMIT_ASKED,
        new.session_id,
        new.turn_id,
        new.request_id,
        new.content,
        new.agent,
        new.model,
        new.organisation,
        new.department,
        new.principal,
        json.dumps(new.pinned, sort_keys=True),
        attachments_json(new.attachments),
        new.title,
        now,
        claim.owner if claim is not None else None,
        now + timedelta(seconds=claim.ttl_s) if claim is not None else None,
        head,
        tail,
        new.asked_by,
    )
    if row is None:
        return None
    turn = SimpleNamespace(**dict(row.items()))
    seq = turn.input_seq
    return opened(new, seq, started.model_copy(update={"input_seq": seq}), turn)
