"""Checking an answer against the agent's `output_type`, in the tool loop and synthesize.

An answer that fails is kept as narration with its `outputCheck` row, and the model reads
what was wrong in a user message of its own (in the tool loop, with its tools usable). A
verdict on an answer already in the log is the one its attempt committed, so a takeover
(or a validator that reads `deps`) never turns a failed answer into the answer or back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from turnkit.audit import AuditPayloads, OutputCheckPayload
from turnkit.blocks import TextBlock
from turnkit.context.transcript import PartJson, current_opening
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
    "failed_answers",
    "out_of_retries",
)

_FAILED: Final = "the answer did not pass its check"
"""What an answer in the log that failed its check is said to lack when its row is gone."""

_ASKED_AGAIN: Final = repair_request(()).split(":", 1)[0]
"""How every message asking for an answer again begins (none of the person's has no seq)."""


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
    transcript: list[TranscriptMessage],
    text: str,
    generation_id: str,
    logged: CommittedGeneration | None,
) -> Checked:
    """The verdict on `text`, the answer of `generation_id`, given the turn so far.

    `transcript` is what the answer was given (without the answer). For an answer already
    in the log (`logged`), the verdict its attempt committed.
    """
    attempt = failed_answers(transcript)
    if logged is None:
        return Checked(attempt, check.problems(text, _context(ctx, transcript)))
    if logged.is_answer:
        return Checked(attempt, ())
    found = ctx.recorder.journal.answer_problems.get(generation_id)
    return Checked(attempt, found or check.problems(text, _context(ctx, transcript)) or (_FAILED,))


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


def failed_answers(transcript: list[TranscriptMessage]) -> int:
    """How many of this turn's answers failed their check (each was asked for again)."""
    return sum(
        1
        for m in transcript[current_opening(transcript) :]
        if m["role"] == "user"
        and "input_seq" not in m
        and isinstance(m["content"], str)
        and m["content"].startswith(_ASKED_AGAIN)
    )


def _context(ctx: StageContext, transcript: list[TranscriptMessage]) -> AnswerContext:
    """The turn's caller, deps and tool calls, for the answer's validators."""
    results = {
        m.get("tool_call_id"): _text(m["content"]) for m in transcript if m["role"] == "tool"
    }
    made: list[ToolCallMade] = []
    for message in transcript[current_opening(transcript) :]:
        for tool_call in message.get("tool_calls", []) if message["role"] == "assistant" else []:
            try:
                arguments = json.loads(tool_call["arguments"] or "{}")
            except ValueError:
                arguments = {}
            made.append(
                ToolCallMade(
                    name=tool_call["name"],
                    arguments=arguments if isinstance(arguments, dict) else {},
                    result=results.get(tool_call["id"]),
                )
            )
    return AnswerContext(caller=ctx.caller, deps=ctx.deps, tool_calls=tuple(made))


def _text(content: str | list[PartJson]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("kind") == "text")
