"""SQLModel table definitions; private to the store package.

Schema changes go through an Alembic migration in `store/migrations/versions/`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlmodel import Field, SQLModel

metadata = SQLModel.metadata


def _ts(*, nullable: bool = False) -> Column[datetime]:
    return Column(DateTime(timezone=True), nullable=nullable)


class SessionRow(SQLModel, table=True):
    __tablename__ = "tk_sessions"
    session_id: str = Field(primary_key=True, max_length=128)
    title: str | None = None
    principal: str | None = Field(default=None, index=True, max_length=256)
    organisation: str | None = Field(default=None, max_length=128)
    """The owner's organisation (None: no owner, or a session older than this column)."""
    parent_session: str | None = Field(default=None, index=True, max_length=128)
    """The session whose turn asked a delegated agent (None: a conversation of its own)."""
    last_input_seq: int = 0
    created_at: datetime = Field(sa_column=_ts())
    updated_at: datetime = Field(sa_column=_ts())


class InputRow(SQLModel, table=True):
    """A committed user message; `request_id` is its idempotency key."""

    __tablename__ = "tk_inputs"
    __table_args__ = (UniqueConstraint("session_id", "request_id", name="uq_input_request"),)
    session_id: str = Field(primary_key=True, max_length=128)
    seq: int = Field(primary_key=True)
    request_id: str | None = Field(default=None, max_length=128)
    content: str = Field(sa_column=Column(Text, nullable=False))
    requested_delivery: str = Field(max_length=8)
    delivery: str = Field(max_length=8)
    turn_id: str = Field(max_length=64, index=True)
    created_at: datetime = Field(sa_column=_ts())


class TurnRow(SQLModel, table=True):
    """A turn and its run: status, lease (owner@epoch), attempts and settle summary."""

    __tablename__ = "tk_turns"
    __table_args__ = (
        Index("ix_turn_session_created", "session_id", "created_at"),
        Index("ix_turn_claimable", "status", "lease_expires_at"),
        # "does an earlier turn of this session still run?" (every claim asks it)
        Index("ix_turn_session_open", "session_id", "status", "input_seq"),
        # a session's turns in a range of input seqs (a turn's start reads those since
        # the transcript it holds)
        Index("ix_turn_session_seq", "session_id", "input_seq"),
        # the turns of the agents a turn asked as tools (an ending other than its success
        # stops them); only those turns are in it
        Index(
            "ix_turn_asked_by",
            "asked_by",
            sqlite_where=text("asked_by IS NOT NULL"),
            postgresql_where=text("asked_by IS NOT NULL"),
        ),
    )
    turn_id: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(max_length=128)
    input_seq: int = 0
    status: str = Field(max_length=32)
    content: str = Field(sa_column=Column(Text, nullable=False))
    request_id: str | None = Field(default=None, max_length=128)
    agent: str
    model: str
    error_code: str | None = None
    last_seq: int = 0
    lease_epoch: int = 0
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    attempts: int = 0
    spent_attempts: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    """Attempts that ended without progress: what `max_attempts` bounds."""
    claim_seq: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    """`last_seq` when the current attempt claimed the turn."""
    newest_guide_seq: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    """The input seq of the newest guide message attached to the turn (0: none)."""
    cancel_requested: bool = Field(
        default=False, sa_column=Column(Boolean, nullable=False, server_default=false())
    )
    pinned: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    summary: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    attachments: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """Pictures attached to the opening message (JSON), if any."""
    organisation: str | None = Field(default=None, max_length=128)
    department: str | None = Field(default=None, max_length=128)
    principal: str | None = Field(default=None, max_length=256)
    """Who the turn spends for (budgets, usage by department): fixed at submit."""
    asked_by: str | None = Field(default=None, max_length=64)
    """The turn whose agent asked this turn's as a tool (None: a turn of its own)."""
    started_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    created_at: datetime = Field(sa_column=_ts())
    updated_at: datetime = Field(sa_column=_ts())


