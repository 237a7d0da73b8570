"""Checking an answer against the agent's `output_type`, in the tool loop and synthesize.

An answer that fails is kept as narration with its `outputCheck` row, and the model reads
what was wrong in a user message of its own (in the tool loop, with its tools usable). A
verdict on an answer already in the log is the one its attempt committed, so a takeover
(or a validator that reads `deps`) never turns a failed answer into the answer or back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from turnkit.audit import AuditPayloads, OutputCheckPayload
from turnkit.blocks import TextBlock
from turnkit.errors import OutputInvalidError
from turnkit.events import MessageCompleteEvent
from turnkit.ids import StageId
from turnkit.journal import CommittedGeneration
from turnkit.output import AnswerContext, OutputCheck, ToolCallMade, repair_request
from turnkit.stages._types import StageContext, TranscriptMessage

__all__ = (
    "Checked",
    "asked_again",
    "check_answer",
    "commit_failed",
    "answer_context",
    "failed_answers",
    "out_of_retries",
)

_FAILED: Final = "the answer did not pass its check"
"""What an answer in the log that failed its check is said to lack when its row is gone."""


@dataclass(frozen=True, slots=True)
class Checked:
    """One answer's verdict: its attempt number and what is wrong with it (empty: fine)."""

    attempt: int
    """How many of the turn's answers failed before it."""
    problems: tuple[str, ...]

    def payload(self, generation_id: str) -> OutputCheckPayload:
        """The answer's `outputCheck` audit payload."""
        return OutputCheckPayload(
            attempt=self.attempt,
            valid=not self.problems,
            problems=self.problems,
            generation_id=generation_id,
        )


def check_answer(
    ctx: StageContext,
    check: OutputCheck,
    text: str,
    generation_id: str,
    logged: CommittedGeneration | None,
) -> Checked:
    """The verdict on `text`, the answer of `generation_id`.

    For an answer already in the log (`logged`), the verdict its attempt committed.
    """
    attempt = failed_answers(ctx, logged)
    if logged is None:
        return Checked(attempt, check.problems(text, answer_context(ctx)))
    if logged.is_answer:
        return Checked(attempt, ())
    found = ctx.recorder.journal.answer_problems.get(generation_id)
    return Checked(attempt, found or check.problems(text, answer_context(ctx)) or (_FAILED,))


def commit_failed(
    ctx: StageContext,
    stage_id: StageId,
    checked: Checked,
    *,
    text: str,
    block_id: str,
    generation_id: str,
) -> None:
    """Stage a failed answer as narration, with its `outputCheck` row."""
    rec = ctx.recorder
    rec.audit(
        stage_id, call=None, payloads=AuditPayloads(outputCheck=checked.payload(generation_id))
    )
    rec.durable(
        MessageCompleteEvent,
        stage_id,
        block=TextBlock(block_id=block_id, text=text),
        generation_id=generation_id,
        input_seqs=rec.notes.input_seqs,
    )
    rec.notes.failed_answers += 1


def asked_again(checked: Checked) -> TranscriptMessage:
    """The user message that asks for the answer again, with what was wrong."""
    return {"role": "user", "content": repair_request(checked.problems)}


def out_of_retries(
    ctx: StageContext, check: OutputCheck, checked: Checked, kept: list[TranscriptMessage]
) -> OutputInvalidError | None:
    """The turn's error when a failed answer was the last allowed (None: ask again).

    `kept` is what the failed turn stores (the failed answer last).
    """
    if checked.attempt < check.retries:
        return None
    ctx.recorder.notes.transcript = kept
    return OutputInvalidError(
        f"the answer did not match the agent's output_type after {checked.attempt + 1} "
        f"answer(s): {checked.problems[0]}",
        problems=list(checked.problems),
    )


def failed_answers(ctx: StageContext, logged: CommittedGeneration | None) -> int:
    """How many of the turn's answers failed their check before this one.

    Counted from the log (each failed answer's committed row; for an answer in the log,
    those before it) and from this attempt's own, never from the transcript, which
    compaction folds.
    """
    journal = ctx.recorder.journal
    seqs = [
        journal.generations[generation].first_seq
        for generation, problems in journal.answer_problems.items()
        if problems and generation in journal.generations
    ]
    if logged is not None:
        return sum(1 for seq in seqs if seq < logged.first_seq)
    return len(seqs) + ctx.recorder.notes.failed_answers


def answer_context(ctx: StageContext) -> AnswerContext:
    """The turn's caller, deps and finished tool calls, for the answer's validators.

    From the log and this attempt's results, not the transcript (compaction folds it).
    """
    rec = ctx.recorder
    arguments = {
        c.tool_call_id: c.arguments for g in rec.journal.generations.values() for c in g.calls
    }
    arguments.update(rec.notes.call_arguments)
    results = {call_id: block for call_id, (block, _) in rec.journal.results.items()}
    for call_id, block in rec.notes.results.items():
        results.setdefault(call_id, block)
    made = tuple(
        ToolCallMade(
            name=block.tool_name,
            arguments=block.arguments
            if block.arguments is not None
            else arguments.get(call_id, {}),
            output=None if block.is_error else block.output,
            error=(block.error or "failed") if block.is_error else None,
        )
        for call_id, block in results.items()
    )
    return AnswerContext(caller=ctx.caller, deps=ctx.deps, tool_calls=made)
