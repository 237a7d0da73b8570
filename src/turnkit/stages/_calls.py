"""One model call, streamed: deltas out, cascade steps audited, the response assembled."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnkit import otel
from turnkit.audit import AuditPayloads, CallShape, FallbackStepPayload, ProviderCascadePayload
from turnkit.errors import (
    ErrorCode,
    FamilyExhaustedError,
    GuardrailBlockedError,
    OutputLimitExceededError,
    PluginFailedError,
    ProviderError,
    TurnkitError,
    typed_message,
)
from turnkit.events import (
    ProviderCascadeEvent,
    ToolDeltaEvent,
)
from turnkit.ids import AuditStageId, StageId, derive_id, event_stage
from turnkit.models import (
    Finish,
    ModelRequest,
    ModelResponse,
    RungFailed,
    RungStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallPart,
    Usage,
    closing_stream,
)
from turnkit.models.family import ModelFamily
from turnkit.stages._budget import (
    price_per_token,
    prompt_tokens,
    take_budget_answers,
    text_tokens,
)
from turnkit.stages._plugins import answer_hold, guard
from turnkit.stages._types import StageContext
from turnkit.telemetry import OpenCall, Recorder

__all__ = ("CallResult", "call_model")

_TOOL_DELTA_INTERVAL_S = 0.5
_CONTEXT_PURPOSES = frozenset({"tool-loop", "synthesize"})
"""Calls on the turn's own model, whose input plus output is the context's size."""


def _note_context(rec: Recorder, request: ModelRequest, usage: Usage) -> None:
    if request.purpose in _CONTEXT_PURPOSES:
        rec.notes.context_tokens = usage.input_tokens + usage.output_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResult:
    """A finished call: the response, its audit shape, the block id its text streamed under."""

    response: ModelResponse
    shape: CallShape
    block_id: str
    cascade: ProviderCascadePayload | None


class _Assembler:
    def __init__(self) -> None:
        self.text: list[str] = []
        """The text as shown (after the answer guardrails)."""
        self.raw: list[str] = []
        """The text as the model wrote it (without answer guardrails)."""
        self.raw_text = ""
        """With answer guardrails: the text as the model wrote it, as one string."""
        self.shown_text = ""
        """With answer guardrails: `text` as one string (they read both on every chunk:
        one string each grows by a copy, where joining thousands of pieces costs far more)."""
        self.held = False
        """A plugin's `answer_hold` failed: the rest of the block waits for its end."""
        self.failed_checks: set[str] = set()
        """Plugins whose `check_answer` failure on this block is logged and audited (once)."""
        self.thinking: list[str] = []
        self.calls: dict[int, list[str]] = {}
        self.ids: dict[int, str] = {}
        self.names: dict[int, str] = {}
        self.sent: dict[int, int] = {}
        """Argument characters already reported per call (for throttled `tool.delta`)."""
        self.moved: dict[int, int] = {}
        """A streamed index a second call id reused, and the slot its pieces go to now."""

    def slot(self, index: int, tool_call_id: str | None) -> int:
        """Where a tool-call piece goes: its own index, unless that holds another call.

        Servers that send no `index` (each call whole in its own chunk, as some
        OpenAI-compatible endpoints do) give every call position 0; a piece that names a
        new call id at an index already holding another call starts a call of its own
        instead of being joined to it.
        """
        slot = self.moved.get(index, index)
        known = self.ids.get(slot)
        if tool_call_id and known and tool_call_id != known:
            slot = max([*self.calls, *self.moved.values()]) + 1
            self.moved[index] = slot
        return slot

    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple(
            ToolCallPart(
                tool_call_id=self.ids.get(i) or f"call_{i}",
                name=self.names.get(i, ""),
                arguments="".join(parts),
            )
            for i, parts in sorted(self.calls.items())
        )


