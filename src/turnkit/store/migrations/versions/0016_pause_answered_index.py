"""an index on when each pause was answered

A budget limit's use counts what turns begun before its period spent after a request of
theirs was answered in it; the index finds those answers without reading every pause.

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_pauses") as batch:
        batch.create_index("ix_tk_pauses_answered_at", ["answered_at"])


def downgrade() -> None:
    with op.batch_alter_table("tk_pauses") as batch:
        batch.drop_index("ix_tk_pauses_answered_at")
