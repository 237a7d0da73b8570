"""PostgreSQL's append path: a commit that moves no status, as one statement.

Most of a turn's commits only append: events, audit rows and the usage they add, fenced on
the lease epoch. Through SQLAlchemy that is BEGIN, four statements and COMMIT, each a round
trip to the server. Here it is one statement (data-modifying CTEs), sent on the driver's
own connection as a prepared statement: one round trip, atomic as any single statement.
If the fence refuses (the epoch moved on), nothing is written and the caller explains why.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from turnkit.audit import UsageDelta
from turnkit.ids import TurnId
from turnkit.store import CommitResult

__all__ = ("APPEND", "append")

APPEND = """
WITH fence AS (
    UPDATE tk_turns
    SET updated_at = $3,
        last_seq = CASE WHEN tk_turns.last_seq < $4 THEN $4 ELSE tk_turns.last_seq END
    WHERE turn_id = $1 AND lease_epoch = $2
    RETURNING (
        SELECT max(i.seq) FROM tk_inputs i WHERE i.turn_id = $1 AND i.delivery = 'guide'
    ) AS newest_guide
), new_events AS (
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
)
SELECT newest_guide FROM fence
"""


async def append(
    conn: Any,
    turn_id: TurnId,
    epoch: int,
    now: datetime,
    event_rows: list[dict[str, Any]],
    audit_rows: list[dict[str, Any]],
    usage: tuple[str | None, dict[int, UsageDelta]],
) -> CommitResult | None:
    """Run `APPEND` on an asyncpg connection; None if the fence refused (nothing written)."""
    session_id, per_row = usage
    counted = [
        (seq, delta) for seq, delta in per_row.items() if delta.model_calls or delta.cost_usd
    ]
    rows = await conn.fetch(
        APPEND,
        turn_id,
        epoch,
        now,
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
    )
    if not rows:
        return None
    return CommitResult(newest_guide_seq=int(rows[0]["newest_guide"] or 0), requeued=0)