async def call_model(
    ctx: StageContext,
    audited_as: AuditStageId,
    family: ModelFamily,
    request: ModelRequest,
    *,
    block_key: str,
    stream_text: bool = True,
    on_answer: Callable[[str], None] | None = None,
    answer_after_chars: int = 0,
    reserve: bool = True,
    call_id: Callable[[str], str] = str,
) -> CallResult:
    """Run one call on `family`, streaming deltas and auditing failed rungs.

    The caller stages the call's own audit row (it knows the payloads). Durable events
    staged before the call are committed first: nothing waits on a provider unwritten.
    Raw reasoning is kept inside the runtime (never streamed); `stream_text=False` keeps
    the text in too (anchor-plan's planning output is not prose for the user).
    `on_answer` is called once the call has written `answer_after_chars` characters of
    text and no tool call (its answer is under way), with the reasoning it streamed.
    With budgets enforced the call first reserves what it may cost, and pauses the turn
    when a limit has no room (`reserve=False`: the caller checked already). `call_id`:
    the id a tool call's `tool.delta` goes out under, given the model's (the one the
    caller will give the call). Where no tool can be called (`tool_choice="none"`), a call
    the model names anyway is assembled for the audit but never shown (a client would draw
    it as a call being written, never finished).
    """
    rec = ctx.recorder
    stage_id = event_stage(audited_as)  # what its events (if any) name
    await _ready(ctx, stage_id, request, block_key, reserve=reserve)
    attempts: list[str] = []
    price = price_per_token(rec.usage)
    block_id = derive_id("blk", rec.turn_id, block_key, 0)
    on = _Rung(family.model, family.provider, 0, block_id, price, family.rungs[0])
    last_tool_delta: dict[int, float] = {}
    shown = request.tool_choice != "none"  # a call no tool can answer is never drawn
    rec.open_call = on.open_call(stage_id, family.name, stream_text, request)
    chat = otel.chat(rec, audited_as, family.name, request)
    # Closed explicitly: the call returns at `Finish`, and a stream left to the garbage
    # collector keeps its provider connection open until then.
    try:
        async with closing_stream(family.stream(request)) as stream:
            async for chunk in stream:
                chat.saw(chunk)
                rec.last_activity = rec.clock.monotonic()  # any chunk restarts the idle window
                match chunk:
                    case TextDelta(text=text) if text:
                        asm = on.asm
                        text = await _shown_delta(ctx, stage_id, asm, text, stream_text)
                        asm.text.append(text)
                        on_answer = _answer_check(asm, on_answer, answer_after_chars)
                        if stream_text and text:
                            await rec.delta(stage_id, on.block_id, text)
                    case ThinkingDelta(text=text) if text:
                        on.asm.thinking.append(text)  # raw chain-of-thought stays inside
                    case ToolCallDelta():
                        await _tool_delta(
                            ctx, stage_id, on.asm, chunk, last_tool_delta, call_id, shown
                        )
                    case RungStarted():
                        attempts.append(chunk.model)
                        block_id = derive_id("blk", rec.turn_id, block_key, len(attempts) - 1)
                        client = family.rungs[chunk.rung]
                        on = _Rung(chunk.model, chunk.provider, chunk.rung, block_id, price, client)
                        rec.open_call = on.open_call(stage_id, family.name, stream_text, request)
                    case RungFailed():
                        _audit_failed_rung(ctx, audited_as, family, chunk, attempts)
                    case Finish():
                        finish = _counted(chunk, on, request)
                        if rec.open_call is not None:  # cut while its answer is checked:
                            rec.open_call.usage = finish.usage  # it cost what it reported
                        result = await _finished(
                            ctx, stage_id, family, on, finish, attempts, stream_text
                        )
                        rec.open_call = None
                        _note_context(rec, request, finish.usage)
                        chat.answered(result.response)
                        return result
                    case _:
                        pass
    except FamilyExhaustedError:
        rec.open_call = None  # every rung already left its own row
        raise
    except Exception as exc:
        # One audit row per model call, however it ended.
        code = exc.code if isinstance(exc, TurnkitError) else "internal-error"
        chat.failed(exc)
        spent = _billed(rec, on, request, exc)
        shape = on.shape(family.name, outcome="error", error_code=code, **spent)
        rec.audit(audited_as, call=shape)
        rec.open_call = None
        raise
    finally:
        chat.close()
    raise AssertionError("a family's stream ends with a Finish or raises")  # pragma: no cover


