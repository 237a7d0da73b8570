"""The three endings an attempt can write: succeeded, failed (or timed out), cancelled.

Each stages the attempt's own account (`run.finished`) and `done`, then commits them with
the turn's terminal state, its summary and its transcript, releasing the lease. A failed or
cancelled ending first drops those of an ending whose commit did not land (a Stop that cut
the success's commit short): they never commit under another status.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import JsonValue

from turnkit.audit import (
    AuditPayloads,
    CallOutcome,
    CallShape,
    InterruptedBlockPayload,
    asked_usage,
)
from turnkit.blocks import TextBlock
from turnkit.context.transcript import TranscriptMessage
from turnkit.errors import (
    AdmissionRefusedError,
    DeadlineExceededError,
    LeaseLostError,
    StaleEpochError,
    TurnError,
)
from turnkit.events import (
    CheckpointCreatedEvent,
    DoneEvent,
    ErrorEvent,
    JobCompletedEvent,
    MessageCompleteEvent,
    RunFinishedEvent,
)
from turnkit.ids import StageId
from turnkit.runtime._transcript import answer_filtered, answer_kept, ended_transcript
from turnkit.states import TerminalStatus
from turnkit.store import RunSummary
from turnkit.telemetry import OpenCall, Recorder

__all__ = ("Attempt", "end_aborted", "end_failed", "end_succeeded")


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """What an ending reports of the attempt writing it."""

    number: int
    model: str
    started: float
    """`time.perf_counter()` when the attempt began."""
    skipped_events: int
    """Committed events of the turn it could not decode."""


async def end_succeeded(rec: Recorder, attempt: Attempt, checkpoint_id: str | None) -> None:
    """Commit a succeeded ending, naming the turn's last checkpoint when there is one."""
    status: TerminalStatus = "succeeded"
    rec.ending_begins()
    if checkpoint_id is not None:
        rec.durable(CheckpointCreatedEvent, "post-turn", checkpoint_id=checkpoint_id)
    summary = _summary(rec, attempt, status, None)
    _finished(rec, summary, "post-turn")
    rec.durable(DoneEvent, "post-turn", status=status)
    await rec.flush(
        status=status,
        summary=summary,
        release=True,
        transcript=ended_transcript(rec, status, None, None),
    )


async def end_failed(
    rec: Recorder, attempt: Attempt, exc: TurnError | AdmissionRefusedError
) -> bool:
    """Commit a failed ending (`timed_out` for a deadline), with its `error` event.

    An admission check refuses inside a turn only when its agent is re-pinned before it
    started (its checks run again): the turn ends with that check's code.

    A lease lost meanwhile leaves the ending to the attempt that holds it now: False.
    """
    status: TerminalStatus = "timed_out" if isinstance(exc, DeadlineExceededError) else "failed"
    rec.unstage_ending()  # an ending whose commit failed: not this one
    rec.ending_begins()
    _audit_cut_call(rec, outcome="error", error_code=exc.code)  # the idle window or ceiling
    _end_cut_jobs(rec)
    rec.durable(ErrorEvent, "runtime", code=exc.code, message=exc.message, details=_details(exc))
    summary = _summary(rec, attempt, status, exc.code)
    _finished(rec, summary, "runtime")
    rec.durable(DoneEvent, "runtime", status=status, error_code=exc.code)
    try:
        await rec.flush(
            status=status,
            error_code=exc.code,
            summary=summary,
            release=True,
            transcript=ended_transcript(
                rec, status, exc.code, exc.message, refusal=exc.details.get("refusal")
            ),
        )
    except (StaleEpochError, LeaseLostError):
        return False
    return True


async def end_aborted(rec: Recorder, attempt: Attempt) -> bool:
    """Commit a cancelled ending; a call cut short is audited `user-aborted`.

    The text that call had streamed is kept as an interrupted block. False when a lease
    lost meanwhile leaves the ending to the attempt that holds it now.
    """
    rec.unstage_ending()  # a success whose commit the Stop cut short: not that ending
    rec.ending_begins()
    _audit_cut_call(rec, outcome="user-aborted", error_code="user-aborted")
    _keep_shown_answer(rec)
    _end_cut_jobs(rec)
    summary = _summary(rec, attempt, "cancelled", None)
    _finished(rec, summary, "runtime")
    rec.durable(DoneEvent, "runtime", status="cancelled")
    try:
        await rec.flush(
            status="cancelled",
            summary=summary,
            release=True,
            transcript=ended_transcript(rec, "cancelled", None, None),
        )
    except (StaleEpochError, LeaseLostError):
        return False
    return True


