"""Audit rows: one per model call, with the call's identity, shape and typed payload slots.

Each row carries the identity tuple (`session_id`, `turn_id`, `stage_id`,
`seq_within_turn`), the post-routing call shape, and one typed slot per payload kind
(`planGeneration`, `cacheBreakpoint`, `fallbackStep`, `toolSelection`, `toolFallbackStep`,
`synthesisQuality`, `outputCheck`, `providerCascade`, `compaction`, `thinkingSummary`,
`unreadableEvent`, `interruptedBlock`, `pauseAnswer`, `agentRepinned`, `askedTurn`).
A tool-loop call that emits tool calls fills two slots (`cacheBreakpoint` and
`toolSelection`); a failed rung fills `fallbackStep`. The one untyped slot is
`plugin_payloads`, namespaced by plugin name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from turnkit.events import AskedUsage
from turnkit.ids import AuditStageId, SessionId, ToolCallId, TurnId
from turnkit.states import TerminalStatus

__all__ = (
    "AgentRepinnedPayload",
    "AskedTurnPayload",
    "ThreadNamingPayload",
    "InterruptedBlockPayload",
    "PauseAnswerPayload",
    "AuditPayloads",
    "AuditRow",
    "CacheBreakpointPayload",
    "CallIdentity",
    "CallOutcome",
    "CallShape",
    "CompactionPayload",
    "FallbackStepPayload",
    "OutputCheckPayload",
    "PlanGenerationPayload",
    "ProviderCascadePayload",
    "SynthesisQualityPayload",
    "ThinkingSummaryPayload",
    "ToolCallRef",
    "ToolFallbackStepPayload",
    "ToolSelectionPayload",
    "UnreadableEventPayload",
    "UnreadableReason",
    "UsageDelta",
    "asked_usage",
)

_CONFIG = ConfigDict(
    frozen=True, extra="forbid", use_attribute_docstrings=True, populate_by_name=True
)

CallOutcome = Literal["ok", "error", "user-aborted", "cancelled"]

UnreadableReason = Literal["unknown-type", "invalid-json", "invalid-fields"]
"""Why a stored event could not be decoded: a type this version lacks (written by a newer
one), bytes that are not JSON, or JSON whose fields do not fit the type."""


class CallIdentity(BaseModel):
    """Which turn, stage and position a row belongs to."""

    model_config = _CONFIG
    session_id: SessionId
    turn_id: TurnId
    stage_id: AuditStageId
    """The stage that made the call, `runtime`, or `thread-naming` for the call that names
    the session after its opening turn ended (rows stored before that stage existed say
    `post-turn`)."""
    seq_within_turn: PositiveInt
    """1-based position of the row among the turn's audit rows."""


class CallShape(BaseModel):
    """The post-routing shape of one model call: who answered, how long, what it cost."""

    model_config = _CONFIG
    provider: str
    model: str
    family: str
    rung: NonNegativeInt
    latency_ms: NonNegativeFloat
    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    cached_tokens: NonNegativeInt = 0
    cost_usd: NonNegativeFloat = 0.0
    outcome: CallOutcome
    error_code: str | None = None
    """Set when `outcome` is not `ok`."""


class PlanGenerationPayload(BaseModel):
    """What anchor-plan decided."""

    model_config = _CONFIG
    kind: Literal["planGeneration"] = "planGeneration"
    intent: str
    depth: Literal["none", "task_list", "spec_plan_tasks"]
    tasks: tuple[str, ...] = ()
    skill: str | None = None
    """The skill the message picked with `/slug` (its reference), if any."""
    utility_error: str | None = None
    """Why the word-count heuristic planned although the agent has a utility model: the
    error code of its failed planning call (its rungs have their own rows)."""


