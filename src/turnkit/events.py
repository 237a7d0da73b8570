"""Stream events: one discriminated union on `type`, durable or ephemeral by type.

Durable events carry `seq` (1, 2, 3… within the turn, gap-free), are committed to the
Store before anyone sees them and are replayed. Ephemeral events carry no `seq`, are never
persisted and never replayed. Which is which is the class an event derives from.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    TypeAdapter,
)

from turnkit.blocks import (
    ImagePart,
    TextBlock,
    ThinkingSummaryBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from turnkit.errors import ErrorCode
from turnkit.ids import SessionId, StageId, ToolCallId, TurnId
from turnkit.states import TerminalStatus

__all__ = (
    "STREAM_EVENT_ADAPTER",
    "DurableStreamEvent",
    "ApprovalAnsweredEvent",
    "ApprovalRequestedEvent",
    "AskedPause",
    "AskedUsage",
    "BudgetPausedEvent",
    "CheckpointCreatedEvent",
    "Citation",
    "ClarificationRequestedEvent",
    "CompactionCompletedEvent",
    "CompactionStartedEvent",
    "DoneEvent",
    "DurableEvent",
    "RunFinishedEvent",
    "ToolInDoubtEvent",
    "Task",
    "TasksUpdatedEvent",
    "ToolTiming",
    "TurnRecoveringEvent",
    "SessionRenamedEvent",
    "Entity",
    "EphemeralEvent",
    "ErrorEvent",
    "GuardrailEvent",
    "PluginEmittedEvent",
    "PluginSignalEvent",
    "HeartbeatEvent",
    "InputGuidedEvent",
    "JobCompletedEvent",
    "JobDispatchedEvent",
    "JobProgressEvent",
    "MessageCitationsEvent",
    "MessageCompleteEvent",
    "MessageDeltaEvent",
    "MessageSnapshotEvent",
    "MessageEntitiesEvent",
    "ProviderCascadeEvent",
    "StageName",
    "StepEndEvent",
    "StepStartEvent",
    "StreamEvent",
    "ThinkingCompleteEvent",
    "ThinkingDeltaEvent",
    "ToolCompletedEvent",
    "ToolDeltaEvent",
    "ToolFailedEvent",
    "ToolStartedEvent",
    "TurnStartedEvent",
    "UsageEvent",
    "decode_event",
    "encode_event",
)

StageName = Literal["anchor-plan", "tool-loop", "synthesize", "post-turn"]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    session_id: SessionId
    turn_id: TurnId
    stage_id: StageId
    """The stage that produced the event, or `runtime` for the turn's own bookkeeping."""
    ts: AwareDatetime
    """When the runtime produced the event (UTC)."""


class DurableEvent(_Event):
    """Committed to the Store before it is sent; replayed after a reconnect."""

    seq: PositiveInt
    """1-based, gap-free position within the turn; also the SSE `id:`."""


class EphemeralEvent(_Event):
    """Never persisted, never replayed, sent without an SSE id."""


# ── turn and stage bookkeeping ────────────────────────────────────────────────────────


class TurnStartedEvent(DurableEvent):
    """The turn row is written; the user's message is part of the log."""

    type: Literal["turn.started"] = "turn.started"
    content: str
    """The user's message."""
    attachments: tuple[ImagePart, ...] = ()
    """Pictures the person attached to the message."""
    request_id: str | None = None
    agent: str
    model: str
    """The model (or family) the turn runs on."""
    effort: Literal["off", "low", "medium", "high"]
    input_seq: PositiveInt | None = None
    """The message's position among the session's committed inputs."""
    delivery: Literal["queue", "guide"] = "queue"
    """How the message was delivered; a `guide` with no live turn is committed as `queue`."""
    requested_delivery: Literal["queue", "guide"] = "queue"


class InputGuidedEvent(DurableEvent):
    """A message sent with `delivery=guide` joined this running turn before a model request."""

    type: Literal["input.guided"] = "input.guided"
    content: str
    input_seq: PositiveInt
    request_id: str | None = None


