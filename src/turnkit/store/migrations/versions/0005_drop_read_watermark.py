"""drop tk_turns.read_watermark: written at every claim, never read

Guide messages a turn never presented are found through `guides_consumed_through` at the
settle commit, so nothing needs the column. Processes of an older turnkit write it in
their claims and submits: upgrade them all before (or while) this revision is applied.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.drop_column("read_watermark")


def downgrade() -> None:
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("read_watermark", sa.Integer(), nullable=False, server_default="0")
        )
