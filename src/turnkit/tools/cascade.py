"""`ToolClass`: in-class tool fallbacks (a tool cascade); itself a tool."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from turnkit.errors import ConfigurationError, typed_message
from turnkit.models import ToolSpec
from turnkit.tools._context import ToolContext
from turnkit.tools._errors import AskedAgentWaits, ToolArgumentsError
from turnkit.tools._protocol import ReconcileMisfitError, ask_reconcile

if TYPE_CHECKING:
    from turnkit.tools._protocol import Tool

__all__ = ("ToolClass", "validated_arguments")


class ToolClass:
    """Tools that do the same job, tried in order under one name.

    The model sees one tool (named `name`, with the first member's schema). When a member
    raises, the call pivots to the next member with the same arguments, and each pivot is
    recorded (`toolFallbackStep` audit row). Arguments the first member refuses are not
    retried: the arguments, not the tool, are at fault. A later member that refuses them
    (its schema differs) is passed over like a failed one. When every member fails, the
    last member's failure stands, or the last one that ran if later members refused.
    """

    def __init__(self, name: str, tools: Sequence[Tool]) -> None:
        if not tools:
            raise ConfigurationError(f"tool class {name!r} needs at least one tool")
        self._name = name
        self.tools: tuple[Tool, ...] = tuple(tools)
        roles = {role for t in self.leaves() if (role := getattr(t, "approver_role", None))}
        if len(roles) > 1:  # one approval covers whichever member runs: one role decides it
            raise ConfigurationError(
                f"the members of tool class {name!r} name different approver roles "
                f"({', '.join(sorted(roles))}): one approval covers whichever member runs"
            )

    def leaves(self) -> tuple[Tool, ...]:
        """Its members in the order they are tried, a nested class's members in its place."""
        return tuple(
            leaf
            for member in self.tools
            for leaf in (member.leaves() if isinstance(member, ToolClass) else (member,))
        )

    @property
    def name(self) -> str:
        """The name the model calls."""
        return self._name

    def spec(self) -> ToolSpec:
        """The first member's spec, under the class name."""
        first = self.tools[0].spec()
        return ToolSpec(name=self._name, description=first.description, parameters=first.parameters)

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        """Run members in order until one answers."""
        last: Exception | None = None
        for index, member in enumerate(self.tools):
            nxt = self.tools[index + 1].name if index + 1 < len(self.tools) else None
            try:
                output = await member.invoke(arguments, ctx)
            except (asyncio.CancelledError, AskedAgentWaits):
                raise  # an asked agent waiting for a person has not failed
            except ToolArgumentsError as exc:
                if last is None:  # the model's arguments do not fit the tool it was shown
                    raise
                # A fallback with a schema of its own: the failure that brought us here stands.
                await ctx.report_pivot(member.name, nxt, f"it refused the arguments: {exc}")
            except Exception as exc:  # noqa: BLE001 - a failed member is the cascade's trigger
                last = exc
                await ctx.report_pivot(member.name, nxt, typed_message(exc))
            else:
                if not isinstance(member, ToolClass):  # a nested class names its own member
                    ctx._answered(member.name)
                return output
        assert last is not None
        raise last

    async def reconcile(
        self, arguments: Mapping[str, JsonValue], ctx: ToolContext
    ) -> tuple[bool, JsonValue]:
        """Ask each member's reconcile hook, in order, whether the call already took effect.

        Any member may have been the one that ran before the crash, so the first that says
        it did answers; `(False, None)` when none did or none has a hook.
        """
        misfit: ReconcileMisfitError | None = None
        for member in self.tools:
            hook = getattr(member, "reconcile", None)
            if hook is None:
                continue
            try:
                applied, output = await ask_reconcile(hook, member.name, arguments, ctx)
            except ReconcileMisfitError as exc:  # another member may still know it ran
                misfit = misfit or exc
                continue
            if applied:
                return True, output
        if misfit is not None:  # whether that member's call took effect is not known
            raise misfit
        return False, None

    def __repr__(self) -> str:
        return f"ToolClass({self._name!r}, {[t.name for t in self.tools]!r})"


def validated_arguments(tool: Tool, arguments: Mapping[str, JsonValue]) -> Mapping[str, Any]:
    """The arguments as `tool` would run with them: validated and converted (`"80"` → 80).

    A `ToolClass`'s first member decides, as its cascade does (arguments it refuses are
    not retried); a tool that checks none takes them as they are.

    Raises:
        ToolArgumentsError: the tool refuses them.
    """
    first = tool.leaves()[0] if isinstance(tool, ToolClass) else tool
    validate = getattr(first, "validate", None)
    return validate(arguments) if callable(validate) else arguments