UTILITY_OUTAGES = (FamilyExhaustedError, ProviderError)
"""How a utility call (a plan, a summary) fails when the turn goes on without its help."""


_CUT_BY_THE_TURN = (GuardrailBlockedError, OutputLimitExceededError, PluginFailedError)
"""What the turn itself raises to stop a call mid-stream: the provider still billed it."""


def _billed(rec: Recorder, on: _Rung, request: ModelRequest, exc: Exception) -> dict[str, Any]:
    """What a failed call's row bills.

    What the provider reported if the call finished (its answer's check refused it),
    else an estimate if the turn cut it short, else nothing.
    """
    call = rec.open_call
    if call is not None and call.usage is not None:
        return call.billed()
    return on.spent(request) if isinstance(exc, _CUT_BY_THE_TURN) else {}


class _Rung:
    """The rung a call is on: what it has streamed so far, under which block, since when."""

    __slots__ = ("asm", "block_id", "client", "model", "price", "provider", "rung", "started")

    def __init__(
        self,
        model: str,
        provider: str,
        rung: int,
        block_id: str,
        price: float = 0.0,
        client: object = None,
    ) -> None:
        self.model, self.provider, self.rung, self.block_id = model, provider, rung, block_id
        self.price = price  # per token, as the turn's calls so far paid: prices an estimate
        self.client = client  # the rung's model client: its list price, if litellm has one
        self.asm = _Assembler()
        self.started = time.perf_counter()

    def open_call(
        self, stage_id: StageId, family: str, stream_text: bool, request: ModelRequest
    ) -> OpenCall:
        """What an abort would audit of the call on this rung."""
        return OpenCall(
            stage_id,
            family,
            self.model,
            self.provider,
            self.rung,
            self.started,
            self.block_id,
            _shown(self.asm, stream_text),
            estimate=lambda: self.spent(request),
        )

    def spent(self, request: ModelRequest) -> dict[str, Any]:
        """What a call the turn itself cut short (a guardrail's block, say) cost, estimated.

        The provider reports no usage for a stream stopped before its end, yet it read the
        request and wrote what streamed: budgets count the estimate, as for a Stop, priced
        at its model's list price, else at what the turn's earlier calls paid per token.
        """
        asm = self.asm
        written = asm.raw_text or "".join(asm.raw) or "".join(asm.text)
        written += "".join(asm.thinking) + "".join("".join(p) for p in asm.calls.values())
        tokens_in, tokens_out = prompt_tokens(request), text_tokens(written)
        from turnkit.models.litellm import list_price_of  # only for a call cut short

        price_in, price_out = list_price_of(self.client) or (self.price, self.price)
        cost = tokens_in * price_in + tokens_out * price_out
        return {"input_tokens": tokens_in, "output_tokens": tokens_out, "cost_usd": cost}

    def shape(self, family: str, **outcome: Any) -> CallShape:
        """The call's shape on this rung, timed from the rung's start."""
        return CallShape(
            provider=self.provider,
            model=self.model,
            family=family,
            rung=self.rung,
            latency_ms=(time.perf_counter() - self.started) * 1000,
            **outcome,
        )


