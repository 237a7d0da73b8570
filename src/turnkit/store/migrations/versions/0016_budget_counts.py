"""each budget limit counts what its current period has spent

A model call's commit adds its spend to the limits covering its turn, so a budget check
reads one row instead of summing the organisation's whole usage history. Existing limits
start uncounted (`spent_period` NULL): the first write that checks one counts it from the
usage rollup.

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_budget_limits") as batch:
        batch.add_column(sa.Column("spent_period", sa.String(length=16), nullable=True))
        batch.add_column(
            sa.Column("spent_usd", sa.Float(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(
            sa.Column("spent_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("tk_budget_limits") as batch:
        batch.drop_column("spent_tokens")
        batch.drop_column("spent_usd")
        batch.drop_column("spent_period")
