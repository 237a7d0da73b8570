"""The `Tool` port, below `ToolClass` (a tool made of tools) and the package's registry."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from turnkit.models import ToolSpec
from turnkit.tools._context import ToolContext

__all__ = ("ReconcileMisfitError", "Tool", "ask_reconcile")


@runtime_checkable
class Tool(Protocol):
    """Something the model can call.

    `invoke` validates `arguments` (raising `ToolArgumentsError` when they do not fit),
    runs, and returns a JSON value. Any other exception is a failed call the model reads;
    cancellation propagates.
    """

    @property
    def name(self) -> str:
        """The name the model calls."""
        ...

    def spec(self) -> ToolSpec:
        """Name, description and argument schema as offered to the model."""
        ...

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        """Run the tool."""
        ...


class ReconcileMisfitError(Exception):
    """A tool's reconcile hook answered in a shape turnkit cannot read.

    Not knowing whether the call took effect, the call fails rather than running again.
    """


async def ask_reconcile(
    hook: Any, name: str, arguments: Mapping[str, JsonValue], ctx: ToolContext
) -> tuple[bool, JsonValue]:
    """Ask a tool's `reconcile(arguments, ctx)` whether its call took effect.

    It returns `(True, result)` or `(False, anything)`; a plain function is awaited only
    when it returns an awaitable. Any other answer raises `ReconcileMisfitError`: a
    two-key dict must not pass for `(applied, result)`.
    """
    answered = hook(arguments, ctx)
    if inspect.isawaitable(answered):
        answered = await answered
    if isinstance(answered, tuple) and len(answered) == 2 and isinstance(answered[0], bool):
        applied, output = answered
        return applied, output
    raise ReconcileMisfitError(
        f"the reconcile hook of {name!r} returned {type(answered).__name__} "
        f"{_brief(answered)}: a Tool's reconcile(arguments, ctx) returns (True, result) when "
        "the call took effect, else (False, None) (the @tool(reconcile=...) hook's shape "
        "is another: (idempotency_key, arguments) -> result or NOT_APPLIED)"
    )


def _brief(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."