def _counted(finish: Finish, on: _Rung, request: ModelRequest) -> Finish:
    """`finish`, its usage estimated when a client reported none for what it streamed.

    A hand-written `ModelClient` that leaves `Usage()` at zero would make the call free
    for budgets; its tokens are estimated (and priced) as for a call cut short.
    """
    if finish.usage != Usage():
        return finish
    asm = on.asm
    if not (asm.text or asm.raw or asm.raw_text or asm.thinking or asm.calls):
        return finish
    return dataclasses.replace(finish, usage=Usage(**on.spent(request)))


async def _finished(
    ctx: StageContext,
    stage_id: StageId,
    family: ModelFamily,
    on: _Rung,
    finish: Finish,
    attempts: list[str],
    stream_text: bool,
) -> CallResult:
    """The response a rung's stream assembled, past the answer guardrails, and its shape.

    `attempts`: the models the family's cascade tried, when it tried more than one.
    """
    asm, usage = on.asm, finish.usage
    response = ModelResponse(
        text=await _guarded(ctx, stage_id, on, stream_text),
        thinking="".join(asm.thinking),
        tool_calls=asm.tool_calls(),
        stop_reason=finish.stop_reason,
        usage=usage,
        refusal=finish.refusal,
    )
    shape = on.shape(
        family.name,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        cost_usd=usage.cost_usd,
        outcome="ok",
    )
    cascade = (
        ProviderCascadePayload(family=family.name, attempts=tuple(attempts), answered_rung=on.rung)
        if len(attempts) > 1
        else None
    )
    return CallResult(response=response, shape=shape, block_id=on.block_id, cascade=cascade)


async def _shown_delta(
    ctx: StageContext, stage_id: StageId, asm: _Assembler, chunk: str, streamed: bool
) -> str:
    """What goes out of a chunk after the answer guardrails saw the text so far.

    The end the plugins' `answer_hold` names waits for more text. A redaction that
    reaches into text already shown holds the chunk back (the whole block, redacted,
    still arrives in `message.complete`); a block stops the turn here.
    """
    if not streamed or not ctx.plugins:
        asm.raw.append(chunk)
        return chunk
    asm.raw_text += chunk
    if asm.held:
        return ""
    raw = asm.raw_text
    hold = answer_hold(ctx, stage_id, raw)
    if hold is None:
        asm.held = True
        return ""
    settled = raw[: len(raw) - min(hold, len(raw))] if hold else raw
    if not settled:
        return ""
    checked = await guard(
        ctx, stage_id, "answer", settled, subject="text", recorded=asm.failed_checks
    )
    shown = asm.shown_text
    if not checked.startswith(shown):
        return ""
    asm.shown_text = checked
    return checked[len(shown) :]


async def _guarded(ctx: StageContext, stage_id: StageId, on: _Rung, streamed: bool) -> str:
    """The block's whole text, after the answer guardrails when it was shown.

    What the guardrails held back while the block streamed (`answer_hold`) goes out now,
    as the block's last delta, so its deltas add up to its text; unless a redaction
    reached into text already shown, which only `message.complete` can correct.
    """
    asm = on.asm
    if not streamed or not ctx.plugins:
        return "".join(asm.raw)
    text = asm.raw_text
    if not text:
        return text
    checked = await guard(ctx, stage_id, "answer", text, subject="text", recorded=asm.failed_checks)
    shown = asm.shown_text
    if len(checked) > len(shown) and checked.startswith(shown):
        rest = checked[len(shown) :]
        asm.text.append(rest)
        asm.shown_text = checked
        await ctx.recorder.delta(stage_id, on.block_id, rest)
    return checked


async def _ready(
    ctx: StageContext, stage_id: StageId, request: ModelRequest, key: str, *, reserve: bool
) -> None:
    """Commit what came before the call, then reserve its budget (it may pause here).

    The call does not wait for that commit: what it streams does (write before send).
    """
    await ctx.recorder.flush_ahead()
    if not reserve:
        return
    answered = take_budget_answers(ctx, stage_id, key)  # also when budgets are off by now
    if ctx.budget is not None:
        # The spend of the call before is in that commit: the reservation must see it, or
        # a call that follows another at once could pass a limit the first one reached.
        await ctx.recorder.join_ahead()
        await ctx.budget.reserve(ctx, stage_id, request, key=key, answered=answered)