def _end_cut_jobs(rec: Recorder) -> None:
    """`job.completed` (an error) for each job the ending cut short: none stays open."""
    for job_id, call_id in list(rec.notes.open_jobs.items()):
        rec.durable(
            JobCompletedEvent, "tool-loop", job_id=job_id, tool_call_id=call_id, is_error=True
        )
    rec.notes.open_jobs.clear()


def _audit_cut_call(rec: Recorder, *, outcome: CallOutcome, error_code: str) -> None:
    """Audit the model call the ending cut short, if one was open; keep the text it streamed.

    The ending came from outside the call (a Stop, the idle window, the ceiling), so the
    call left no row of its own. The provider reports no usage for a stream cut short:
    the request and all the call wrote so far (shown or not) are estimated, and budgets
    count them; a call that had finished, its answer still being checked, is billed
    what the provider reported.
    """
    call = rec.open_call
    if call is None:
        return
    kept = _keep_interrupted(rec, call)
    rec.audit(
        call.stage_id,
        call=CallShape(
            provider=call.provider,
            model=call.model,
            family=call.family,
            rung=call.rung,
            latency_ms=(time.perf_counter() - call.started) * 1000,
            outcome=outcome,
            error_code=error_code,
            **call.billed(),
        ),
        payloads=AuditPayloads(interruptedBlock=kept) if kept is not None else None,
    )
    rec.open_call = None


def _summary(
    rec: Recorder, attempt: Attempt, status: TerminalStatus, code: str | None
) -> RunSummary:
    usage = rec.usage
    return RunSummary(
        status=status,
        model_calls=usage.model_calls,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        cost_usd=usage.cost_usd,
        tool_timings=tuple(rec.notes.tool_timings),
        context_messages=rec.notes.context_messages,
        context_tokens=rec.notes.context_tokens,
        stop_reason=_stop_reason(rec, status),
        error_code=code,
        duration_ms=(time.perf_counter() - attempt.started) * 1000,
        model=attempt.model,
        attempt=attempt.number,
        skipped_events=attempt.skipped_events,
        recoveries=sum(1 for k in rec.journal.keys if k.startswith("turn.recovering:")),
        asked=asked_usage(rec.notes.asked_spent.values()),
    )


def _stop_reason(rec: Recorder, status: TerminalStatus) -> str:
    """`run.finished.stop_reason`: `content_filter` for an answer the filter cut."""
    if status == "succeeded" and answer_filtered(rec):
        return "content_filter"
    return {"succeeded": "end_turn", "cancelled": "aborted"}.get(status, "error")


def _finished(rec: Recorder, summary: RunSummary, stage: StageId) -> None:
    """Stage `run.finished`: the attempt's own account, just before `done`."""
    rec.durable(RunFinishedEvent, stage, **summary.event_fields())


def _keep_interrupted(rec: Recorder, call: OpenCall) -> InterruptedBlockPayload | None:
    """Stage the text a stopped call had streamed as an interrupted block, if any.

    It goes into history, and into the transcript the next turn's model reads.
    """
    text = "".join(call.text)
    if not text.strip():
        return None
    block = TextBlock(block_id=call.block_id, text=text, interrupted=True)
    rec.durable(MessageCompleteEvent, call.stage_id, block=block)
    rec.notes.transcript = [*rec.notes.transcript, {"role": "assistant", "content": text}]
    return InterruptedBlockPayload(block_id=call.block_id, chars=len(text))


def _keep_shown_answer(rec: Recorder) -> None:
    """Keep the answer a stopped turn had streamed in full, as the person saw it.

    Its block not kept yet (the Stop came after its call finished, before the ending):
    kept as an interrupted block, as for a call cut mid-stream, in history and in the
    transcript the next turn's model reads. Kept as the turn's answer already: the
    transcript ends with it (a Stop inside the stage that kept it, before the stage
    handed its transcript on).
    """
    shown = rec.notes.shown_answer
    if shown is None:
        return
    if f"message.complete:{shown.generation_id}" not in rec.journal.keys:
        block = TextBlock(block_id=shown.block_id, text=shown.text, interrupted=True)
        rec.durable(MessageCompleteEvent, shown.stage_id, block=block)
    elif not answer_kept(rec):
        return  # kept as narration (it failed the answer's check): the turn went on
    said: TranscriptMessage = {"role": "assistant", "content": shown.text}
    transcript = rec.notes.transcript
    if not transcript or transcript[-1] != said:
        rec.notes.transcript = [*transcript, said]


def _details(exc: TurnError | AdmissionRefusedError) -> dict[str, JsonValue]:
    """The error's typed attributes, as far as they are plain JSON."""
    out: dict[str, JsonValue] = {}
    for key, value in exc.details.items():
        if isinstance(value, tuple | list):
            value = [v for v in value if isinstance(v, str | int | float | bool)]
        if value is None or isinstance(value, str | int | float | bool | list):
            out[key] = value
    return out
