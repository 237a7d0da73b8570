"""A takeover reads the context size back from the audit: the latest answered call on the
turn's own model, not the utility model's nor a failed rung's."""

from __future__ import annotations

from typing import cast

from turnkit.audit import (
    AuditPayloads,
    AuditRow,
    CallIdentity,
    CallShape,
    CompactionPayload,
    ThinkingSummaryPayload,
)
from turnkit.ids import SessionId, StageId, TurnId
from turnkit.runtime._attempt_log import context_tokens


def _row(
    seq: int,
    stage: str,
    tokens: tuple[int, int],
    *,
    outcome: str = "ok",
    payloads: AuditPayloads | None = None,
) -> AuditRow:
    return AuditRow(
        identity=CallIdentity(
            session_id=SessionId("s1"),
            turn_id=TurnId("t1"),
            stage_id=cast(StageId, stage),
            seq_within_turn=seq,
        ),
        call=CallShape(
            provider="scripted",
            model="m",
            family="default",
            rung=0,
            latency_ms=1.0,
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            outcome=outcome,  # type: ignore[arg-type]
            error_code=None if outcome == "ok" else "provider-error",
        ),
        payloads=payloads or AuditPayloads(),
    )


def test_the_latest_answered_own_model_call_is_the_context() -> None:
    compaction = AuditPayloads(
        compaction=CompactionPayload(
            strategy="summary",
            tokens_before=900,
            tokens_after=200,
            messages_before=9,
            messages_after=3,
            context_window=1000,
        )
    )
    thinking = AuditPayloads(
        thinkingSummary=ThinkingSummaryPayload(summary_chars=20, reasoning_chars=200)
    )
    rows = [
        _row(1, "anchor-plan", (50, 10)),
        _row(2, "tool-loop", (100, 20)),
        _row(3, "tool-loop", (700, 90), payloads=compaction),
        _row(4, "tool-loop", (300, 40)),
        _row(5, "tool-loop", (310, 0), outcome="error"),
        _row(6, "synthesize", (80, 30), payloads=thinking),
        _row(7, "post-turn", (60, 8)),
    ]
    assert context_tokens(rows) == 340
    assert context_tokens(rows[:3]) == 120
    assert context_tokens(rows[:1]) == 0
    assert context_tokens([]) == 0
