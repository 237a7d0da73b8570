"""SQLModel table definitions; private to the store package."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, DateTime, Index, LargeBinary, UniqueConstraint
from sqlmodel import Field, SQLModel

metadata = SQLModel.metadata


def _ts(**kwargs: object) -> Column[datetime]:
    return Column(DateTime(timezone=True), nullable=False, **kwargs)  # type: ignore[arg-type]


class SessionRow(SQLModel, table=True):
    __tablename__ = "tk_sessions"
    session_id: str = Field(primary_key=True, max_length=128)
    title: str | None = None
    principal: str | None = Field(default=None, index=True)
    created_at: datetime = Field(sa_column=_ts())
    updated_at: datetime = Field(sa_column=_ts())


class TurnRow(SQLModel, table=True):
    __tablename__ = "tk_turns"
    __table_args__ = (
        UniqueConstraint("session_id", "request_id", name="uq_turn_request"),
        Index("ix_turn_session_created", "session_id", "created_at"),
    )
    turn_id: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(max_length=128)
    status: str = Field(max_length=32)
    content: str
    request_id: str | None = Field(default=None, max_length=128)
    agent: str
    model: str
    error_code: str | None = None
    last_seq: int = 0
    lease_epoch: int = 1
    created_at: datetime = Field(sa_column=_ts())
    updated_at: datetime = Field(sa_column=_ts())


class EventRow(SQLModel, table=True):
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
