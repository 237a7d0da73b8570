"""a session belongs to its principal within an organisation

Sessions kept only their principal's id, so two callers with the same id in different
organisations shared each other's sessions. The session now keeps its owner's
organisation too. Existing sessions take their first turn's organisation; one with no
turn yet keeps none, and stays matched by the principal's id alone.

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_sessions") as batch:
        batch.add_column(sa.Column("organisation", sa.String(length=128), nullable=True))
    op.execute(
        "UPDATE tk_sessions SET organisation = ("
        " SELECT t.organisation FROM tk_turns t WHERE t.session_id = tk_sessions.session_id"
        " ORDER BY t.input_seq LIMIT 1"
        ") WHERE principal IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("tk_sessions") as batch:
        batch.drop_column("organisation")