class StepStartEvent(DurableEvent):
    """A stage began. `iteration` counts tool-loop passes from 1."""

    type: Literal["step.start"] = "step.start"
    step: StageName
    iteration: PositiveInt | None = None


class StepEndEvent(DurableEvent):
    """A stage ended."""

    type: Literal["step.end"] = "step.end"
    step: StageName
    iteration: PositiveInt | None = None
    duration_ms: NonNegativeFloat


# ── model output ──────────────────────────────────────────────────────────────────────


class MessageDeltaEvent(EphemeralEvent):
    """A piece of assistant text; the whole block arrives later in `message.complete`."""

    type: Literal["message.delta"] = "message.delta"
    block_id: str
    text: str


class MessageSnapshotEvent(EphemeralEvent):
    """The text so far of a block still being written, for a reader that joined mid-block.

    Replaces whatever the reader shows for `block_id`; the block's next deltas follow.
    """

    type: Literal["message.snapshot"] = "message.snapshot"
    block_id: str
    text: str


class ThinkingDeltaEvent(EphemeralEvent):
    """A piece of a thinking summary (never raw chain-of-thought)."""

    type: Literal["thinking.delta"] = "thinking.delta"
    block_id: str
    text: str


class ThinkingCompleteEvent(DurableEvent):
    """A thinking summary block is complete."""

    type: Literal["thinking.complete"] = "thinking.complete"
    block: ThinkingSummaryBlock
    generation_id: str | None = None
    """The model call that wrote it (derived from the log, stable across recovery)."""


class MessageCompleteEvent(DurableEvent):
    """A text block is complete: narration (`is_answer` false) or the answer (in `synthesize`)."""

    type: Literal["message.complete"] = "message.complete"
    block: TextBlock
    generation_id: str | None = None
    """The model call that wrote it (derived from the log, stable across recovery)."""
    input_seqs: tuple[PositiveInt, ...] = ()
    """The committed user inputs the request presented (what this message consumed)."""


class Citation(BaseModel):
    """A source the answer relies on."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    source: str
    title: str | None = None
    url: str | None = None
    quote: str | None = None


class Entity(BaseModel):
    """A named thing the turn referred to."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    name: str
    kind: str


class MessageCitationsEvent(DurableEvent):
    """Citations an enrichment plugin attached to a text block."""

    type: Literal["message.citations"] = "message.citations"
    block_id: str
    citations: tuple[Citation, ...]


class MessageEntitiesEvent(DurableEvent):
    """Entities anchored at plan time or extracted from a block."""

    type: Literal["message.entities"] = "message.entities"
    block_id: str | None = None
    entities: tuple[Entity, ...]


# ── tools and jobs ────────────────────────────────────────────────────────────────────


class ToolStartedEvent(DurableEvent):
    """A tool call is dispatched; written ahead of the tool running."""

    type: Literal["tool.started"] = "tool.started"
    block: ToolUseBlock
    generation_id: str | None = None
    """The model call that asked for the tool."""
    idempotency_key: str | None = None
    """Handed to the tool as `ctx.idempotency_key`; the same on every retry of the call."""
    arguments_error: str | None = None
    """Why the call will not run (malformed JSON, unknown tool, cut by the output limit)."""
    asked_session_id: str | None = None
    """For an agent asked as a tool (`Agent.as_tool`): the session it answers in."""


class ToolDeltaEvent(EphemeralEvent):
    """The model is still writing a tool call's arguments."""

    type: Literal["tool.delta"] = "tool.delta"
    tool_call_id: ToolCallId
    tool_name: str | None = None
    arguments_delta: str
    chars: NonNegativeInt
    """How many argument characters the open call has written so far."""


