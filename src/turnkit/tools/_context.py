from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic

from pydantic import JsonValue
from typing_extensions import TypeVar

from turnkit.audit import AskedTurnPayload
from turnkit.ids import SessionId, ToolCallId, TurnId
from turnkit.tenancy import Principal

__all__ = ("AskAgent", "DepsT", "ToolContext")

DepsT = TypeVar("DepsT", default=Any)
"""The type of the app's dependencies a tool receives (`ToolContext[MyDeps]`)."""


AskAgent = Callable[[Any, str, "ToolContext[Any]"], Awaitable[JsonValue]]
"""How a runtime runs an agent offered as a tool: `(agent, message, ctx) -> answer`."""


async def _ignore_progress(progress: float | None, message: str | None) -> None:
    return None


async def _ignore_pivot(from_tool: str, to_tool: str | None, reason: str) -> None:
    return None


def _ignore_answered(member: str) -> None:
    return None


def _ignore_asked_spent(spent: AskedTurnPayload) -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext(Generic[DepsT]):
    """What a running tool knows about its call. Declare a `ToolContext` parameter to get it.

    Attributes:
        session_id: The session the turn belongs to.
        turn_id: The turn making the call.
        tool_call_id: The model's id for this call.
        idempotency_key: Stable across retries and recovery of the same call: a tool that
            honours it has its effect exactly once.
        principal: Who sent the message: its id (None: anonymous).
        caller: Who sent the message, whole: id, organisation, department and roles, as
            pinned with the turn (None: anonymous). Ids are unique only within an
            organisation: a multi-tenant tool tells tenants apart by `caller`.
        deps: The app's dependencies for this turn (a pool, a client, permissions), as
            given with the message in this process, else built by the runtime's `deps`
            factory: after a pause, a restart or on a worker they are built again, never
            read back from the store. None when the app supplies none; a tool that
            declares `ToolContext[Deps]` with a class for `Deps` is then not run (its call
            fails saying the turn has no deps).
        callback_token: A token naming only this turn, for work the tool hands to another
            process (a job runner, a remote tool) to report back with
            (`SessionRuntime.report_job_progress`, `POST /turns/{id}/callback`). None when
            the runtime has no `callback_secret`.
        knowledge: The knowledge base ids of the turn's agent (`Agent.knowledge`, as
            pinned with the turn), for a search tool to search in; never sent to the model.
        memory: Whether the turn's agent may keep facts across sessions (`Agent.memory`),
            for a memory tool to honour.
    """

    session_id: SessionId
    turn_id: TurnId
    tool_call_id: ToolCallId
    idempotency_key: str
    principal: str | None = None
    caller: Principal | None = None
    deps: DepsT = None  # type: ignore[assignment]
    callback_token: str | None = field(default=None, repr=False)
    knowledge: tuple[str, ...] = ()
    memory: bool = False
    _progress: Callable[[float | None, str | None], Awaitable[None]] = field(
        default=_ignore_progress, repr=False
    )
    _pivot: Callable[[str, str | None, str], Awaitable[None]] = field(
        default=_ignore_pivot, repr=False
    )
    _ask_agent: AskAgent | None = field(default=None, repr=False)
    _answered: Callable[[str], None] = field(default=_ignore_answered, repr=False)
    _asked_spent: Callable[[AskedTurnPayload], None] = field(
        default=_ignore_asked_spent, repr=False
    )

    async def report_progress(
        self, progress: float | None = None, message: str | None = None
    ) -> None:
        """Report progress of a long-running call.

        The first report turns the call into a job: clients see `job.dispatched`, then a
        `job.progress` per report and `job.completed` when the tool returns.

        Args:
            progress: Fraction done, from 0.0 to 1.0, if known.
            message: A short human-readable status.
        """
        if progress is not None and not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress must be between 0.0 and 1.0, got {progress!r}")
        await self._progress(progress, message)

    async def report_pivot(self, from_tool: str, to_tool: str | None, reason: str) -> None:
        """Record that a tool cascade moved from one in-class tool to the next."""
        await self._pivot(from_tool, to_tool, reason)
