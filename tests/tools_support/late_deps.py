"""A tools module that imports its deps type for type checking only (as ruff's TC rules
ask for): the tool must still build."""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit import ToolContext, tool

if TYPE_CHECKING:
    from tests.test_tool_deps import AppDeps


@tool
async def tenant_of(ticket: int, ctx: ToolContext[AppDeps]) -> str:
    """The tenant a ticket belongs to."""
    return f"ticket {ticket} of {ctx.deps.tenant}"


@tool
async def tenant_or_none(ticket: int, ctx: ToolContext[AppDeps] | None = None) -> str:
    """The tenant a ticket belongs to (the context is optional)."""
    return f"ticket {ticket} of {ctx.deps.tenant if ctx else '?'}"
