"""keep the newest guide message of a turn on its row

A guide message for a running turn now also writes its input seq on the turn's row. A
commit reads it there instead of scanning the turn's inputs, and on PostgreSQL a turn's
ending can check in one statement that it presented every guide: a guide committed while
the ending waited for the row is seen, because the row itself changed.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_turns") as batch:
        batch.add_column(
            sa.Column("newest_guide_seq", sa.Integer(), nullable=False, server_default="0")
        )
    # Only turns a guide joined: the default covers the rest, and their rows stay untouched.
    op.execute(
        "UPDATE tk_turns SET newest_guide_seq = (SELECT max(i.seq) FROM tk_inputs i "
        "WHERE i.turn_id = tk_turns.turn_id AND i.delivery = 'guide') "
        "WHERE turn_id IN (SELECT turn_id FROM tk_inputs WHERE delivery = 'guide')"
    )


def downgrade() -> None:
    with op.batch_alter_table("tk_turns") as batch:
        batch.drop_column("newest_guide_seq")
