"""PostgreSQL's hot commits as single statements: appends, and a turn's ending.

Most of a turn's commits only append: events, audit rows and the usage they add, fenced on
the lease epoch. Through SQLAlchemy that is BEGIN, four statements and COMMIT, each a round
trip to the server; and a turn's ending adds the status move, the lease released, the run
summary and the transcript the turn keeps. Here each is one statement (data-modifying
CTEs), sent on the driver's own connection as a prepared statement: one round trip, atomic
as any single statement.

If the fence refuses, nothing is written and the caller runs the full transaction, which
says why (a stale epoch, a refused move) or does what the statement leaves out. An ending
also refuses while a guide message the turn never presented waits on its row: re-queueing
guides is the full transaction's work; so is stopping the agents a turn that did not
succeed asked (`_cancel_sql.stop_asked`). The statement looks for such guides twice: in
the turn's inputs, as its snapshot has them, and on the turn's row, where every guide
writes its seq. A guide committed while the ending waited for that row is not in the
snapshot, but the ending re-checks the row's new version (and a guide an older turnkit
committed, which writes no seq on the row, is in the snapshot). A turn asked while the
ending waited for the row is not in the snapshot either: its submit wrote the asking turn's
row (`_submit_sql.hold_asking`), so an ending but a success also requires the row it
moves to be the version its snapshot read (`xmin`), and otherwise leaves the ending to
the full transaction, whose `stop_asked` looks afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from turnkit.audit import UsageDelta
from turnkit.ids import TurnId
from turnkit.store import CommitResult, Rider
from turnkit.store._budget_counts import CHAIN_PG, COUNTED_PG
from turnkit.store._cancel_sql import ASKED_PAYLOAD
from turnkit.store._schema import UNFINISHED_SQL

__all__ = ("APPEND", "END", "append", "end")

_ROWS = f"""
new_events AS (
    INSERT INTO tk_events (turn_id, seq, type, data)
    SELECT $1, e.seq, e.type, e.data
    FROM unnest($5::int[], $6::varchar[], $7::bytea[]) AS e(seq, type, data)
    WHERE EXISTS (SELECT FROM fence)
    ON CONFLICT DO NOTHING
), new_audit AS (
    INSERT INTO tk_audit (turn_id, seq_within_turn, session_id, stage_id, data)
    SELECT $1, a.seq, a.session_id, a.stage_id, a.data
    FROM unnest($8::int[], $9::varchar[], $10::varchar[], $11::bytea[])
        AS a(seq, session_id, stage_id, data)
    WHERE EXISTS (SELECT FROM fence)
    ON CONFLICT DO NOTHING
    RETURNING seq_within_turn
), added AS (
    -- Only rows this statement inserted count: re-appending a row repeats no usage.
    INSERT INTO tk_usage (turn_id, session_id, model_calls, input_tokens, output_tokens,
                          cached_tokens, cost_usd)
    SELECT $1, $12, sum(u.model_calls), sum(u.input_tokens), sum(u.output_tokens),
           sum(u.cached_tokens), sum(u.cost_usd)
    FROM unnest($13::int[], $14::int[], $15::int[], $16::int[], $17::int[], $18::float8[])
        AS u(seq, model_calls, input_tokens, output_tokens, cached_tokens, cost_usd)
    JOIN new_audit n ON n.seq_within_turn = u.seq
    HAVING sum(u.model_calls) > 0 OR sum(u.cost_usd) > 0
    ON CONFLICT (turn_id) DO UPDATE SET
        model_calls = tk_usage.model_calls + excluded.model_calls,
        input_tokens = tk_usage.input_tokens + excluded.input_tokens,
        output_tokens = tk_usage.output_tokens + excluded.output_tokens,
        cached_tokens = tk_usage.cached_tokens + excluded.cached_tokens,
        cost_usd = tk_usage.cost_usd + excluded.cost_usd
), spent AS (
    -- What the audit rows this statement inserted spent (none: no row).
    SELECT sum(s.cost_usd) AS usd, sum(s.input_tokens + s.output_tokens) AS tokens
    FROM unnest($13::int[], $15::int[], $16::int[], $18::float8[])
        AS s(seq, input_tokens, output_tokens, cost_usd)
    JOIN new_audit n ON n.seq_within_turn = s.seq
    HAVING sum(s.input_tokens + s.output_tokens) > 0 OR sum(s.cost_usd) > 0
), released AS (
    -- A call's spend is recorded: what it reserved of a budget is spent, not held. A row
    -- that spent nothing (a failed rung its cascade went on from) settles nothing.
    DELETE FROM tk_budget_reservations WHERE turn_id = $1 AND EXISTS (SELECT FROM spent)
), {CHAIN_PG}, counted AS (
    -- ... and counts against every limit covering the turn, in the call's period.
    {COUNTED_PG}
)
{{rider}}SELECT newest_guide_seq FROM fence
"""
"""Events, audit rows and usage (the call's budget reservation released, its spend
counted against the limits covering it), written only if `fence` (the turn's row) was
updated."""

_LAST_SEQ = "CASE WHEN tk_turns.last_seq < $4 THEN $4 ELSE tk_turns.last_seq END"

_APPEND = f"""
WITH RECURSIVE fence AS (
    UPDATE tk_turns SET updated_at = $3, last_seq = {_LAST_SEQ}
    WHERE turn_id = $1 AND lease_epoch = $2
    RETURNING newest_guide_seq
), {_ROWS}"""
APPEND = _APPEND.replace("{rider}", "")


_END = f"""
WITH RECURSIVE fence AS (
    UPDATE tk_turns
    SET updated_at = $3, last_seq = {_LAST_SEQ}, status = $19, error_code = $20,
        summary = COALESCE($21, tk_turns.summary), lease_owner = NULL, lease_expires_at = NULL
    WHERE turn_id = $1 AND lease_epoch = $2 AND status = ANY($22::varchar[])
        AND ($23::int IS NULL OR newest_guide_seq <= $23 AND NOT EXISTS (
            SELECT FROM tk_inputs i WHERE i.turn_id = $1 AND i.delivery = 'guide' AND i.seq > $23
        ))
        AND ($19 = 'succeeded' OR NOT EXISTS (
            SELECT FROM tk_pauses p WHERE p.turn_id = $1 AND p.payload LIKE '{ASKED_PAYLOAD}'
        ) AND NOT EXISTS (
            SELECT FROM tk_turns a WHERE a.asked_by = $1 AND a.status IN ({UNFINISHED_SQL})
        ) AND tk_turns.xmin = (SELECT s.xmin FROM tk_turns s WHERE s.turn_id = $1))
    RETURNING session_id, input_seq, newest_guide_seq
), dropped AS (
    -- The session keeps one last request: the newest turn's (the row below is not seen).
    UPDATE tk_transcripts SET last_request = NULL
    WHERE $27::text IS NOT NULL AND last_request IS NOT NULL AND turn_id <> $1
        AND session_id = (SELECT session_id FROM fence)
), kept AS (
    INSERT INTO tk_transcripts (turn_id, session_id, input_seq, replaces_history, messages,
                                last_request)
    SELECT $1, f.session_id, f.input_seq, $25, $26, $27 FROM fence f WHERE $24
    ON CONFLICT (turn_id) DO UPDATE SET replaces_history = EXCLUDED.replaces_history,
        messages = EXCLUDED.messages, last_request = EXCLUDED.last_request
), {_ROWS}"""
END = _END.replace("{rider}", "")


@lru_cache(maxsize=8)
def _carrying(statement: str, ctes: str, count: int) -> str:
    """`APPEND` or `END` with a rider's CTEs, numbered after the statement's parameters."""
    first = _OWN_ARGS[statement] + 1
    numbered = ctes.format(*(f"${first + i}" for i in range(count)))
    return statement.replace("{rider}", f", {numbered.strip()}\n")


_OWN_ARGS = {_APPEND: 18, _END: 27}
"""How many parameters each statement has of its own: a rider's are numbered after them."""


def _rows_args(
    event_rows: list[dict[str, Any]],
    audit_rows: list[dict[str, Any]],
    usage: tuple[str | None, dict[int, UsageDelta]],
) -> list[Any]:
    """`_ROWS`' parameters from $4 on: the top seq, the events, audit rows and usage."""
    session_id, per_row = usage
    counted = [
        (seq, delta) for seq, delta in per_row.items() if delta.model_calls or delta.cost_usd
    ]
    return [
        max((r["seq"] for r in event_rows), default=0),
        [r["seq"] for r in event_rows],
        [r["type"] for r in event_rows],
        [r["data"] for r in event_rows],
        [r["seq_within_turn"] for r in audit_rows],
        [r["session_id"] for r in audit_rows],
        [r["stage_id"] for r in audit_rows],
        [r["data"] for r in audit_rows],
        session_id,
        [seq for seq, _ in counted],
        [d.model_calls for _, d in counted],
        [d.input_tokens for _, d in counted],
        [d.output_tokens for _, d in counted],
        [d.cached_tokens for _, d in counted],
        [d.cost_usd for _, d in counted],
    ]


def _result(rows: Sequence[Any], *, carried: bool = False) -> CommitResult | None:
    if not rows:
        return None
    return CommitResult(newest_guide_seq=int(rows[0]["newest_guide_seq"] or 0), carried=carried)


async def append(
    conn: Any,
    turn_id: TurnId,
    epoch: int,
    now: datetime,
    event_rows: list[dict[str, Any]],
    audit_rows: list[dict[str, Any]],
    usage: tuple[str | None, dict[int, UsageDelta]],
    rider: Rider | None = None,
) -> CommitResult | None:
    """Run `APPEND` (with `rider`'s writes) on an asyncpg connection.

    None if the fence refused: then nothing is written, the rider neither.
    """
    rows = _rows_args(event_rows, audit_rows, usage)
    if rider is None:
        return _result(await conn.fetch(APPEND, turn_id, epoch, now, *rows))
    statement = _carrying(_APPEND, rider.ctes, len(rider.args))
    return _result(
        await conn.fetch(statement, turn_id, epoch, now, *rows, *rider.args), carried=True
    )


async def end(
    conn: Any,
    turn_id: TurnId,
    epoch: int,
    now: datetime,
    event_rows: list[dict[str, Any]],
    audit_rows: list[dict[str, Any]],
    usage: tuple[str | None, dict[int, UsageDelta]],
    move: tuple[str, str | None, Sequence[str]],
    summary: str | None,
    transcript: dict[str, Any] | None,
    guides_consumed_through: int | None,
    rider: Rider | None = None,
) -> CommitResult | None:
    """Run `END`: move the turn to a terminal status, release it, settle and append.

    `move` is (status, error code, the statuses it may move from); `transcript` comes
    from `_transcripts_sql.encoded`; `rider`'s writes go in the same statement. None if
    the fence refused (nothing written, the rider neither).
    """
    status, error_code, sources = move
    kept = transcript or {"replaces_history": False, "messages": "[]", "last_request": None}
    statement = END if rider is None else _carrying(_END, rider.ctes, len(rider.args))
    rows = await conn.fetch(
        statement,
        turn_id,
        epoch,
        now,
        *_rows_args(event_rows, audit_rows, usage),
        status,
        error_code,
        summary,
        list(sources),
        guides_consumed_through,
        transcript is not None,
        kept["replaces_history"],
        kept["messages"],
        kept["last_request"],
        *(rider.args if rider is not None else ()),
    )
    return _result(rows, carried=rider is not None)
