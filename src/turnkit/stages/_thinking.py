"""The turn's thinking summary: a few safe sentences by the utility (background) model.

Raw reasoning never leaves the runtime. When the agent has a utility model, it writes one
summary per turn of what the assistant considered and decided, while the answer is still
arriving: the summary starts once the answer is clearly under way (a call that has
written a paragraph of text and no tool call, or the separate synthesis call) and is
committed, as `thinking.complete`, just before the answer's `message.complete`. If the
call turns out to use a tool after all, the summary in flight is cancelled (its partial
call is audited) and starts again with the next answer. No utility model, or no
reasoning from the model: no summary, no error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Final

from turnkit import otel
from turnkit.audit import AuditPayloads, CallOutcome, CallShape, ThinkingSummaryPayload
from turnkit.blocks import ThinkingSummaryBlock
from turnkit.errors import TurnkitError
from turnkit.events import ThinkingCompleteEvent
from turnkit.ids import StageId, derive_id
from turnkit.models import (
    Finish,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RungStarted,
    TextDelta,
    Usage,
    closing_stream,
)
from turnkit.models.family import ModelFamily
from turnkit.stages._budget import prompt_tokens, text_tokens
from turnkit.stages._types import StageContext

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

    def start(self, stage_id: StageId, answering: str = "") -> None:
        """Begin writing the summary (no-op if it is under way or already committed).

        `answering`: the reasoning the answering call has streamed so far (the turn's
        notes hold each call's once it has ended). No reasoning at all: no summary, since
        a summary of nothing would be invented.
        """
        rec = self._ctx.recorder
        if self._task is not None or rec.journal.generation(_generation(self._ctx)) is not None:
            return
        reasoning = "\n".join(r for r in (*rec.notes.reasoning, answering) if r)
        if not reasoning:
            return
        self._stage = stage_id
        self._task = asyncio.create_task(self._write(reasoning), name="turnkit-thinking-summary")
        rec.notes.background.add(self._task)  # the driver cancels it if the turn ends first
        self._task.add_done_callback(rec.notes.background.discard)

    async def discard(self) -> None:
        """The call went on to use a tool: drop the summary in flight.

        A summary whose call already finished is dropped too, but its call was made and
        paid for: it is audited as `cancelled` with the usage it reported, so the turn's
        rollup and budgets see it, as they see a summary cancelled mid-call.
        """
        task, self._task = self._task, None
        if task is None:
            return
        if task.done():
            written = None if task.cancelled() or task.exception() else task.result()
            if written is not None:
                self._ctx.recorder.audit(
                    self._stage,
                    call=written.shape.model_copy(
                        update={"outcome": "cancelled", "error_code": "cancelled"}
                    ),
                )
            return
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

    async def _write(self, reasoning: str) -> _Written | None:
        rec = self._ctx.recorder
        request = ModelRequest(messages=self._messages(reasoning), purpose="utility")
        started = time.perf_counter()
        model, provider, rung = self._utility.model, self._utility.provider, 0
        text: list[str] = []

        def shape(outcome: CallOutcome, usage: Usage, code: str | None = None) -> CallShape:
            return CallShape(
                provider=provider,
                model=model,
                family=self._utility.name,
                rung=rung,
                latency_ms=(time.perf_counter() - started) * 1000,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cached_tokens=usage.cached_tokens,
                cost_usd=usage.cost_usd,
                outcome=outcome,
                error_code=code,
            )

        chat = otel.chat(rec, self._stage, self._utility.name, request)
        try:
            async with closing_stream(self._utility.stream(request)) as chunks:
                async for chunk in chunks:
                    chat.saw(chunk)
                    rec.last_activity = rec.clock.monotonic()  # restarts the idle window
                    match chunk:
                        case RungStarted():
                            model, provider, rung = chunk.model, chunk.provider, chunk.rung
                            text.clear()
                        case TextDelta(text=piece):
                            text.append(piece)
                        case Finish(usage=usage, stop_reason=stop):
                            summary = "".join(text).strip()
                            if usage == Usage() and summary:  # a client that reports none
                                usage = Usage(
                                    input_tokens=prompt_tokens(request),
                                    output_tokens=text_tokens(summary),
                                )
                            chat.answered(
                                ModelResponse(
                                    text=summary,
                                    thinking="",
                                    tool_calls=(),
                                    stop_reason=stop,
                                    usage=usage,
                                )
                            )
                            return _Written(
                                summary=summary,
                                shape=shape("ok", usage),
                                reasoning_chars=len(reasoning),
                            )
                        case _:
                            pass
        except asyncio.CancelledError:
            rec.audit(self._stage, call=shape("cancelled", Usage(), "cancelled"))
            raise
        except Exception as exc:  # noqa: BLE001 - a missing summary never fails the turn
            chat.failed(exc)
            code = exc.code if isinstance(exc, TurnkitError) else "internal-error"
            log.warning("the thinking summary failed: %s", exc)
            rec.audit(self._stage, call=shape("error", Usage(), code))
        finally:
            chat.close()
        return None

    def _messages(self, reasoning: str) -> tuple[ModelMessage, ...]:
        rec = self._ctx.recorder
        tools = ", ".join(name for name, _ in rec.notes.tool_timings) or "none"
        return (
            ModelMessage(role="system", content=SUMMARY_PROMPT),
            ModelMessage(
                role="user",
                content=(
                    f"Request: {rec.notes.request_text}\nTools used: {tools}\nNotes:\n{reasoning}"
                ),
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