class ToolCompletedEvent(DurableEvent):
    """A tool call answered."""

    type: Literal["tool.completed"] = "tool.completed"
    tool_call_id: ToolCallId
    result: ToolResultBlock
    duration_ms: NonNegativeFloat
    tool_name: str
    """The tool that answered (differs from the called name after a cascade pivot)."""


class ToolFailedEvent(DurableEvent):
    """A tool call failed; the failure is a result the model reads, not a turn error."""

    type: Literal["tool.failed"] = "tool.failed"
    tool_call_id: ToolCallId
    result: ToolResultBlock
    duration_ms: NonNegativeFloat
    code: ErrorCode


class JobDispatchedEvent(DurableEvent):
    """A long-running tool started a job."""

    type: Literal["job.dispatched"] = "job.dispatched"
    job_id: str
    tool_call_id: ToolCallId
    tool_name: str


class JobProgressEvent(EphemeralEvent):
    """A long-running tool reported progress."""

    type: Literal["job.progress"] = "job.progress"
    job_id: str
    tool_call_id: ToolCallId
    progress: float | None = Field(default=None, ge=0.0, le=1.0)
    message: str | None = None


class JobCompletedEvent(DurableEvent):
    """A long-running tool's job ended."""

    type: Literal["job.completed"] = "job.completed"
    job_id: str
    tool_call_id: ToolCallId
    is_error: bool = False


# ── cascades, pauses, guards, context ─────────────────────────────────────────────────


class ProviderCascadeEvent(DurableEvent):
    """A rung of the model family failed and the call walked to the next rung (or ran out)."""

    type: Literal["provider.cascade"] = "provider.cascade"
    family: str
    from_rung: NonNegativeInt
    from_model: str
    to_rung: NonNegativeInt | None = None
    """The rung tried next; None when the family ran out."""
    to_model: str | None = None
    reason: str
    status_code: int | None = None


class AskedPause(BaseModel):
    """The pause of an agent asked as a tool, handed to the asking turn to be answered there.

    The answer given to the asking turn goes on to this request of the asked turn.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    agent: str
    """The asked agent's name."""
    session_id: SessionId
    """Its session (`tool.started`'s `asked_session_id`)."""
    turn_id: TurnId
    """Its turn, which waits for the answer."""
    request_id: str
    """Its own request, answered with the asking turn's."""


class ApprovalRequestedEvent(DurableEvent):
    """A tool call waits for a person's approval; the turn is `awaiting_approval`.

    With `asked`, the call is one an agent asked as a tool wants to make: the approval is
    answered here and goes on to that agent's turn.
    """

    type: Literal["approval.requested"] = "approval.requested"
    request_id: str
    tool_call_id: ToolCallId
    tool_name: str
    arguments: dict[str, JsonValue]
    summary: str
    approver_role: str | None = Field(default=None, exclude_if=lambda role: role is None)
    """The role that answers it over HTTP (absent: the session's owner); left out unset, so
    a reader of an earlier version still reads the event."""
    asked: AskedPause | None = Field(default=None, exclude_if=lambda asked: asked is None)
    """Set when an agent asked as a tool waits for this approval (left out unset)."""


class ApprovalAnsweredEvent(DurableEvent):
    """A person answered an approval; the turn goes on with the call or its refusal.

    Who answered is in the audit (`pauseAnswer`), not on the stream.
    """

    type: Literal["approval.answered"] = "approval.answered"
    request_id: str
    tool_call_id: ToolCallId
    tool_name: str
    decision: Literal["approve", "deny"]
    note: str | None = Field(default=None, exclude_if=lambda note: note is None)
    """What the person wrote with the answer (a denial's reaches the model)."""
    arguments: dict[str, JsonValue] | None = Field(
        default=None, exclude_if=lambda arguments: arguments is None
    )
    """The arguments the person approved instead of the model's (all of them)."""


