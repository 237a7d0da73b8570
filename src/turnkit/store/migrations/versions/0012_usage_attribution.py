"""keep who spent a deleted session's usage on its rollup rows

Budgets and usage reports read who a turn spent for (organisation, department, principal,
when) from the turn's row. Deleting a session deletes its turns, so its spend vanished
from every budget and report: deleting a chat reset its owner's budget. Now the session's
rollup rows take that attribution over as its turns are deleted, and readers fall back to
it when the turn is gone. Rows are written only then: the hot path is unchanged. Spend of
sessions deleted before this revision is gone already; nothing to fill in.

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_usage") as batch:
        batch.add_column(sa.Column("organisation", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("department", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("principal", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("created_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tk_usage") as batch:
        for name in ("created_at", "principal", "department", "organisation"):
            batch.drop_column(name)
