"""token limits and reservations in 64-bit columns

A token limit may be up to 2^62 (`BudgetLimit.tokens`), but its column held 32 bits: an
organisation's monthly cap over 2,147,483,647 tokens failed to store (a 500 over HTTP).

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_budget_limits") as batch:
        batch.alter_column("tokens", type_=sa.BigInteger(), existing_type=sa.Integer())
    with op.batch_alter_table("tk_budget_reservations") as batch:
        batch.alter_column(
            "tokens", type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False
        )


def downgrade() -> None:
    # A limit past 32 bits cannot go back: it becomes the largest the old column holds.
    for table in ("tk_budget_limits", "tk_budget_reservations"):
        op.execute(f"UPDATE {table} SET tokens = 2147483647 WHERE tokens > 2147483647")
    with op.batch_alter_table("tk_budget_reservations") as batch:
        batch.alter_column(
            "tokens", type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False
        )
    with op.batch_alter_table("tk_budget_limits") as batch:
        batch.alter_column("tokens", type_=sa.Integer(), existing_type=sa.BigInteger())
