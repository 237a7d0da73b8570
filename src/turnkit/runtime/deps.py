"""App dependencies for tools: built per turn by the app's factory, never stored.

`SessionRuntime(deps=factory)` builds them wherever the turn is driven — the process that
started it, a resume after a pause, a worker, crash recovery — from the turn's scope. A
message may hand its own object instead (`execute_message(deps=...)`); that one lives only
in the process it was given to, and other drivers fall back to the factory.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from turnkit.ids import SessionId, TurnId
from turnkit.tenancy import Principal

__all__ = ("NO_DEPS", "DepsFactory", "DepsScope", "build_deps")

NO_DEPS: Any = object()
"""`deps` not given for a drive: build them with the runtime's factory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DepsScope:
    """What a deps factory knows about the turn it builds dependencies for."""

    principal: str | None
    session_id: SessionId
    turn_id: TurnId
    agent: str
    caller: Principal | None = None
    """Who sent the message, whole (organisation, department, roles); None: anonymous."""


DepsFactory = Callable[[DepsScope], Any | Awaitable[Any]]
"""Builds a turn's dependencies (sync or async)."""


async def build_deps(factory: DepsFactory | None, scope: DepsScope) -> Any:
    """The factory's dependencies for `scope` (None without a factory)."""
    if factory is None:
        return None
    built = factory(scope)
    if inspect.isawaitable(built):
        built = await built
    return built
