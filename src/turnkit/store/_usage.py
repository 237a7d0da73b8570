"""A line of a usage report."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("UsageLine",)


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageLine:
    """Usage summed over one group (a session, a principal or a day)."""

    key: str
    """The session id, the principal (`""` for none), or the day (`YYYY-MM-DD`, UTC)."""
    turns: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float
