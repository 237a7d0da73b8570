"""Budgets: limits in USD and tokens per period.

A limit applies to an organisation, a department, a principal or a session.

Limits live in the store, so an administrator can raise one from any process. A turn spends
against every limit that covers it (its organisation's, its department's, its principal's
and its session's); each model call first reserves what it may cost, and the check and the
reservation are one transaction, so turns running at once cannot overspend together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnkit.tenancy import DEFAULT_ORGANISATION, NAME_PATTERN

__all__ = (
    "BudgetLimit",
    "BudgetPeriod",
    "BudgetScope",
    "BudgetSubject",
    "BudgetUse",
    "period_start",
)

BudgetScope = Literal["organisation", "department", "principal", "session"]
BudgetPeriod = Literal["day", "month", "total"]
SCOPES: tuple[BudgetScope, ...] = ("organisation", "department", "principal", "session")


_MAX_TOKENS = 2**62
"""The largest token limit (a 64-bit column holds it and what is spent against it)."""


class BudgetLimit(BaseModel):
    """A limit on what one scope may spend per period (UTC days or months, or in total).

    `key` names the scope's member: the department, the principal id or the session id;
    for the organisation scope it is the organisation's name (and may be left out).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: BudgetScope
    organisation: str = Field(default=DEFAULT_ORGANISATION, pattern=NAME_PATTERN)
    key: str = Field(default="", max_length=256)  # the widths of their columns
    period: BudgetPeriod = "month"
    usd: float | None = Field(default=None, ge=0, le=1e12, allow_inf_nan=False)
    tokens: int | None = Field(default=None, ge=0, le=_MAX_TOKENS)

    @model_validator(mode="after")
    def _names_a_limit(self) -> BudgetLimit:
        if self.usd is None and self.tokens is None:
            raise ValueError("a budget limit needs `usd`, `tokens` or both")
        if self.scope == "organisation":
            if self.key not in ("", self.organisation):
                raise ValueError("an organisation limit's key is the organisation's name")
            object.__setattr__(self, "key", self.organisation)
        elif not self.key:
            raise ValueError(f"a {self.scope} limit needs a `key` (which {self.scope})")
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetSubject:
    """Who a turn spends for: the scopes its usage counts against."""

    organisation: str
    department: str
    principal: str | None
    session_id: str

    def key(self, scope: BudgetScope) -> str | None:
        """This subject's member of `scope` (None: an anonymous principal)."""
        return {
            "organisation": self.organisation,
            "department": self.department,
            "principal": self.principal,
            "session": self.session_id,
        }[scope]


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetUse:
    """A limit and what its period has spent and holds reserved so far."""

    limit: BudgetLimit
    spent_usd: float
    spent_tokens: int
    reserved_usd: float = 0.0
    reserved_tokens: int = 0

    def fits(self, usd: float = 0.0, tokens: int = 0) -> bool:
        """Whether spending `usd` and `tokens` more stays within the limit.

        With nothing more to spend, whether the limit still has room at all.
        """
        if self.limit.usd is not None:
            total = self.spent_usd + self.reserved_usd + usd
            if total > self.limit.usd or (usd == 0 and total >= self.limit.usd):
                return False
        if self.limit.tokens is not None:
            total_t = self.spent_tokens + self.reserved_tokens + tokens
            if total_t > self.limit.tokens or (tokens == 0 and total_t >= self.limit.tokens):
                return False
        return True

    def describe(self) -> str:
        """One line: the limit, what its period spent, and what calls in flight hold."""
        parts = []
        if self.limit.usd is not None:
            held = f" (${self.reserved_usd:.4f} more held)" if self.reserved_usd else ""
            parts.append(f"${self.spent_usd:.4f} of ${self.limit.usd:.4f}{held}")
        if self.limit.tokens is not None:
            held = f" ({self.reserved_tokens} more held)" if self.reserved_tokens else ""
            parts.append(f"{self.spent_tokens} of {self.limit.tokens} tokens{held}")
        return (
            f"the {self.limit.scope} budget of {self.limit.key!r} "
            f"({self.limit.period}) has used {' and '.join(parts)}"
        )


def period_start(period: BudgetPeriod, now: datetime) -> datetime | None:
    """When the period containing `now` began (UTC); None for `total`."""
    now = now.astimezone(UTC)
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None
