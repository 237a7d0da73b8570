"""Pauses: approval policies, the clarification tool, and the answers that resume a turn.

A tool call that needs approval, or a question the model asks with `ask_user`, pauses the
*same* turn: the request is saved, `approval.requested` / `clarification.requested` is
committed, the turn moves to `awaiting_approval` / `awaiting_input`, and the invocation
ends — nothing of the tool runs, and no process holds the turn. Answering resumes it from
its LangGraph checkpoint, from any process, however much later.
"""

from __future__ import annotations

import inspect
import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from turnkit.errors import ConfigurationError
from turnkit.ids import derive_id
from turnkit.tenancy import Principal

__all__ = (
    "ANSWERS",
    "call_request_id",
    "check_approval_policy",
    "check_approver_role",
    "CLARIFY_TOOL",
    "RESOLUTION_ADAPTER",
    "Answer",
    "ApprovalContext",
    "ApprovalPolicy",
    "Approve",
    "Deny",
    "PauseRequest",
    "Resolution",
    "needs_approval",
    "summarize_call",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalContext:
    """What a three-argument approval policy reads beside the call: who asks, and where."""

    caller: Principal | None
    """Who sent the turn's message (None: anonymous)."""
    deps: Any
    """The turn's dependencies, as its tools get them (`ToolContext.deps`)."""
    session_id: str
    turn_id: str


ApprovalPolicy = (
    Literal["never", "always"]
    | Callable[[str, Mapping[str, Any]], bool]
    | Callable[[str, Mapping[str, Any], ApprovalContext], bool]
)
"""`never`, `always` ("Ask before each action"), or a function of (tool name, arguments),
or of (tool name, arguments, `ApprovalContext`).

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


ANSWERS: Final[Mapping[str, tuple[str, ...]]] = {
    "approval": ("approve", "deny"),
    "clarification": ("answer",),
}
"""The answers (`Resolution.kind`) each kind of request a person answers takes."""

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
    if policy in ("never", "always"):
        return
    if callable(policy) and not isinstance(policy, str) and _arity(policy) in (2, 3):
        return
    raise ConfigurationError(
        f"the approval policy {policy!r} of {where} is not 'never', 'always' or a function "
        "(name, arguments) -> bool or (name, arguments, context) -> bool"
    )


def _arity(policy: Callable[..., object]) -> int | None:
    """How many arguments a policy function is called with: 2, 3, or None (not a policy).

    Three when its third positional parameter has no default or is annotated
    `ApprovalContext`; two when it takes (name, arguments) — also through `*args`, as every
    policy was called before the context existed. A required keyword-only parameter
    could never be given: not a policy.
    """
    try:
        parameters = list(inspect.signature(policy).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called as (name, args)
        return 2
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in parameters if p.kind in kinds]
    if any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in parameters):
        return None
    if sum(p.default is p.empty for p in positional) > 3:
        return None
    if len(positional) >= 3 and (
        positional[2].default is positional[2].empty
        or "ApprovalContext" in str(positional[2].annotation)
    ):
        return 3
    takes_two = len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)
    if takes_two and sum(p.default is p.empty for p in positional) <= 2:
        return 2
    return None


_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def check_approver_role(role: object, where: str) -> None:
    """Refuse an `approver_role` that no principal's role could be (`ConfigurationError`)."""
    if role is not None and not (isinstance(role, str) and _ROLE.fullmatch(role)):
        raise ConfigurationError(
            f"the approver_role {role!r} of {where} is not a role name (1-128 letters, digits "
            "or `_ . : -`, starting with a letter or digit) or None"
        )


def needs_approval(
    policy: ApprovalPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    context: ApprovalContext | None = None,
) -> bool:
    """Whether a call needs a person's approval under `policy`.

    A three-argument policy gets `context` (None outside a turn).
    """
    if policy == "never":
        return False
    if policy == "always":
        return True
    if callable(policy):
        if _arity(policy) == 3:
            return bool(cast(Any, policy)(tool_name, arguments, context))
        return bool(cast(Any, policy)(tool_name, arguments))
    raise ConfigurationError(f"approval policy {policy!r} is not 'never', 'always' or a function")


_SHOWN_ARGUMENTS = 12
"""Arguments a summary names, at most; the rest are counted."""


def summarize_call(tool_name: str, arguments: Mapping[str, JsonValue]) -> str:
    r"""A human-readable line for the approval card: every argument, each shortened.

    Each name and value is cut on its own, so no argument (a long name or value the model
    wrote) can push the others out of the line a person approves. What would draw nothing,
    turn the text around it or drive a terminal shows as an escape (`\u202e`).
    """
    items = sorted(arguments.items())
    room = max(120, 300 // max(1, len(items)))  # one argument (a command) shows 300
    shown = [
        f"{_shown(key, 40)}={_shown(json.dumps(value, ensure_ascii=False), room)}"
        for key, value in items[:_SHOWN_ARGUMENTS]
    ]
    if len(items) > _SHOWN_ARGUMENTS:
        shown.append(f"and {len(items) - _SHOWN_ARGUMENTS} more")
    return f"Run {_shown(tool_name, 80)} with {', '.join(shown) or 'no arguments'}"


_HIDDEN: Final = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Control characters (a terminal acts on them), format characters (zero-width spaces and
joiners, invisible tag letters, direction overrides and isolates), line and paragraph
separators: shown as escapes, so a person reads every character a call carries, in the
order it has them."""


def _shown(text: str, most: int) -> str:
    r"""`text` with each hidden character as a `\u202e` escape, cut to `most` characters.

    A character past U+FFFF is its two UTF-16 halves, as JSON writes it; a cut never splits
    an escape.
    """
    if text.isprintable() and len(text) <= most:
        return text
    pieces = [_escaped(c) if unicodedata.category(c) in _HIDDEN else c for c in text]
    if sum(map(len, pieces)) <= most:
        return "".join(pieces)
    kept, length = [], 0
    for piece in pieces:
        if length + len(piece) > most - 1:
            break
        kept.append(piece)
        length += len(piece)
    return "".join(kept) + "…"


def _escaped(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def call_request_id(turn_id: str, tool_call_id: str) -> str:
    """The id of the approval or question a tool call of a turn asks a person for itself.

    One an agent asked by that call hands over has another (it names the call and a count).
    """
    return derive_id("req", turn_id, tool_call_id)
