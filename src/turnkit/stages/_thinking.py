"""The turn's thinking summary: a few safe sentences by the utility (background) model.

Raw reasoning never leaves the runtime. When the agent has a utility model, it writes one
summary per turn of what the assistant considered and decided, while the answer is still
arriving: the summary starts once the answer is clearly under way (a call that has
written a paragraph of text and no tool call, or the separate synthesis call) and is
committed, as `thinking.complete`, just before the answer's `message.complete`. If the
call turns out to use a tool after all, the summary in flight is cancelled (its partial
call is audited) and starts again with the next answer. No utility model: no summary,
no error.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Final

from turnkit.audit import AuditPayloads, CallShape, ThinkingSummaryPayload
from turnkit.blocks import ThinkingSummaryBlock
from turnkit.events import ThinkingCompleteEvent
from turnkit.ids import StageId, derive_id
from turnkit.models import ModelMessage, ModelRequest
from turnkit.models.family import ModelFamily
from turnkit.stages._types import StageContext
from turnkit.stages._utility import utility_text

__all__ = ("ANSWER_UNDER_WAY_CHARS", "SUMMARY_PROMPT", "ThinkingSummary", "thinking_of")

log = logging.getLogger("turnkit.thinking")

ANSWER_UNDER_WAY_CHARS: Final = 160
"""Text a call writes, with no tool call, before its answer counts as under way."""

SUMMARY_PROMPT: Final = (
    "In two or three sentences, describe what an assistant considered and decided while "
    "working on the request below, in the third person and in plain words. Do not quote "
    "its notes; never include secrets, credentials or personal data."
)
_KEY: Final = "thinking-summary"


@dataclass(slots=True)
class _Written:
    summary: str
    shape: CallShape
    reasoning_chars: int


class ThinkingSummary:
    """The one summary of a turn, written concurrently with the answer."""

    def __init__(self, ctx: StageContext, utility: ModelFamily) -> None:
        self._ctx = ctx
        self._utility = utility
        self._task: asyncio.Task[_Written | None] | None = None
        self._stage: StageId = "tool-loop"

    def start(self, stage_id: StageId) -> None:
        """Begin writing the summary (no-op if it is under way or already committed)."""
        rec = self._ctx.recorder
        if self._task is not None or rec.journal.generation(_generation(self._ctx)) is not None:
            return
        self._stage = stage_id
        self._task = asyncio.create_task(self._write(), name="turnkit-thinking-summary")
        rec.background.add(self._task)  # the driver cancels it if the turn ends first
        self._task.add_done_callback(rec.background.discard)

    async def discard(self) -> None:
        """The call went on to use a tool: drop the summary in flight."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def commit(self, stage_id: StageId) -> None:
        """Wait for the summary and stage its event and audit row (before the answer's)."""
        rec = self._ctx.recorder
        generation = _generation(self._ctx)
        if rec.journal.generation(generation) is not None:
            return  # committed by an earlier attempt
        self.start(stage_id)
        task, self._task = self._task, None
        written = await task if task is not None else None
        if written is None:
            return
        rec.audit(
            self._stage,
            call=written.shape,
            payloads=AuditPayloads(
                thinkingSummary=ThinkingSummaryPayload(
                    summary_chars=len(written.summary), reasoning_chars=written.reasoning_chars
                )
            ),
        )
        rec.durable(
            ThinkingCompleteEvent,
            stage_id,
            block=ThinkingSummaryBlock(
                block_id=derive_id("blk", rec.turn_id, _KEY, 0), summary=written.summary
            ),
            generation_id=generation,
        )

    async def _write(self) -> _Written | None:
        rec = self._ctx.recorder
        reasoning = "\n".join(r for r in rec.reasoning if r)
        request = ModelRequest(messages=self._messages(reasoning), purpose="utility")
        found = await utility_text(
            self._ctx, self._stage, self._utility, request, "the thinking summary"
        )
        if found is None:
            return None
        summary, shape = found
        return _Written(summary=summary, shape=shape, reasoning_chars=len(reasoning))

    def _messages(self, reasoning: str) -> tuple[ModelMessage, ...]:
        rec = self._ctx.recorder
        tools = ", ".join(name for name, _ in rec.tool_timings) or "none"
        notes = reasoning or "(the model shared no reasoning notes)"
        return (
            ModelMessage(role="system", content=SUMMARY_PROMPT),
            ModelMessage(
                role="user",
                content=f"Request: {rec.request_text}\nTools used: {tools}\nNotes:\n{notes}",
            ),
        )


def _generation(ctx: StageContext) -> str:
    return derive_id("gen", ctx.recorder.turn_id, _KEY)


def thinking_of(ctx: StageContext) -> ThinkingSummary | None:
    """The turn's summary writer (None without a utility model), shared across stages."""
    if ctx.utility is None:
        return None
    found = ctx.scratch.get(_KEY)
    if not isinstance(found, ThinkingSummary):
        found = ThinkingSummary(ctx, ctx.utility)
        ctx.scratch[_KEY] = found
    return found