class TranscriptRow(SQLModel, table=True):
    """What an ended turn added to its session's model-facing transcript, kept as sent.

    One row per turn, written in the transaction that ends it. `last_request` (the
    digests of the turn's last reasoning request) is kept on the session's newest row
    only: the next turn's prefix check is its one reader.
    """

    __tablename__ = "tk_transcripts"
    __table_args__ = (
        Index("ix_transcript_session_seq", "session_id", "input_seq"),
        Index(
            "ix_transcript_last_request",
            "session_id",
            sqlite_where=text("last_request IS NOT NULL"),
            postgresql_where=text("last_request IS NOT NULL"),
        ),
    )
    turn_id: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(max_length=128)
    input_seq: int
    replaces_history: bool = Field(
        default=False, sa_column=Column(Boolean, nullable=False, server_default=false())
    )
    """Compaction or picture release rewrote history: `messages` is the whole list."""
    messages: str = Field(sa_column=Column(Text, nullable=False))
    """The messages as a JSON list (the turn's own, or the whole list)."""
    last_request: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class EventRow(SQLModel, table=True):
    """Committed durable events; the primary key is UNIQUE(turn_id, seq)."""

    __tablename__ = "tk_events"
    turn_id: str = Field(primary_key=True, max_length=64)
    seq: int = Field(primary_key=True)
    type: str = Field(max_length=48)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class AuditRowTable(SQLModel, table=True):
    """No foreign key into the chat tables: audit has its own retention."""

    __tablename__ = "tk_audit"
    turn_id: str = Field(primary_key=True, max_length=64)
    seq_within_turn: int = Field(primary_key=True)
    session_id: str = Field(max_length=128, index=True)
    stage_id: str = Field(max_length=32)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class UsageRollupRow(SQLModel, table=True):
    __tablename__ = "tk_usage"
    turn_id: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(max_length=128, index=True)
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    organisation: str | None = Field(default=None, max_length=128)
    department: str | None = Field(default=None, max_length=128)
    principal: str | None = Field(default=None, max_length=256)
    created_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))
    """Who the turn spent for, and when: copied from its row as its session is deleted
    (until then the turn's row says it), so budgets and usage reports keep the spend."""


class PauseRow(SQLModel, table=True):
    """An approval or clarification request a paused turn waits on."""

    __tablename__ = "tk_pauses"
    request_id: str = Field(primary_key=True, max_length=64)
    turn_id: str = Field(max_length=64, index=True)
    session_id: str = Field(max_length=128)
    kind: str = Field(max_length=16)
    payload: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(max_length=16)
    answer: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(sa_column=_ts())
    answered_at: datetime | None = Field(default=None, sa_column=_ts(nullable=True))


class WorkspaceFileRow(SQLModel, table=True):
    """A file in a session's workspace; `version` grows by one per change."""

    __tablename__ = "tk_workspace_files"
    session_id: str = Field(primary_key=True, max_length=128)
    path: str = Field(primary_key=True, max_length=200)
    content: str = Field(sa_column=Column(Text, nullable=False))
    media_type: str = Field(max_length=127)
    size: int
    version: int
    turn_id: str | None = Field(default=None, max_length=64)
    updated_at: datetime = Field(sa_column=_ts())


class BudgetLimitRow(SQLModel, table=True):
    """A spending limit of one scope member (organisation, department, principal, session)."""

    __tablename__ = "tk_budget_limits"
    scope: str = Field(primary_key=True, max_length=16)
    organisation: str = Field(primary_key=True, max_length=128)
    key: str = Field(primary_key=True, max_length=256)
    period: str = Field(primary_key=True, max_length=8)
    usd: float | None = None
    tokens: int | None = Field(default=None, sa_type=BigInteger)
    updated_at: datetime = Field(sa_column=_ts())
    spent_period: str | None = Field(default=None, max_length=16)
    """The period `spent_usd` and `spent_tokens` count (`2026-12-06`, `2026-12`, `total`);
    None until first counted (see `_budget_counts`)."""
    spent_usd: float = Field(
        default=0.0, sa_column=Column(Float, nullable=False, server_default=text("0"))
    )
    spent_tokens: int = Field(
        default=0, sa_column=Column(BigInteger, nullable=False, server_default=text("0"))
    )


class BudgetReservationRow(SQLModel, table=True):
    """What a model call in flight may still cost; released when its usage is recorded."""

    __tablename__ = "tk_budget_reservations"
    __table_args__ = (Index("ix_budget_reservation_org", "organisation", "expires_at"),)
    reservation_id: str = Field(primary_key=True, max_length=64)
    turn_id: str = Field(max_length=64, index=True)
    organisation: str = Field(max_length=128)
    department: str = Field(max_length=128)
    principal: str | None = Field(default=None, max_length=256)
    session_id: str = Field(max_length=128)
    usd: float = 0.0
    tokens: int = Field(default=0, sa_type=BigInteger)
    expires_at: datetime = Field(sa_column=_ts())