class CacheBreakpointPayload(BaseModel):
    """The cacheable prefix of a reasoning call, at its provider response boundary.

    The previous request is the session's previous reasoning call, in this turn or the
    one before. When the prefix broke, `broken_region` says where and `break_reason` why.
    """

    model_config = _CONFIG
    kind: Literal["cacheBreakpoint"] = "cacheBreakpoint"
    iteration: PositiveInt | None = None
    """The tool-loop iteration (None for a synthesize call)."""
    prefix_messages: NonNegativeInt
    """How many request messages repeat the previous call's messages byte for byte."""
    request_messages: NonNegativeInt
    cached_tokens: NonNegativeInt = 0
    prefix_sha256: str = ""
    """Hash of the shared prefix's message digests."""
    broken_region: Literal["system", "tools", "history", "pictures"] | None = None
    """Where the prefix broke (None: the request only appended)."""
    break_reason: (
        Literal["compaction", "picture-release", "agent-changed", "unexpected-rewrite"] | None
    ) = None


class FallbackStepPayload(BaseModel):
    """One in-family retry: the rung that failed and where the call went next."""

    model_config = _CONFIG
    kind: Literal["fallbackStep"] = "fallbackStep"
    from_rung: NonNegativeInt
    from_model: str
    to_rung: NonNegativeInt | None
    to_model: str | None
    reason: str
    status_code: int | None = None


class ToolCallRef(BaseModel):
    """A tool call as the model named it."""

    model_config = _CONFIG
    tool_call_id: ToolCallId
    tool_name: str


class ToolSelectionPayload(BaseModel):
    """Which tools were offered and which the call selected."""

    model_config = _CONFIG
    kind: Literal["toolSelection"] = "toolSelection"
    offered: tuple[str, ...]
    selected: tuple[ToolCallRef, ...]


class ToolFallbackStepPayload(BaseModel):
    """A tool cascade pivot from one in-class tool to the next."""

    model_config = _CONFIG
    kind: Literal["toolFallbackStep"] = "toolFallbackStep"
    tool_call_id: ToolCallId
    tool_class: str
    from_tool: str
    to_tool: str | None
    reason: str


class SynthesisQualityPayload(BaseModel):
    """The one synthesize call: what it wrote (the same string the client rendered)."""

    model_config = _CONFIG
    kind: Literal["synthesisQuality"] = "synthesisQuality"
    answer_chars: NonNegativeInt
    answer_sha256: str
    """Hash of the exact answer string streamed to the client."""
    stop_reason: str
    tool_calls_in_turn: NonNegativeInt
    source: Literal["tool-loop", "synthesize"] = "synthesize"
    """Which call wrote the answer: the tool-loop call that named no tool (its terminal
    text is the answer, no further call), or a separate synthesis call."""
    generation_id: str | None = None
    """The answering call's generation id."""


class OutputCheckPayload(BaseModel):
    """An answer checked against the agent's `output_type` (one row per answer written)."""

    model_config = _CONFIG
    kind: Literal["outputCheck"] = "outputCheck"
    attempt: NonNegativeInt
    """0 for the first answer; n for the n-th written again after a failed check."""
    valid: bool
    problems: tuple[str, ...] = ()
    """What did not validate (at most five), as the model was told."""
    generation_id: str | None = None
    """The call that wrote the answer checked."""


class CompactionPayload(BaseModel):
    """History replaced to stay within the context window (one deliberate prefix break)."""

    model_config = _CONFIG
    kind: Literal["compaction"] = "compaction"
    strategy: Literal["summary", "keep-newest"]
    """`summary`: the utility model summarized; `keep-newest`: old turns were dropped."""
    tokens_before: NonNegativeInt
    tokens_after: NonNegativeInt
    messages_before: NonNegativeInt
    messages_after: NonNegativeInt
    context_window: PositiveInt
    model: str | None = None
    """The model that wrote the summary (None for `keep-newest`)."""
    utility_error: str | None = None
    """Why old turns were dropped although the agent has a utility model: the error code
    of its failed summary call (its rungs have their own rows)."""


class ThinkingSummaryPayload(BaseModel):
    """The turn's thinking summary, written by the utility model (its own priced call)."""

    model_config = _CONFIG
    kind: Literal["thinkingSummary"] = "thinkingSummary"
    summary_chars: NonNegativeInt
    reasoning_chars: NonNegativeInt
    """How much raw reasoning it summarized (the reasoning itself is never stored)."""


