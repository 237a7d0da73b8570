"""transcripts in their own table, the last request's digests on the newest row only

Each turn's transcript moves out of `tk_turns.transcript` into `tk_transcripts`, so reading
a turn record no longer reads its transcript, and a turn's starting transcript is read
from the newest history-replacing turn on. Only the session's newest kept last request
survives the move (earlier ones are never read).

Revision ID: 0008
Revises: 0007
"""

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LAST_REQUEST = sa.text("last_request IS NOT NULL")

_turns = sa.table(
    "tk_turns",
    sa.column("turn_id", sa.String),
    sa.column("session_id", sa.String),
    sa.column("input_seq", sa.Integer),
    sa.column("transcript", sa.Text),
)
_transcripts = sa.table(
    "tk_transcripts",
    sa.column("turn_id", sa.String),
    sa.column("session_id", sa.String),
    sa.column("input_seq", sa.Integer),
    sa.column("replaces_history", sa.Boolean),
    sa.column("messages", sa.Text),
    sa.column("last_request", sa.Text),
)


def upgrade() -> None:
    op.create_table(
        "tk_transcripts",
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("input_seq", sa.Integer(), nullable=False),
        sa.Column("replaces_history", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("messages", sa.Text(), nullable=False),
        sa.Column("last_request", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("turn_id"),
    )
    op.create_index("ix_transcript_session_seq", "tk_transcripts", ["session_id", "input_seq"])
    op.create_index(
        "ix_transcript_last_request",
        "tk_transcripts",
        ["session_id"],
        sqlite_where=_LAST_REQUEST,
        postgresql_where=_LAST_REQUEST,
    )
    _move_transcripts()
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.drop_column("transcript")


def _move_transcripts() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_turns.c.turn_id, _turns.c.session_id, _turns.c.input_seq, _turns.c.transcript)
        .where(_turns.c.transcript.is_not(None))
        .order_by(_turns.c.session_id, _turns.c.input_seq)
    ).all()
    moved: list[dict[str, Any]] = []
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        stored = json.loads(row.transcript)
        item = {
            "turn_id": row.turn_id,
            "session_id": row.session_id,
            "input_seq": row.input_seq,
            "replaces_history": bool(stored.get("replaces_history", False)),
            "messages": json.dumps(stored.get("messages", []), ensure_ascii=False),
            "last_request": None,
        }
        if stored.get("last_request") is not None:
            item["last_request"] = json.dumps(stored["last_request"], ensure_ascii=False)
            previous = newest.get(row.session_id)
            if previous is not None:
                previous["last_request"] = None  # only the newest is ever read
            newest[row.session_id] = item
        moved.append(item)
    for start in range(0, len(moved), 500):
        conn.execute(sa.insert(_transcripts), moved[start : start + 500])


def downgrade() -> None:
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("transcript", sa.Text(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(
            _transcripts.c.turn_id,
            _transcripts.c.replaces_history,
            _transcripts.c.messages,
            _transcripts.c.last_request,
        )
    ).all()
    for row in rows:
        stored = {
            "messages": json.loads(row.messages),
            "replaces_history": bool(row.replaces_history),
            "last_request": json.loads(row.last_request) if row.last_request else None,
        }
        conn.execute(
            sa.update(_turns)
            .where(_turns.c.turn_id == row.turn_id)
            .values(transcript=json.dumps(stored, ensure_ascii=False))
        )
    op.drop_index("ix_transcript_last_request", table_name="tk_transcripts")
    op.drop_index("ix_transcript_session_seq", table_name="tk_transcripts")
    op.drop_table("tk_transcripts")
