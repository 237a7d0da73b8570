"""Pauses: approval policies, the clarification tool, and the answers that resume a turn.

A tool call that needs approval, or a question the model asks with `ask_user`, pauses the
*same* turn: the request is saved, `approval.requested` / `clarification.requested` is
committed, the turn moves to `awaiting_approval` / `awaiting_input`, and the invocation
ends — nothing of the tool runs, and no process holds the turn. Answering resumes it from
its LangGraph checkpoint, from any process, however much later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from turnkit.errors import ConfigurationError

__all__ = (
    "check_approval_policy",
    "check_approver_role",
    "CLARIFY_TOOL",
    "RESOLUTION_ADAPTER",
    "Answer",
    "ApprovalPolicy",
    "Approve",
    "Deny",
    "PauseRequest",
    "Resolution",
    "needs_approval",
    "summarize_call",
)

ApprovalPolicy = Literal["never", "always"] | Callable[[str, Mapping[str, Any]], bool]
"""`never`, `always` ("Ask before each action"), or a function of (tool name, arguments).

A function gets the arguments as the tool would run with them: validated against its
signature and converted (`"80"` for an `int` is `80`); a call whose arguments the tool
refuses is not asked about (it fails without running), and a function that raises asks.
"""

CLARIFY_TOOL = "ask_user"


class Approve(BaseModel):
    """Let the paused tool call run: as the model wrote it, or with `arguments` instead.

    `arguments` are the call's arguments as the person changed them (all of them, not a
    patch): the tool runs with them, and the model reads its call with them, as if it
    had written them (`ToolResultBlock.arguments` records them).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["approve"] = "approve"
    note: str | None = None
    arguments: dict[str, JsonValue] | None = None


class Deny(BaseModel):
    """Refuse the paused tool call; the model reads the refusal (and `note`) as its result."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["deny"] = "deny"
    note: str | None = Field(default=None, max_length=4000)


class Answer(BaseModel):
    """Answer the model's clarification question."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["answer"] = "answer"
    text: str = Field(min_length=1, max_length=20_000)


Resolution = Annotated[Approve | Deny | Answer, Field(discriminator="kind")]
RESOLUTION_ADAPTER: TypeAdapter[Resolution] = TypeAdapter(Resolution)


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseRequest:
    """What a paused turn waits on (saved in the Store with the pause)."""

    request_id: str
    kind: Literal["approval", "clarification", "budget"]
    tool_call_id: str
    payload: dict[str, JsonValue]


def check_approval_policy(policy: object, where: str) -> None:
    """Refuse, where it is given, a policy that is not `never`, `always` or a function.

    Raises:
        ConfigurationError: `"Always"`, `"alway"`, `True`: refused at construction, not
            at the first call that asks.
    """
    if policy in ("never", "always") or (callable(policy) and not isinstance(policy, str)):
        return
    raise ConfigurationError(
        f"the approval policy {policy!r} of {where} is not 'never', 'always' or a function "
        "(tool_name, arguments) -> bool"
    )


_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def check_approver_role(role: object, where: str) -> None:
    """Refuse an `approver_role` that no principal's role could be (`ConfigurationError`)."""
    if role is not None and not (isinstance(role, str) and _ROLE.fullmatch(role)):
        raise ConfigurationError(
            f"the approver_role {role!r} of {where} is not a role name (1-128 letters, digits "
            "or `_ . : -`, starting with a letter or digit) or None"
        )


def needs_approval(policy: ApprovalPolicy, tool_name: str, arguments: Mapping[str, Any]) -> bool:
    """Whether a call needs a person's approval under `policy`."""
    if policy == "never":
        return False
    if policy == "always":
        return True
    if callable(policy):
        return bool(policy(tool_name, arguments))
    raise ConfigurationError(f"approval policy {policy!r} is not 'never', 'always' or a function")


_SHOWN_ARGUMENTS = 12
"""Arguments a summary names, at most; the rest are counted."""


def summarize_call(tool_name: str, arguments: Mapping[str, JsonValue]) -> str:
    """A human-readable line for the approval card: every argument, each shortened.

    Each name and value is cut on its own, so no argument (a long name or value the model
    wrote) can push the others out of the line a person approves.
    """
    items = sorted(arguments.items())
    room = max(120, 300 // max(1, len(items)))  # one argument (a command) shows 300
    shown = [
        f"{_cut(key, 40)}={_cut(json.dumps(value, ensure_ascii=False), room)}"
        for key, value in items[:_SHOWN_ARGUMENTS]
    ]
    if len(items) > _SHOWN_ARGUMENTS:
        shown.append(f"and {len(items) - _SHOWN_ARGUMENTS} more")
    return f"Run {tool_name} with {', '.join(shown) or 'no arguments'}"


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"
