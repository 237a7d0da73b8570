"""index a session's turns by input seq

A turn's start asks which of its session's turns since the transcript it holds stored no
transcript of their own. With this index that is a range of a few index entries instead
of a walk over every turn the session ever had, so a long session's late turns start as
cheaply as its early ones.

Revision ID: 0017
Revises: 0016
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_turn_session_seq", "tk_turns", ["session_id", "input_seq"])


def downgrade() -> None:
    op.drop_index("ix_turn_session_seq", table_name="tk_turns")
