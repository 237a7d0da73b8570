"""a session a delegated agent's turns run in names the session that asked

An agent offered as a tool (`Agent.as_tool`) answers in a session of its own; that
session keeps the asking session's id, so lists leave it out and deleting the asking
session deletes it too. Existing sessions asked for by nobody keep none.

Revision ID: 0015
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_sessions") as batch:
        batch.add_column(sa.Column("parent_session", sa.String(length=128), nullable=True))
        batch.create_index("ix_tk_sessions_parent_session", ["parent_session"])


def downgrade() -> None:
    with op.batch_alter_table("tk_sessions") as batch:
        batch.drop_index("ix_tk_sessions_parent_session")
        batch.drop_column("parent_session")