class ClarificationRequestedEvent(DurableEvent):
    """The model asked the person a question; the turn is `awaiting_input`.

    With `asked`, an agent asked as a tool asked it: the answer goes on to its turn.
    """

    type: Literal["clarification.requested"] = "clarification.requested"
    request_id: str
    question: str
    choices: tuple[str, ...] = ()
    asked: AskedPause | None = Field(default=None, exclude_if=lambda asked: asked is None)
    """Set when an agent asked as a tool asks the question (left out unset)."""
    tool_call_id: ToolCallId | None = Field(default=None, exclude_if=lambda call: call is None)
    """The call that waits for the answer: the `ask_user` call, or the call that asked the
    agent whose question this is (left out in logs written before it was recorded)."""


class BudgetPausedEvent(DurableEvent):
    """A model call would cross a budget limit: it did not start; the turn is `awaiting_budget`.

    The turn resumes by itself when an administrator raises the limit or the period rolls
    over; cancelling it works as for any pause.
    """

    type: Literal["budget.paused"] = "budget.paused"
    request_id: str
    scope: Literal["organisation", "department", "principal", "session"]
    key: str
    period: Literal["day", "month", "total"]
    reason: str


class GuardrailEvent(DurableEvent):
    """What one guardrail check found (never the checked text)."""

    type: Literal["guardrail"] = "guardrail"
    checkpoint: str
    kind: str
    subject: str
    action: str
    tool_call_id: ToolCallId | None = None
    """The call whose result was checked (`tool_result` checkpoint only)."""
    input_seq: int | None = None
    """The message that joined the running turn (a guide) that was checked."""


class PluginEmittedEvent(DurableEvent):
    """An event a plugin emitted: committed and replayed like any other."""

    type: Literal["plugin.emitted"] = "plugin.emitted"
    plugin: str
    name: str
    """Namespaced `plugin.<plugin>.<name>`."""
    data: dict[str, JsonValue] = Field(default_factory=dict)


class PluginSignalEvent(EphemeralEvent):
    """An ephemeral event a plugin emitted (live readers only, never replayed)."""

    type: Literal["plugin.signal"] = "plugin.signal"
    plugin: str
    name: str
    """Namespaced `plugin.<plugin>.<name>`."""
    data: dict[str, JsonValue] = Field(default_factory=dict)


class CompactionStartedEvent(EphemeralEvent):
    """A summary of the history is being written."""

    type: Literal["compaction.started"] = "compaction.started"


class CompactionCompletedEvent(DurableEvent):
    """The history was replaced (by a summary, or by dropping the oldest turns)."""

    type: Literal["compaction.completed"] = "compaction.completed"
    summarized_messages: NonNegativeInt
    tokens_before: NonNegativeInt
    tokens_after: NonNegativeInt
    strategy: Literal["summary", "keep-newest"] = "summary"
    """`summary`: the utility model summarized; `keep-newest`: old turns were dropped."""
    model: str | None = None
    """The model that wrote the summary (None for `keep-newest`)."""


class AskedUsage(BaseModel):
    """What the agents a turn asked as tools spent, each counting the agents it asked.

    Kept apart from the turn's own totals, which count only its own model calls: the
    question's whole cost is the own totals plus these.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    turns: PositiveInt
    """The asked turns counted, those they asked in turn included."""
    model_calls: NonNegativeInt = 0
    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    cached_tokens: NonNegativeInt = 0
    cost_usd: NonNegativeFloat = 0.0


class UsageEvent(DurableEvent):
    """Totals for the turn so far: tokens and cost over every model call."""

    type: Literal["usage"] = "usage"
    model_calls: NonNegativeInt
    input_tokens: NonNegativeInt
    output_tokens: NonNegativeInt
    cached_tokens: NonNegativeInt = 0
    cost_usd: NonNegativeFloat = 0.0
    asked: AskedUsage | None = Field(default=None, exclude_if=lambda asked: asked is None)
    """What the agents the turn asked as tools spent, apart from the totals above (absent
    when it asked none)."""


class CheckpointCreatedEvent(DurableEvent):
    """The graph state was checkpointed; a resumed turn continues from here."""

    type: Literal["checkpoint.created"] = "checkpoint.created"
    checkpoint_id: str


class HeartbeatEvent(EphemeralEvent):
    """The driver is alive while a model call is silent."""

    type: Literal["heartbeat"] = "heartbeat"


class SessionRenamedEvent(DurableEvent):
    """Written by earlier versions when a turn named its session; still read from their logs.

    A session's name now arrives after its opening turn has ended (refresh the session
    list), so no turn writes this event any more.
    """

    type: Literal["session.renamed"] = "session.renamed"
    title: str
    source: Literal["opening-message", "background-model"]
    """`opening-message`: read off the first message at once; `background-model`: the
    utility model's better name, which replaced it."""