class ThreadNamingPayload(BaseModel):
    """The utility model named the session (its own priced call; no agent's work)."""

    model_config = _CONFIG
    kind: Literal["threadNaming"] = "threadNaming"
    title_chars: NonNegativeInt
    applied: bool
    """False when the session was renamed meanwhile (a person's name always wins)."""


class ProviderCascadePayload(BaseModel):
    """The whole path a cascaded call took through its family."""

    model_config = _CONFIG
    kind: Literal["providerCascade"] = "providerCascade"
    family: str
    attempts: tuple[str, ...]
    """Models tried, in order."""
    answered_rung: NonNegativeInt | None
    """None when the family ran out."""


class UnreadableEventPayload(BaseModel):
    """A committed event of the turn that an attempt could not decode and left out.

    The attempt goes on without it (its journal lacks that event). The stored bytes are
    never copied here: only where the event sits, its stored type and why it failed.
    """

    model_config = _CONFIG
    kind: Literal["unreadableEvent"] = "unreadableEvent"
    seq: PositiveInt
    """The event's position in the turn's log."""
    event_type: str
    """The type its row was stored under (what the writer meant it to be)."""
    reason: UnreadableReason
    size_bytes: NonNegativeInt
    """How long the stored payload is."""


class InterruptedBlockPayload(BaseModel):
    """Stop cut a text block while it was being written; its text so far was kept.

    The block is committed as `message.complete` with `interrupted: true`; the text
    itself stays out of the audit.
    """

    model_config = _CONFIG
    kind: Literal["interruptedBlock"] = "interruptedBlock"
    block_id: str
    chars: NonNegativeInt
    """How much text the block had when the turn was stopped."""


Decision = Literal["approve", "deny", "answer", "budget-cleared", "stopped"]
DECISIONS: tuple[Decision, ...] = ("approve", "deny", "answer", "budget-cleared", "stopped")


class PauseAnswerPayload(BaseModel):
    """Who answered a paused turn's request, when, and how (written with the answer).

    The answer's text (a note, a question's answer, changed arguments) stays out of the
    audit: the turn's events and the model's next request carry what it needs.
    """

    model_config = _CONFIG
    kind: Literal["pauseAnswer"] = "pauseAnswer"
    request_id: str
    pause: Literal["approval", "clarification", "budget"]
    decision: Decision | None = None
    """How it was answered (None: an answer of a shape turnkit does not write itself)."""
    by: str | None = None
    """The principal that answered (None: not known, as for a budget raised by an operator)."""
    at: AwareDatetime
    arguments_changed: bool = False
    """An approval that changed the call's arguments."""


class AgentRepinnedPayload(BaseModel):
    """A turn that had not started ran on its agent's current version: its own was gone.

    Written once, in `runtime`, by the attempt that re-pinned the turn, after the checks
    that depend on the agent passed for the new version (the turn record's `pinned` says
    the same: `agent_version` and `repinned_from`).
    """

    model_config = _CONFIG
    kind: Literal["agentRepinned"] = "agentRepinned"
    agent: str
    from_version: str
    """The version the turn was pinned to at submit (no longer hosted)."""
    to_version: str
    """The version it runs on."""


class AskedTurnPayload(BaseModel):
    """What an agent asked as a tool spent, recorded in the asking turn when the call ended.

    Written once per asked turn, in `tool-loop`, when its call gets its result (the
    answer, or the failure of a turn that ended `failed`, `timed_out` or `cancelled`): the
    asked turn's own totals plus what the agents it asked spent, as its own rows of this
    kind say. A call that runs again after a crash joins the same turn and adds nothing.
    """

    model_config = _CONFIG
    kind: Literal["askedTurn"] = "askedTurn"
    tool_call_id: ToolCallId
    """The asking turn's call."""
    agent: str
    session_id: SessionId
    """The asked agent's session (`tk-sub.…`)."""
    turn_id: TurnId
    """The asked agent's turn."""
    status: TerminalStatus
    """How the asked turn ended."""
    turns: PositiveInt = 1
    """Asked turns counted here: this one and those it asked, at any depth."""
    model_calls: NonNegativeInt = 0
    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    cached_tokens: NonNegativeInt = 0
    cost_usd: NonNegativeFloat = 0.0


