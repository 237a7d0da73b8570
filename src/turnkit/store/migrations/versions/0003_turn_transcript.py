"""turn transcript and attachments

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attachments", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("transcript", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.drop_column("transcript")
        batch_op.drop_column("attachments")