class TurnRecoveringEvent(DurableEvent):
    """A new attempt took the turn over from a driver that died (or lost its lease)."""

    type: Literal["turn.recovering"] = "turn.recovering"
    attempt: PositiveInt
    """This attempt's number (2 for the first takeover)."""
    cause: Literal["lease-expired", "handed-over", "retried"]
    """`lease-expired`: the previous driver stopped renewing (killed, cut off);
    `handed-over`: its worker shut down and left the turn to the next one;
    `retried`: a failed turn was retried."""
    resumed_from: Literal["checkpoint", "start"]
    """Where the attempt goes on from: the turn's last checkpoint, or its start (with
    whatever the committed log already holds reused, never repeated)."""
    checkpoint_id: str | None = None
    last_seq: NonNegativeInt
    """The last event the previous attempts committed."""


class ToolInDoubtEvent(DurableEvent):
    """A tool call an earlier attempt started has no committed result.

    It may or may not have taken effect. Its reconcile hook (if any) decides; else it
    runs again with the same idempotency key.
    """

    type: Literal["tool.in_doubt"] = "tool.in_doubt"
    tool_call_id: ToolCallId
    tool_name: str
    idempotency_key: str
    resolution: Literal["reconciled", "rerun", "failed"]
    """`reconciled`: the tool's reconcile hook returned the result it already produced;
    `rerun`: the call runs again; `failed`: the hook answered in a shape turnkit cannot
    read, so the call fails without running again (its `tool.failed` says why)."""


class Task(BaseModel):
    """One entry of a turn's task list (kept by the built-in `update_tasks` tool)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    id: str = Field(min_length=1, max_length=40)
    title: str = Field(min_length=1, max_length=500)
    status: Literal["pending", "in_progress", "done", "blocked"] = "pending"
    inputs: tuple[str, ...] = ()
    """What the task works from (files, sources, earlier tasks)."""
    output: str | None = None
    """What it produces."""
    check: str | None = None
    """How to tell it is done right."""


class TasksUpdatedEvent(DurableEvent):
    """The turn's task list, whole, as it stands now (the UI redraws it from this)."""

    type: Literal["tasks.updated"] = "tasks.updated"
    tasks: tuple[Task, ...]
    tool_call_id: ToolCallId | None = None
    """The `update_tasks` call that set it; None for the list anchor-plan started with."""


class ToolTiming(BaseModel):
    """How long one tool call took."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tool: str
    duration_ms: NonNegativeFloat


class RunFinishedEvent(DurableEvent):
    """The attempt's own account, committed just before `done` (the turn boundary)."""

    type: Literal["run.finished"] = "run.finished"
    status: TerminalStatus
    attempt: PositiveInt
    model: str
    model_calls: NonNegativeInt
    input_tokens: NonNegativeInt
    output_tokens: NonNegativeInt
    cached_tokens: NonNegativeInt = 0
    cost_usd: NonNegativeFloat = 0.0
    tool_timings: tuple[ToolTiming, ...] = ()
    context_messages: NonNegativeInt = 0
    """Messages in the turn's final model-facing transcript."""
    context_tokens: NonNegativeInt = 0
    """The context's size: input plus output tokens of the turn's latest call on its own
    model (summary, naming and compaction calls do not count)."""
    stop_reason: str | None = None
    error_code: ErrorCode | None = None
    duration_ms: NonNegativeFloat
    recoveries: NonNegativeInt = 0
    """How many times the turn was taken over from a dead driver."""
    skipped_events: NonNegativeInt = 0
    """Committed events of the turn this attempt could not decode and went on without
    (each has an `unreadableEvent` audit row)."""
    asked: AskedUsage | None = Field(default=None, exclude_if=lambda asked: asked is None)
    """What the agents the turn asked as tools spent, apart from the turn's own totals
    above (absent when it asked none)."""