def asked_usage(spent: Iterable[AskedTurnPayload | None]) -> AskedUsage | None:
    """The sum of `askedTurn` payloads, each asked turn once (None: there are none)."""
    by_turn = {s.turn_id: s for s in spent if s is not None}
    if not by_turn:
        return None
    rows = by_turn.values()
    return AskedUsage(
        turns=sum(s.turns for s in rows),
        model_calls=sum(s.model_calls for s in rows),
        input_tokens=sum(s.input_tokens for s in rows),
        output_tokens=sum(s.output_tokens for s in rows),
        cached_tokens=sum(s.cached_tokens for s in rows),
        cost_usd=sum(s.cost_usd for s in rows),
    )


def _unfilled(slot: object) -> bool:
    """An empty payload slot, left out of a row's JSON.

    So a turnkit from before a slot was added still reads every row that does not fill
    it (during a rolling deploy, a process of either may take a turn over).
    """
    return slot is None


class AuditPayloads(BaseModel):
    """One typed slot per payload kind; a row fills the slots its call needs."""

    model_config = _CONFIG
    plan_generation: PlanGenerationPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="planGeneration"
    )
    cache_breakpoint: CacheBreakpointPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="cacheBreakpoint"
    )
    fallback_step: FallbackStepPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="fallbackStep"
    )
    tool_selection: ToolSelectionPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="toolSelection"
    )
    tool_fallback_step: ToolFallbackStepPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="toolFallbackStep"
    )
    synthesis_quality: SynthesisQualityPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="synthesisQuality"
    )
    provider_cascade: ProviderCascadePayload | None = Field(
        default=None, exclude_if=_unfilled, alias="providerCascade"
    )
    compaction: CompactionPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="compaction"
    )
    output_check: OutputCheckPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="outputCheck"
    )
    thinking_summary: ThinkingSummaryPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="thinkingSummary"
    )
    unreadable_event: UnreadableEventPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="unreadableEvent"
    )
    thread_naming: ThreadNamingPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="threadNaming"
    )
    interrupted_block: InterruptedBlockPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="interruptedBlock"
    )
    pause_answer: PauseAnswerPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="pauseAnswer"
    )
    agent_repinned: AgentRepinnedPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="agentRepinned"
    )
    asked_turn: AskedTurnPayload | None = Field(
        default=None, exclude_if=_unfilled, alias="askedTurn"
    )

    def kinds(self) -> tuple[str, ...]:
        """Wire names of the filled slots."""
        return tuple(
            field.alias or name
            for name, field in type(self).model_fields.items()
            if getattr(self, name) is not None
        )


class AuditRow(BaseModel):
    """One audit row. `call` is None only for rows that are not model calls (tool pivots)."""

    model_config = _CONFIG
    identity: CallIdentity
    call: CallShape | None
    payloads: AuditPayloads = AuditPayloads()
    plugin_payloads: Mapping[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_a_payload_or_call(self) -> AuditRow:
        if self.call is None and not self.payloads.kinds() and not self.plugin_payloads:
            raise ValueError("an audit row without a call must carry a payload")
        return self


class UsageDelta(BaseModel):
    """What one audit row adds to the turn's usage rollup (same transaction)."""

    model_config = _CONFIG
    model_calls: NonNegativeInt = 0
    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    cached_tokens: NonNegativeInt = 0
    cost_usd: NonNegativeFloat = 0.0

    def __add__(self, other: UsageDelta) -> UsageDelta:
        """Field by field."""
        return UsageDelta(
            model_calls=self.model_calls + other.model_calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )

    @classmethod
    def of(cls, call: CallShape | None) -> UsageDelta:
        """The usage one call adds (nothing for rows that are not model calls)."""
        if call is None:
            return cls()
        return cls(
            model_calls=1,
            input_tokens=call.input_tokens,
            output_tokens=call.output_tokens,
            cached_tokens=call.cached_tokens,
            cost_usd=call.cost_usd,
        )
