"""Request and response bodies of the HTTP adapter (camelCase on the wire)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.alias_generators import to_camel

from turnkit.agent import Effort
from turnkit.audit import AuditRow
from turnkit.blocks import Block, ContentPart
from turnkit.events import Citation, Entity, Task
from turnkit.ids import SESSION_ID_PATTERN
from turnkit.models import ModelSettings
from turnkit.states import TurnStatus

__all__ = (
    "BudgetLimitBody",
    "BudgetListOut",
    "BudgetOut",
    "CallbackBody",
    "CallbackOut",
    "UsageGroup",
    "SkillOut",
    "UsageLineOut",
    "UsageOut",
    "PendingListOut",
    "PendingOut",
    "CancelOut",
    "ExecuteBody",
    "RenameBody",
    "SessionBody",
    "SessionOut",
    "TurnOut",
)


MAX_PARTS = 1_000
"""The most parts a message's content has (at most 20 of them pictures)."""
_Parts = Annotated[list[ContentPart], Field(max_length=MAX_PARTS, fail_fast=True)]


class _Camel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", from_attributes=True
    )


class ExecuteBody(_Camel):
    """Body of `POST /sessions/{id}/execute`."""

    content: str | _Parts = Field(
        description="The user's message: text, or parts (`text`, and `image` by `url` or "
        f"base64 `data` with a `media_type`; at most {MAX_PARTS} parts).",
    )
    request_id: str | None = Field(
        default=None, min_length=1, max_length=128, description="Idempotency key."
    )
    delivery: str = Field(default="queue", pattern="^(queue|guide)$")
    agent: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="A hosted agent's name (default: the runtime's default agent).",
    )
    model: str | None = Field(
        default=None,
        description="A model the runtime serves (`models=`) or allows (`allowed_models`).",
    )
    effort: Effort | None = None
    settings: ModelSettings | None = Field(
        default=None,
        description="Sampling settings for this message, merged over the agent's.",
    )
    documents: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Ids of attached documents; each must have an indexed copy (one still "
        "being read is fine), by the app's document resolver.",
    )


def _no_nul(title: str | None) -> str | None:
    if title is not None and "\x00" in title:
        raise ValueError("the title contains the NUL character (U+0000): remove it")
    return title


class SessionBody(_Camel):
    """Body of `POST /sessions`."""

    session_id: str | None = Field(
        default=None,
        max_length=128,
        pattern=SESSION_ID_PATTERN.pattern,
        description="1-128 letters, digits or `_ . : -`, starting with a letter or digit.",
    )
    title: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        pattern=r"\S",
        description="1-500 characters, not only white space (leave it out: named later).",
    )

    _storable = field_validator("title")(_no_nul)


class RenameBody(_Camel):
    """Body of `PATCH /sessions/{id}` (a `sessionId` beside the title is ignored)."""

    model_config = ConfigDict(extra="ignore")

    title: str = Field(min_length=1, max_length=500, pattern=r"\S")

    _storable = field_validator("title")(_no_nul)


class SessionOut(_Camel):
    """A session (`parent_session`: the one whose agent asked this one's, as a tool)."""

    session_id: str
    title: str | None
    created_at: datetime
    updated_at: datetime
    parent_session: str | None = None


class AskedPauseOut(_Camel):
    """The agent asked as a tool whose request a pending card is, and where it waits."""

    agent: str
    session_id: str
    turn_id: str
    request_id: str


class PendingOut(_Camel):
    """An approval or a question a paused turn waits for."""

    turn_id: str
    request_id: str
    kind: Literal["approval", "clarification"]
    seq: int
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: dict[str, JsonValue] | None = None
    summary: str | None = None
    question: str | None = None
    choices: list[str] = Field(default_factory=list[str])
    approver_role: str | None = None
    """The role that answers this approval (None: the session's owner, or an admin)."""
    session_id: str | None = None
    """The turn's session."""
    asked: AskedPauseOut | None = None
    """Set when an agent asked as a tool waits for this answer: it goes on to that agent."""

    @classmethod
    def of(cls, decision: object, session_id: str) -> PendingOut:
        """A pending decision of a turn of `session_id`, as the routes send it."""
        return cls.model_validate(decision).model_copy(update={"session_id": session_id})


class SkillOut(_Camel):
    """A skill the caller may pick with `/slug`."""

    ref: str
    slug: str
    name: str
    description: str
    builtin: bool


class UsageLineOut(_Camel):
    """Usage summed over one group."""

    key: str
    turns: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float


UsageGroup = Literal["session", "principal", "department", "day"]


