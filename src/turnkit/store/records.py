"""The Store's records: what it is given and what it answers (sessions, turns, events).

Plain values, no behaviour beyond decoding: the protocols in `turnkit.store` pass them in
and out, and every adapter builds them the same way. Import them from `turnkit.store`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from turnkit.audit import UnreadableReason
from turnkit.blocks import ImagePart
from turnkit.events import AskedUsage, StreamEvent, ToolTiming, TurnStartedEvent, decode_event
from turnkit.ids import SessionId, TurnId
from turnkit.states import TurnStatus

__all__ = (
    "readable",
    "skip_unreadable",
    "ClaimRequest",
    "CommitResult",
    "Delivery",
    "KeptTranscript",
    "KeptTurn",
    "Lease",
    "NewInput",
    "Rider",
    "RunSummary",
    "SessionRecord",
    "StoredEvent",
    "Submission",
    "TurnProgress",
    "TurnRecord",
    "TurnTranscript",
    "UnreadableEvent",
    "decode_events",
    "readable_events",
)

log = logging.getLogger("turnkit.store")

Delivery = Literal["queue", "guide"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewInput:
    """A user message to commit, and the turn it opens (edge class: no lease)."""

    session_id: SessionId
    turn_id: TurnId
    content: str
    request_id: str | None
    delivery: Delivery
    agent: str
    model: str
    effort: Literal["off", "low", "medium", "high"]
    pinned: dict[str, JsonValue]
    """The configuration the run is pinned to (model, effort, tools), kept for audit."""
    principal: str | None = None
    organisation: str | None = None
    department: str | None = None
    """Who the turn spends for (budgets, usage by department)."""
    attachments: tuple[ImagePart, ...] = ()
    """Pictures attached to the message."""
    create_session: bool = True
    """Create the session if it does not exist (otherwise: `SessionNotFoundError`)."""
    claim_for: ClaimRequest | None = None
    """Claim the new turn in the same transaction, when its session lets it run now."""
    title: str | None = None
    """The name an unnamed session takes with its first message, in the same transaction."""
    anonymous_caller: bool = False
    """Sent by a caller nobody signed in (not the app's own code): with no principal it
    goes only into a session nobody owns, checked in the same transaction that writes it."""
    asked_by: TurnId | None = None
    """The turn whose agent asks this message's agent as a tool (`Agent.as_tool`), kept on
    the new turn: an ending of that turn other than its success stops this one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """Who claims, for how long, with how many attempts."""

    owner: str
    ttl_s: float
    max_attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """A session: who owns it and what it is called."""

    session_id: SessionId
    principal: str | None
    title: str | None
    last_input_seq: int
    created_at: datetime
    updated_at: datetime
    organisation: str | None = None
    """The owner's organisation (None: no owner, or a session from before it was kept)."""
    parent_session: SessionId | None = None
    """The session whose turn asked the agent answering here (`Agent.as_tool`); such a
    session is left out of lists and deleted with the session that asked."""
    is_new: bool = field(default=False, compare=False)
    """True on the record `create_session` returns when that very call created the
    session; False when it was there already (another caller's create may have won the
    race) and on every record read back."""

    def visible_to(self, principal: str | None, organisation: str | None) -> bool:
        """Whether the caller `principal` of `organisation` may see the session.

        A session nobody owns is everyone's; an owned one is its principal's, in its
        organisation (two callers with one id in two organisations are two callers).
        """
        if self.principal is None:
            return True
        return self.principal == principal and self.organisation in (None, organisation)


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """What committing an input did. A retried `request_id` returns the first submission."""

    session_id: SessionId
    turn_id: TurnId
    input_seq: int
    delivery: Delivery
    requested_delivery: Delivery
    is_new: bool
    guided: bool = False
    """The message joined a running turn (`turn_id`) instead of opening one."""
    lease: Lease | None = None
    """Set when `NewInput.claim_for` claimed the new turn in the same transaction."""
    record: TurnRecord | None = None
    """The turn as committed, when it was claimed here."""
    started: TurnStartedEvent | None = None
    """The committed first event of a new turn."""


class TurnTranscript(BaseModel):
    """What a turn added to its session's model-facing transcript, kept exactly as sent.

    The next turn's first request starts with the session's transcript, so it repeats
    the bytes of this turn's last request (the provider's prompt cache matches on them).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    messages: tuple[dict[str, JsonValue], ...]
    """The messages, in order: the turn's own, or the whole list when `replaces_history`."""
    replaces_history: bool = False
    """Compaction or picture release rewrote history: `messages` is the whole list."""
    last_request: dict[str, JsonValue] | None = None
    """Digests of the turn's last reasoning request (for the next turn's prefix check).

    Stores keep it for the session's newest turn only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptTurn:
    """One earlier turn's part of its session's transcript, as the Store keeps it."""

    turn_id: TurnId
    input_seq: int
    transcript: TurnTranscript | None
    """What the turn stored as it ended (None: it stored nothing, see `record`)."""
    record: TurnRecord | None = None
    """The turn, when it stored no transcript: it ended without a driver (a sweep, or
    Stop before it ran) or before transcripts were kept."""
    answer: str | None = None
    """Its answer text, when it stored no transcript and wrote one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptTranscript:
    """What a turn's starting transcript is built from (`TurnLedger.kept_transcript`)."""

    turns: tuple[KeptTurn, ...]
    continues: bool = False
    """The turns follow the caller's `after` turn (False: they are the whole history)."""
    last_request: dict[str, JsonValue] | None = None
    """The newest last request among the turns (None: none kept one, or, when
    `continues`, the newest is at or before `after`)."""


class RunSummary(BaseModel):
    """The attempt's own account, written when the run settles (as `run.finished`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    status: TurnStatus
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    tool_timings: tuple[tuple[str, float], ...] = ()
    """(tool name, duration in ms) per tool call, in order."""
    context_messages: int = 0
    context_tokens: int = 0
    """Input plus output tokens of the turn's latest call on its own model."""
    stop_reason: str | None = None
    error_code: str | None = None
    duration_ms: float = 0.0
    model: str = ""
    attempt: int = 1
    skipped_events: int = 0
    """Committed events of the turn this attempt could not decode and went on without."""
    recoveries: int = 0
    """Takeovers of the turn after its driver died (`turn.recovering` events)."""
    # Written only when set: a turnkit from before it reads every other turn's summary.
    asked: AskedUsage | None = Field(default=None, exclude_if=lambda asked: asked is None)
    """What the agents the turn asked as tools spent, apart from the totals above (None:
    it asked none)."""

    def event_fields(self) -> dict[str, Any]:
        """The account as `run.finished`'s fields (the event adds where and when)."""
        fields = self.model_dump(exclude={"tool_timings"})
        fields["tool_timings"] = tuple(
            ToolTiming(tool=name, duration_ms=ms) for name, ms in self.tool_timings
        )
        return fields


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """A turn as the Store holds it."""

    turn_id: TurnId
    session_id: SessionId
    input_seq: int
    status: TurnStatus
    content: str
    request_id: str | None
    agent: str
    model: str
    error_code: str | None
    last_seq: int
    lease_epoch: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    attempts: int
    pinned: dict[str, JsonValue]
    summary: RunSummary | None
    started_at: datetime | None
    created_at: datetime
    updated_at: datetime
    attachments: tuple[ImagePart, ...] = ()
    """Pictures attached to the opening message."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnProgress:
    """Where a turn stands: the part of its record a reader follows (cheap to read)."""

    turn_id: TurnId
    status: TurnStatus
    last_seq: int
    attempts: int
    lease_owner: str | None
    lease_expires_at: datetime | None

    @classmethod
    def of(cls, record: TurnRecord) -> TurnProgress:
        """The progress part of a full record."""
        return cls(
            turn_id=record.turn_id,
            status=record.status,
            last_seq=record.last_seq,
            attempts=record.attempts,
            lease_owner=record.lease_owner,
            lease_expires_at=record.lease_expires_at,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """The right to drive one turn: every commit carries `epoch` (the fencing token)."""

    turn_id: TurnId
    session_id: SessionId
    owner: str
    epoch: int
    expires_at: datetime
    attempt: int
    """1 for the first attempt; higher after a takeover."""
    took_over: bool
    """Whether this claim took over an expired one (the previous driver died or left)."""
    last_seq: int
    started_at: datetime
    cancel_requested: bool = False
    """Someone pressed Stop: the driver ends the turn `cancelled` (this renewal tells it)."""
    handed_over: bool = False
    """The previous driver handed the turn over as its worker shut down (`hand_over`)
    rather than dying: `took_over` too, but nothing went wrong."""
    record: TurnRecord | None = field(default=None, compare=False, repr=False)
    """The turn as the claim left it, where the claim read it anyway (PostgreSQL), so
    its driver starts without reading it again; None: read it with `get_turn`."""

    @property
    def token(self) -> str:
        """`owner@epoch`."""
        return f"{self.owner}@{self.epoch}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitResult:
    """What a commit learned on the way."""

    newest_guide_seq: int = 0
    """The newest guide message attached to the turn (0: none)."""
    requeued: int = 0
    """Guide messages re-queued as turns of their own by this (terminal) commit."""
    stopped_asked: tuple[TurnId, ...] = ()
    """The turns of agents the turn asked that this ending stopped or flagged for their
    drivers (an ending other than a success; see `Store.commit`)."""
    carried: bool = False
    """The commit's `rider` was written in the same statement (see `Rider`)."""


@dataclass(frozen=True, slots=True)
class Rider:
    """More writes for a commit to carry in its own statement, under its lease fence.

    PostgreSQL only (elsewhere a rider is never carried): `ctes` are data-modifying
    common table expressions (`name AS (...), ...`) appended to the commit's statement,
    each writing only `WHERE EXISTS (SELECT FROM fence)`, so a stale lease writes
    neither the commit nor its rider. Their parameters are written `{0}`, `{1}`, ... and
    take `args` in that order. A checkpoint rides with its super-step's events this way:
    one round trip, and never one without the other.
    """

    ctes: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """A committed durable event: its position and the exact bytes clients receive."""

    turn_id: TurnId
    seq: int
    type: str
    data: bytes

    def decode(self) -> StreamEvent:
        """The typed event."""
        return decode_event(self.data)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnreadableEvent:
    """A committed event this version could not decode: where it sits and why (no bytes)."""

    turn_id: TurnId
    seq: int
    type: str
    """The type its row was stored under."""
    reason: UnreadableReason
    size_bytes: int


async def decode_events(
    stored: AsyncIterator[StoredEvent],
) -> tuple[list[StreamEvent], list[UnreadableEvent]]:
    """Decode committed events; those this version cannot read are set aside (logged).

    A payload written by a newer version (an event type this one does not know) or
    damaged in storage must not fail a run or a history read: it is left out with a
    warning on `turnkit.store`, the events around it are kept, and it is returned beside
    them so a driver can count and audit it.
    """
    events: list[StreamEvent] = []
    skipped: list[UnreadableEvent] = []
    async for item in stored:
        decoded = _decoded(item)
        if isinstance(decoded, UnreadableEvent):
            skipped.append(decoded)
        else:
            events.append(decoded)
    return events, skipped


def _decoded(item: StoredEvent) -> StreamEvent | UnreadableEvent:
    """The event, or what says why this version cannot read it (logged)."""
    try:
        return item.decode()
    except ValueError as exc:
        reason = _unreadable_reason(exc)
        log.warning(
            "skipped unreadable event seq %d (%s) of turn %s: %s",
            item.seq,
            item.type,
            item.turn_id,
            reason,
        )
        return UnreadableEvent(
            turn_id=item.turn_id,
            seq=item.seq,
            type=item.type,
            reason=reason,
            size_bytes=len(item.data),
        )


def readable(item: StoredEvent) -> StreamEvent | None:
    """The event, or None for one this version cannot read (logged)."""
    decoded = _decoded(item)
    return None if isinstance(decoded, UnreadableEvent) else decoded


async def skip_unreadable(stored: AsyncIterator[StoredEvent]) -> AsyncIterator[StreamEvent]:
    """The committed events this version can read; the others logged and left out.

    The streaming form of `decode_events`, for reads that hold no lease to audit with
    (`runtime.events`, the replay of a retried request).
    """
    async for item in stored:
        event = readable(item)
        if event is not None:
            yield event


async def readable_events(stored: AsyncIterator[StoredEvent]) -> list[StreamEvent]:
    """The committed events this version can read (see `decode_events`)."""
    events, _ = await decode_events(stored)
    return events


def _unreadable_reason(exc: ValueError) -> UnreadableReason:
    errors = {e["type"] for e in exc.errors()} if isinstance(exc, ValidationError) else set()
    if "json_invalid" in errors or not errors:
        return "invalid-json"
    if "union_tag_invalid" in errors:
        return "unknown-type"
    return "invalid-fields"