class ErrorEvent(DurableEvent):
    """The turn failed (or was interrupted) with a stable code."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


class DoneEvent(DurableEvent):
    """The last event of every turn: its terminal status."""

    type: Literal["done"] = "done"
    status: TerminalStatus
    error_code: ErrorCode | None = None
    """Set for `failed` and `timed_out`; `cancelled` carries no error code."""


StreamEvent = Annotated[
    TurnStartedEvent
    | InputGuidedEvent
    | StepStartEvent
    | StepEndEvent
    | MessageDeltaEvent
    | MessageSnapshotEvent
    | ThinkingDeltaEvent
    | ThinkingCompleteEvent
    | ToolStartedEvent
    | ToolDeltaEvent
    | ToolCompletedEvent
    | ToolFailedEvent
    | JobDispatchedEvent
    | JobProgressEvent
    | JobCompletedEvent
    | ProviderCascadeEvent
    | MessageCompleteEvent
    | MessageCitationsEvent
    | MessageEntitiesEvent
    | ApprovalRequestedEvent
    | ApprovalAnsweredEvent
    | BudgetPausedEvent
    | ClarificationRequestedEvent
    | GuardrailEvent
    | PluginEmittedEvent
    | PluginSignalEvent
    | CompactionStartedEvent
    | CompactionCompletedEvent
    | UsageEvent
    | CheckpointCreatedEvent
    | HeartbeatEvent
    | TurnRecoveringEvent
    | SessionRenamedEvent
    | ToolInDoubtEvent
    | TasksUpdatedEvent
    | RunFinishedEvent
    | ErrorEvent
    | DoneEvent,
    Field(discriminator="type"),
]
STREAM_EVENT_ADAPTER: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)

DurableStreamEvent = (
    TurnStartedEvent
    | InputGuidedEvent
    | StepStartEvent
    | StepEndEvent
    | ThinkingCompleteEvent
    | ToolStartedEvent
    | ToolCompletedEvent
    | ToolFailedEvent
    | JobDispatchedEvent
    | JobCompletedEvent
    | ProviderCascadeEvent
    | MessageCompleteEvent
    | MessageCitationsEvent
    | MessageEntitiesEvent
    | ApprovalRequestedEvent
    | ApprovalAnsweredEvent
    | BudgetPausedEvent
    | ClarificationRequestedEvent
    | GuardrailEvent
    | PluginEmittedEvent
    | CompactionCompletedEvent
    | UsageEvent
    | CheckpointCreatedEvent
    | TurnRecoveringEvent
    | SessionRenamedEvent
    | ToolInDoubtEvent
    | TasksUpdatedEvent
    | RunFinishedEvent
    | ErrorEvent
    | DoneEvent
)
"""The events of `StreamEvent` that carry a `seq` (committed before they are sent), as
one union: what `Plugin.on_event` and `SessionRuntime.events` give, narrowed on `type`."""


def encode_event(event: DurableEvent | EphemeralEvent) -> bytes:
    """The event's wire JSON (the bytes the Store keeps and replay forwards)."""
    return event.__pydantic_serializer__.to_json(event)


def decode_event(data: bytes | str) -> StreamEvent:
    """Parse wire JSON back into its typed event."""
    return STREAM_EVENT_ADAPTER.validate_json(data)
