"""One call on the utility (background) model, streamed to its text beside the turn's own.

The thinking summary and the session's name use it: neither streams to the reader nor
goes through `call_model` (their calls run while the turn's own call may be open). A failed
call leaves an `error` audit row and answers None; a cancelled one leaves a `cancelled`
row and is cancelled; an answered call's row is its caller's to write (it knows the
payload).
"""

from __future__ import annotations

import asyncio
import logging
import time

from turnkit import otel
from turnkit.audit import CallOutcome, CallShape
from turnkit.errors import TurnkitError
from turnkit.ids import StageId
from turnkit.models import (
    Finish,
    ModelRequest,
    ModelResponse,
    RungStarted,
    TextDelta,
    Usage,
    closing_stream,
)
from turnkit.models.family import ModelFamily
from turnkit.stages._types import StageContext

__all__ = ("utility_text",)

log = logging.getLogger("turnkit.utility")


async def utility_text(
    ctx: StageContext, stage: StageId, utility: ModelFamily, request: ModelRequest, what: str
) -> tuple[str, CallShape] | None:
    """The call's stripped text and shape; None (its row audited) if it failed.

    `what` names the call in the warning a failure logs.
    """
    rec = ctx.recorder
    started = time.perf_counter()
    model, provider, rung = utility.model, utility.provider, 0
    text: list[str] = []

    def shape(outcome: CallOutcome, usage: Usage, code: str | None = None) -> CallShape:
        return CallShape(
            provider=provider,
            model=model,
            family=utility.name,
            rung=rung,
            latency_ms=(time.perf_counter() - started) * 1000,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cached_tokens,
            cost_usd=usage.cost_usd,
            outcome=outcome,
            error_code=code,
        )

    chat = otel.chat(rec, stage, utility.name, request)
    try:
        async with closing_stream(utility.stream(request)) as chunks:
            async for chunk in chunks:
                chat.saw(chunk)
                rec.last_activity = rec.clock.monotonic()  # any chunk restarts the idle window
                match chunk:
                    case RungStarted():
                        model, provider, rung = chunk.model, chunk.provider, chunk.rung
                        text.clear()
                    case TextDelta(text=piece):
                        text.append(piece)
                    case Finish(usage=usage, stop_reason=stop):
                        answer = "".join(text).strip()
                        response = ModelResponse(
                            text=answer, thinking="", tool_calls=(), stop_reason=stop, usage=usage
                        )
                        chat.answered(response)
                        return answer, shape("ok", usage)
                    case _:
                        pass
    except asyncio.CancelledError:
        rec.audit(stage, call=shape("cancelled", Usage(), "cancelled"))
        raise
    except Exception as exc:  # noqa: BLE001 - a utility call never fails the turn
        chat.failed(exc)
        code = exc.code if isinstance(exc, TurnkitError) else "internal-error"
        log.warning("%s failed: %s", what, exc)
        rec.audit(stage, call=shape("error", Usage(), code))
    finally:
        chat.close()
    return None
