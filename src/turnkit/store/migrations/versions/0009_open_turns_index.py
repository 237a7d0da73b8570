"""index a session's turns by status and input seq

A message's turn is claimed at once only when no earlier turn of its session is
unfinished, and a worker's claim asks the same. With this index that question is a few
index probes instead of a scan of every turn the session ever had.

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_turn_session_open", "tk_turns", ["session_id", "status", "input_seq"])


def downgrade() -> None:
    op.drop_index("ix_turn_session_open", table_name="tk_turns")
