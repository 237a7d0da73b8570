"""Guide messages (`delivery=guide`) join a running turn before its next model request."""

from __future__ import annotations

from turnkit.errors import GuardrailBlockedError
from turnkit.events import InputGuidedEvent
from turnkit.ids import StageId
from turnkit.journal import CommittedGeneration
from turnkit.stages._plugins import BLOCKED_INPUT, guard
from turnkit.stages._types import StageContext, TranscriptMessage
from turnkit.telemetry import Recorder

__all__ = ("presented_guides", "take_guides")


async def take_guides(
    ctx: StageContext, stage_id: StageId, transcript: list[TranscriptMessage]
) -> tuple[TranscriptMessage, ...]:
    """User messages for guides that arrived since the last request (append-only).

    Each is committed as `input.guided` and counted in the next `message.complete`'s
    `input_seqs`. A guide the checkpointed transcript already holds is not added twice
    (a recovered attempt re-runs the step that first presented it).
    """
    rec = ctx.recorder
    guides = await _arrived(rec)
    if not guides:
        return ()
    present = {m.get("input_seq") for m in transcript}
    added: list[TranscriptMessage] = []
    for seq, content, request_id in guides:
        rec.durable(
            InputGuidedEvent, stage_id, content=content, input_seq=seq, request_id=request_id
        )
        if seq not in present:
            added.append(await _message(ctx, stage_id, content, seq))
    return tuple(added)


async def _message(
    ctx: StageContext, stage_id: StageId, content: str, input_seq: int
) -> TranscriptMessage:
    """A guide as the model reads it: a user message, marked with its input.

    It is the person's message like any other: the input guardrails check it first (a
    redaction is what the model reads; a blocked guide is withheld, the turn goes on).
    """
    try:
        content = await guard(
            ctx, stage_id, "input", content, subject="guide message", input_seq=input_seq
        )
    except GuardrailBlockedError:
        content = BLOCKED_INPUT
    return {"role": "user", "content": content, "input_seq": input_seq}


def _presented(rec: Recorder, seqs: list[int]) -> None:
    """Count guides `seqs` as presented: never offered again, and in the answer's inputs."""
    notes = rec.notes
    notes.guide_watermark = max(notes.guide_watermark, *seqs)
    notes.input_seqs = (*notes.input_seqs, *seqs)


async def _arrived(rec: Recorder) -> list[tuple[int, str, str | None]]:
    """Guide messages that arrived since the last request (marked as presented)."""
    notes = rec.notes
    watermark = notes.consumed_input_seq
    if notes.newest_guide_seq <= watermark:
        return []  # the last commit saw none newer: no query
    found = await rec.store.guided_inputs(rec.turn_id, after_input_seq=watermark)
    if found:
        _presented(rec, [seq for seq, _, _ in found])
    return found


async def presented_guides(
    ctx: StageContext,
    stage_id: StageId,
    transcript: list[TranscriptMessage],
    generation: CommittedGeneration,
) -> tuple[TranscriptMessage, ...]:
    """The guides the request `generation` answered presented, from the log.

    For an attempt that reuses the answer instead of asking again: the guides stand where
    that request had them, and count as presented (never offered a second time).
    """
    present = {m.get("input_seq") for m in transcript}
    found = [
        g for g in ctx.recorder.journal.guides_before(generation) if g.input_seq not in present
    ]
    if not found:
        return ()
    _presented(ctx.recorder, [g.input_seq for g in found])
    return tuple([await _message(ctx, stage_id, g.content, g.input_seq) for g in found])
