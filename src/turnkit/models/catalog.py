"""What turnkit needs to know about a model: context window, output limit, reasoning.

Facts come from litellm's bundled model map (imported lazily, offline); a model litellm
does not know gets conservative defaults instead of an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal

from turnkit.models._loader import load_litellm

__all__ = ("DEFAULT_FACTS", "ModelFacts", "list_price", "model_facts", "thinking_budget")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFacts:
    """Limits and abilities of one model."""

    context_window: int
    """Input tokens the model accepts."""
    max_output_tokens: int
    """Tokens the model can produce in one call (reasoning included)."""
    supports_reasoning: bool
    """Whether the model takes a thinking budget or a reasoning effort."""


DEFAULT_FACTS: Final = ModelFacts(
    context_window=128_000, max_output_tokens=4_096, supports_reasoning=False
)
"""Used for models litellm does not know: small enough to be safe for any modern model."""

_BUDGETS: Final[dict[str, int]] = {"off": 0, "low": 1024, "medium": 4096, "high": 16384}
_MIN_BUDGET: Final = 1024


def _positive_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


@lru_cache(maxsize=512)
def model_facts(model: str) -> ModelFacts:
    """Facts about `model` from litellm's model map, or `DEFAULT_FACTS` if it is unknown.

    Args:
        model: A litellm model string, e.g. `"openai/gpt-4o"`.

    Returns:
        The model's facts; missing fields fall back to the defaults one by one.
    """
    litellm = load_litellm()
    try:
        info = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001 - litellm raises plain errors for unmapped models
        return DEFAULT_FACTS
    if not isinstance(info, Mapping):
        return DEFAULT_FACTS
    get = info.get
    context_window = _positive_int(get("max_input_tokens")) or _positive_int(get("max_tokens"))
    max_output = _positive_int(get("max_output_tokens")) or _positive_int(get("max_tokens"))
    return ModelFacts(
        context_window=context_window or DEFAULT_FACTS.context_window,
        max_output_tokens=max_output or DEFAULT_FACTS.max_output_tokens,
        supports_reasoning=get("supports_reasoning") is True,
    )


def list_price(model: str, provider: str | None = None) -> tuple[float, float]:
    """`(input, output)` USD per token from litellm's price map; `(0.0, 0.0)` if unpriced.

    Not cached: `litellm.register_model` may give a model its price after a first lookup.
    """
    litellm = load_litellm()
    info: object = None
    for kwargs in ({"custom_llm_provider": provider}, {}):
        try:
            info = litellm.get_model_info(model=model, **kwargs)
            break
        except Exception:  # noqa: BLE001 - litellm raises plain errors for unmapped models
            continue
    if not isinstance(info, Mapping):
        return (0.0, 0.0)

    def price(name: str) -> float:
        value = info.get(name)
        return float(value) if isinstance(value, int | float) and value > 0 else 0.0

    return (price("input_cost_per_token"), price("output_cost_per_token"))


def thinking_budget(effort: Literal["off", "low", "medium", "high"], facts: ModelFacts) -> int:
    """Reasoning tokens to allow for `effort` on a model with `facts`.

    The levels are off/low/medium/high = 0/1024/4096/16384 tokens. A model without
    reasoning gets 0. Reasoning shares the output limit with the answer, so the budget is
    capped at half of `facts.max_output_tokens` (the answer keeps the other half), which
    keeps it strictly below the limit; if that cap is under 1024 tokens, the smallest
    budget providers accept, the result is 0 (reasoning off).

    Args:
        effort: The agent's reasoning effort.
        facts: The model's facts, e.g. from `model_facts`.

    Returns:
        The thinking budget in tokens; 0 means reasoning off.
    """
    budget = _BUDGETS[effort]
    if budget == 0 or not facts.supports_reasoning:
        return 0
    budget = min(budget, facts.max_output_tokens // 2)
    return budget if budget >= _MIN_BUDGET else 0