def _shown(asm: _Assembler, streamed: bool) -> list[str]:
    """The text the person has seen of this call (none when its text is not streamed)."""
    return asm.text if streamed else []


def _answer_check(
    asm: _Assembler, on_answer: Callable[[str], None] | None, after_chars: int
) -> Callable[[str], None] | None:
    """Call `on_answer` once enough text and no tool call arrived; what is left to call.

    It gets the reasoning the call has streamed so far.
    """
    if on_answer is None or sum(map(len, asm.text)) < after_chars:
        return on_answer
    if not asm.calls:
        on_answer("".join(asm.thinking))
    return None


async def _tool_delta(
    ctx: StageContext,
    stage_id: StageId,
    asm: _Assembler,
    chunk: ToolCallDelta,
    last: dict[int, float],
    call_id: Callable[[str], str],
    shown: bool,
) -> None:
    index = asm.slot(chunk.index, chunk.tool_call_id)
    parts = asm.calls.setdefault(index, [])
    parts.append(chunk.arguments)
    if chunk.tool_call_id:
        asm.ids[index] = chunk.tool_call_id
    if chunk.name:
        asm.names[index] = chunk.name
    if not shown:
        return
    now = ctx.recorder.clock.monotonic()
    if now - last.get(index, -1e9) < _TOOL_DELTA_INTERVAL_S:
        return  # at most twice a second per open call: a client redraws, not a feed
    last[index] = now
    written = "".join(parts)
    start = asm.sent.get(index, 0)
    asm.sent[index] = len(written)
    await ctx.recorder.ephemeral(
        ToolDeltaEvent,
        stage_id,
        tool_call_id=call_id(asm.ids.get(index, f"call_{index}")),
        tool_name=asm.names.get(index),
        arguments_delta=written[start:],  # everything since the last report
        chars=len(written),
    )


def _rung_code(error: BaseException) -> ErrorCode:
    """The code of a rung's own failure (`model-unreachable`, …) when the family walked on."""
    return error.code if isinstance(error, TurnkitError) else "provider-error"


def _audit_failed_rung(
    ctx: StageContext,
    audited_as: AuditStageId,
    family: ModelFamily,
    failed: RungFailed,
    attempts: list[str],
) -> None:
    error = failed.error
    status = error.status_code if isinstance(error, ProviderError) else None
    message = error.message if isinstance(error, TurnkitError) else str(error)
    if failed.next_rung is not None and isinstance(error, ProviderError) and error.brief:
        message = error.brief  # without "give a fallback model": the family has one, and used it
    reason = typed_message(error, message)
    step = FallbackStepPayload(
        from_rung=failed.rung,
        from_model=failed.model,
        to_rung=failed.next_rung,
        to_model=failed.next_model,
        reason=reason,
        status_code=status,
    )
    exhausted = failed.next_rung is None
    ctx.recorder.audit(
        audited_as,
        call=CallShape(
            provider=failed.provider,
            model=failed.model,
            family=family.name,
            rung=failed.rung,
            latency_ms=failed.latency_ms,
            outcome="error",
            error_code="family-exhausted" if exhausted else _rung_code(error),
        ),
        payloads=AuditPayloads(
            fallbackStep=step,
            providerCascade=ProviderCascadePayload(
                family=family.name, attempts=tuple(attempts), answered_rung=None
            )
            if exhausted
            else None,
        ),
    )
    ctx.recorder.durable(
        ProviderCascadeEvent,
        event_stage(audited_as),
        family=family.name,
        from_rung=failed.rung,
        from_model=failed.model,
        to_rung=failed.next_rung,
        to_model=failed.next_model,
        reason=reason,
        status_code=status,
    )
