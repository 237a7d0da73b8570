"""How a call ends, the same for both of `LiteLLMClient`'s transports: its `Finish` chunk.

The stop reason comes from the OpenAI finish reason the stream ended with, and the usage
from its usage chunk (litellm's object on litellm's path, a plain dict on the direct one),
priced by litellm's price map. litellm arrives as an argument, as in `_errors`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from types import ModuleType

from turnkit.models import (
    Finish,
    ModelChunk,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    Usage,
)
from turnkit.models._openai_stream import StreamState

__all__ = (
    "call_cost",
    "estimated_usage",
    "field_of",
    "finish",
    "note_output",
    "stop_reason",
    "tokens",
    "usage_of",
)

log = logging.getLogger("turnkit.models")

_UNPRICED: set[tuple[str, str]] = set()
"""Models already reported as missing from litellm's price map (once per process)."""


def finish(litellm: ModuleType, state: StreamState, *, model: str, provider: str) -> Finish:
    """The `Finish` for a stream that has ended; `model` is the bare model litellm resolved.

    A refusal (`StreamState.refused`) ends with `content_filter`, its words apart.
    """
    reason = stop_reason(state.finish_reason, state.saw_tool_call)
    usage = usage_of(litellm, state.usage, model=model, provider=provider)
    if not state.refused():
        return Finish(reason, usage, response_model=state.model)
    words = state.refusal or ""
    return Finish("content_filter", usage, response_model=state.model, refusal=words)


def note_output(written: list[str], piece: ModelChunk) -> None:
    """Keep what a piece wrote, for `estimated_usage`."""
    if isinstance(piece, TextDelta | ThinkingDelta):
        written.append(piece.text)
    elif isinstance(piece, ToolCallDelta):
        written.append(piece.arguments)


def estimated_usage(
    litellm: ModuleType, kwargs: Mapping[str, object], written: list[str]
) -> dict[str, object]:
    """Token counts for a stream that sent no usage, by litellm's counter.

    litellm's path counts such a stream the same way itself, so both transports report
    tokens (and a price) for a server that ignores `stream_options.include_usage`.
    """
    model = str(kwargs["model"])
    try:
        prompt = litellm.token_counter(model=model, messages=kwargs["messages"])
        completion = litellm.token_counter(
            model=model, text="".join(written), count_response_tokens=True
        )
    except Exception:  # noqa: BLE001 - an estimate must never fail the call
        return {}
    return {"prompt_tokens": prompt, "completion_tokens": completion}


def stop_reason(finish_reason: str | None, saw_tool_call: bool) -> StopReason:
    """Map an OpenAI finish reason; a call that streamed tool calls ends in `tool_use`.

    `content_filter` (the provider's filter stopped the output: OpenAI and Azure's own;
    litellm's for Anthropic's `refusal`, Gemini's `SAFETY` and `RECITATION`, Bedrock's
    guardrails) stays `content_filter`, tool calls or not.
    """
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "content_filter":
        return "content_filter"
    if finish_reason in ("tool_calls", "function_call") or saw_tool_call:
        return "tool_use"
    return "end_turn"


def usage_of(litellm: ModuleType, usage: object, *, model: str, provider: str) -> Usage:
    """Tokens and dollar cost from a usage chunk (`Usage()` when the stream sent none)."""
    if usage is None:
        return Usage()
    details = field_of(usage, "prompt_tokens_details")
    input_tokens = tokens(field_of(usage, "prompt_tokens"))
    output_tokens = tokens(field_of(usage, "completion_tokens"))
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=tokens(field_of(details, "cached_tokens")),
        cost_usd=call_cost(
            litellm, usage, input_tokens, output_tokens, model=model, provider=provider
        ),
    )


def call_cost(
    litellm: ModuleType, usage: object, input_tokens: int, output: int, *, model: str, provider: str
) -> float:
    """Dollar cost from litellm's price map; 0.0 when the model has no known price.

    A model missing from the map is logged once per process: its calls count $0 against
    USD budget limits, which therefore never stop it.
    """
    try:
        if isinstance(usage, Mapping):  # the direct transport's usage, as litellm's type
            usage = litellm.Usage(**usage)
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model,
            custom_llm_provider=provider,
            prompt_tokens=input_tokens,
            completion_tokens=output,
            usage_object=usage,
        )
        cost = float(prompt_cost) + float(completion_cost)
    except Exception as exc:  # noqa: BLE001 - an unknown price must never fail the call
        if (provider, model) not in _UNPRICED:
            _UNPRICED.add((provider, model))
            log.warning(
                "model %s/%s has no price in litellm's price map (%s): its calls cost $0, "
                "and USD budget limits never stop it; give it a price with "
                "litellm.register_model (see the budgets guide)",
                provider,
                model,
                type(exc).__name__,
            )
        return 0.0
    return cost if math.isfinite(cost) and cost > 0 else 0.0


def field_of(value: object, name: str) -> object:
    """`value[name]` of a dict, `value.name` of an object (None when missing)."""
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def tokens(value: object) -> int:
    """A token count as sent, 0 when it is missing or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