class UsageOut(_Camel):
    """Body of `GET /usage`."""

    by: UsageGroup
    scope: Literal["self", "organisation"] = "self"
    lines: list[UsageLineOut]


class BudgetLimitBody(_Camel):
    """Body of `PUT /budgets`: a limit in the caller's organisation."""

    scope: Literal["organisation", "department", "principal", "session"]
    key: str = Field(
        default="",
        max_length=256,
        description="The department, principal id or session id (empty for the organisation).",
    )
    period: Literal["day", "month", "total"] = "month"
    usd: float | None = Field(default=None, ge=0)
    tokens: int | None = Field(default=None, ge=0)


class BudgetOut(_Camel):
    """A limit and what its current period has spent and holds reserved."""

    scope: str
    organisation: str
    key: str
    period: str
    usd: float | None
    tokens: int | None
    spent_usd: float
    spent_tokens: int
    reserved_usd: float
    reserved_tokens: int


class BudgetListOut(_Camel):
    """Body of `GET /budgets`."""

    budgets: list[BudgetOut]
    resumed: list[str] = Field(
        default_factory=list, description="Turns a raised limit let resume (after a PUT)."
    )


class CallbackBody(_Camel):
    """Body of `POST /turns/{id}/callback`: a job's progress, from the process running it."""

    job_id: str = Field(min_length=1, max_length=128)
    tool_call_id: str = Field(min_length=1, max_length=128)
    progress: float | None = Field(default=None, ge=0.0, le=1.0)
    message: str | None = Field(default=None, max_length=2_000)


class CallbackOut(_Camel):
    """What a callback reached: its turn and who the turn acts for (from the turn)."""

    turn_id: str
    session_id: str
    principal: str | None
    organisation: str
    department: str | None


class QueuedInputOut(_Camel):
    """A message the session holds that no turn has answered yet."""

    turn_id: str
    """The turn it will start (`queue`) or join (`guide`)."""
    input_seq: int
    content: str
    delivery: Literal["queue", "guide"]
    request_id: str | None = None


class QueueOut(_Camel):
    """Body of the session-queue route, in the order the messages were sent."""

    queue: list[QueuedInputOut]


class PendingListOut(_Camel):
    """Body of the pending-decision routes."""

    pending: list[PendingOut]


class TurnOut(_Camel):
    """A turn with its committed blocks."""

    turn_id: str
    status: TurnStatus
    blocks: list[Block] = Field(default_factory=list[Block])
    answer: str | None = None
    pending: PendingOut | None = None
    tasks: list[Task] = Field(default_factory=list[Task])
    citations: list[Citation] = Field(default_factory=list[Citation])
    entities: list[Entity] = Field(default_factory=list[Entity])
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    error_code: str | None = None
    """Why a turn that failed or timed out ended (the error's code)."""


class TurnStatusOut(_Camel):
    """A turn's state."""

    turn_id: str
    session_id: str
    status: TurnStatus
    error_code: str | None
    last_seq: int
    attempts: int


class CancelOut(_Camel):
    """What Stop did: `cancelled`, or `running` while another process's driver stops."""

    turn_id: str
    status: TurnStatus


class AuditOut(_Camel):
    """A turn's audit rows."""

    turn_id: str
    rows: list[AuditRow]


class ApprovalBody(_Camel):
    """Body of `POST /turns/{turn_id}/approvals/{request_id}`."""

    decision: str = Field(pattern="^(approve|deny)$")
    note: str | None = Field(default=None, max_length=4000)
    arguments: dict[str, JsonValue] | None = None
    """With `approve`: the call's arguments as the person changed them (all of them)."""

    @model_validator(mode="after")
    def _arguments_only_to_approve(self) -> ApprovalBody:
        if self.arguments is not None and self.decision != "approve":
            raise ValueError("arguments go with decision 'approve' only")
        return self


class AnswerBody(_Camel):
    """Body of `POST /turns/{turn_id}/clarifications/{request_id}`."""

    answer: str = Field(min_length=1, max_length=20_000)


class WorkspaceFileOut(_Camel):
    """A session file without its content (fetch that from `GET .../files/{path}`)."""

    path: str
    media_type: str
    size: int = Field(description="Bytes of the UTF-8 content.")
    version: int = Field(description="1 on the first write; one more per change.")
    updated_at: datetime
    turn_id: str | None = Field(description="The turn that last changed the file.")


class WorkspaceFilesOut(_Camel):
    """A session's files, ordered by path."""

    files: list[WorkspaceFileOut]


class ResumeOut(_Camel):
    """The turn goes on; follow it with `GET /turns/{turn_id}/stream?after=<last id>`."""

    turn_id: str
    request_id: str
    status: TurnStatus
