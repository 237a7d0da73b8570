"""`AgentTool`: an agent another agent calls as a tool (made by `Agent.as_tool`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from pydantic import JsonValue

from turnkit.ids import SessionId
from turnkit.models import ToolSpec
from turnkit.pauses import ApprovalPolicy, check_approval_policy, check_approver_role
from turnkit.tools._context import ToolContext
from turnkit.tools._errors import ToolArgumentsError, ToolResultError
from turnkit.tools._timeout import check_timeout_s, within

__all__ = ("DELEGATED_SESSION_PREFIX", "AgentTool", "AgentToolError", "delegated_session_id")

DELEGATED_SESSION_PREFIX: Final = "tk-sub."
"""How the id of a session an agent asked as a tool answers in begins."""

_MESSAGE_HELP: Final = (
    "What to ask: the task and everything needed for it. The agent sees nothing else of "
    "this conversation."
)


def delegated_session_id(idempotency_key: str, agent: str) -> SessionId:
    """The session `agent` answers a call in, from the call's idempotency key.

    The key is the asking call's (`ToolContext.idempotency_key`, and `idempotency_key` of
    its `tool.started` event, which also names the session: `asked_session_id`): every
    ask of the call lands in the same session.
    """
    digest = hashlib.sha256(f"{idempotency_key}\x00{agent}".encode()).hexdigest()
    return SessionId(DELEGATED_SESSION_PREFIX + digest[:32])


class AgentToolError(ToolResultError):
    """An agent asked as a tool did not answer; the asking model reads why.

    Its turn failed, timed out, was stopped, or waited for a budget.
    """


class AgentTool:
    """Another agent, offered as a tool: each call is one turn of that agent.

    The model calls it with a `message`; the agent answers it in a turn of its own, in a
    session of its own that names the asking session as its parent, durably like any turn
    (recovered after a crash, audited, its tools approved the same way), and its answer is
    the call's result: its text, or its JSON value when the agent has an `output_type`.
    A call runs the agent once: after a crash of the asking turn the same call joins the
    turn it started instead of asking again.

    When the agent stops to wait for a person (an approval, a question), the asking turn
    waits too, with the same approval or question, answered there; `approval=` on this
    tool has a person approve the delegation itself.
    """

    def __init__(
        self,
        agent: Any,
        *,
        name: str,
        description: str,
        approval: ApprovalPolicy | None = None,
        approver_role: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        check_timeout_s(timeout_s, name)
        if approval is not None:
            check_approval_policy(approval, f"the tool {name!r}")
        check_approver_role(approver_role, f"the tool {name!r}")
        self.timeout_s = timeout_s
        """Seconds the agent has to answer; then its turn is stopped and the call fails."""
        self.agent = agent
        """The `Agent` that answers."""
        self._name = name
        self._description = description
        self.approval = approval
        """The call's own approval policy (None: the asking agent's)."""
        self.approver_role = approver_role
        """Who approves the call over HTTP (None: the asking agent's rule)."""

    @classmethod
    def of(
        cls,
        agent: Any,
        *,
        name: str | None = None,
        description: str | None = None,
        approval: ApprovalPolicy | None = None,
        approver_role: str | None = None,
        timeout_s: float | None = None,
    ) -> AgentTool:
        """`agent` as a tool (see `Agent.as_tool`).

        Raises:
            ConfigurationError: `timeout_s` is not above 0, or the approval policy or
                role is not one.
        """
        return cls(
            agent,
            name=name or agent.name,
            description=description
            or f"Ask the {agent.name} agent and get its answer. {_first_line(agent.instructions)}",
            approval=approval,
            approver_role=approver_role,
            timeout_s=timeout_s,
        )

    @property
    def name(self) -> str:
        """The name the model calls."""
        return self._name

    def spec(self) -> ToolSpec:
        """One argument: the message the agent answers."""
        return ToolSpec(
            name=self._name,
            description=self._description,
            parameters={
                "type": "object",
                "properties": {"message": {"type": "string", "description": _MESSAGE_HELP}},
                "required": ["message"],
                "additionalProperties": False,
            },
        )

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        """Ask the agent and return its answer.

        Raises:
            ToolArgumentsError: no `message`, or other arguments.
            AgentToolError: the agent's turn did not answer, or there is no runtime to
                run it (the tool was called outside a turn).
        """
        message = self.message_of(arguments)
        ask = ctx._ask_agent
        if ask is None:
            raise AgentToolError(
                f"the agent {self.agent.name!r} answers only inside a turn of a "
                "SessionRuntime: call the asking agent through the runtime"
            )
        # Cancelled past `timeout_s`, the ask stops the asked turn as a Stop does.
        return await within(self.timeout_s, ask(self.agent, message, ctx), self._expired)

    def _expired(self) -> AgentToolError:
        return AgentToolError(
            f"the agent {self.agent.name!r} did not answer within {self.timeout_s:g} s: "
            "its turn was stopped"
        )

    async def reconcile(
        self, arguments: Mapping[str, JsonValue], ctx: ToolContext
    ) -> tuple[bool, JsonValue]:
        """After a crash: join the turn this call started (it is not asked again).

        When that turn did not answer, the call runs again, which joins the same turn
        and fails saying why.
        """
        try:
            return True, await self.invoke(arguments, ctx)
        except AgentToolError:
            return False, None

    def session_for(self, idempotency_key: str) -> SessionId:
        """The session the agent answers the call with this idempotency key in."""
        return delegated_session_id(idempotency_key, self.agent.name)

    def message_of(self, arguments: Mapping[str, JsonValue]) -> str:
        """The call's `message`, checked.

        Raises:
            ToolArgumentsError: it is missing, not text or blank, or other arguments came.
        """
        extra = sorted(set(arguments) - {"message"})
        if extra:
            raise ToolArgumentsError(self._name, f"unexpected arguments {extra}: only `message`")
        message = arguments.get("message")
        if not isinstance(message, str) or not message.strip():
            raise ToolArgumentsError(self._name, "`message` must be non-empty text")
        return message


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 200 else line[:197] + "..."
