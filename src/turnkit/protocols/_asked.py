"""What the agents a turn asked as tools spent, as both protocols' usage objects carry it."""

from __future__ import annotations

from pydantic import JsonValue

from turnkit.events import AskedUsage

__all__ = ("asked_usage",)


def asked_usage(asked: AskedUsage) -> dict[str, JsonValue]:
    """`asked` in the camelCase of the usage object beside it (every count, zeros too)."""
    return {
        "turns": asked.turns,
        "modelCalls": asked.model_calls,
        "inputTokens": asked.input_tokens,
        "outputTokens": asked.output_tokens,
        "cachedTokens": asked.cached_tokens,
        "costUsd": asked.cost_usd,
    }
