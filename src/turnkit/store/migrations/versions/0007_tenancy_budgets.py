"""tenancy on turns, budget limits and reservations

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("organisation", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("department", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("principal", sa.String(length=256), nullable=True))
    op.create_table(
        "tk_budget_limits",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("organisation", sa.String(length=128), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("usd", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "organisation", "key", "period"),
    )
    op.create_table(
        "tk_budget_reservations",
        sa.Column("reservation_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("organisation", sa.String(length=128), nullable=False),
        sa.Column("department", sa.String(length=128), nullable=False),
        sa.Column("principal", sa.String(length=256), nullable=True),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("reservation_id"),
    )
    op.create_index("ix_tk_budget_reservations_turn_id", "tk_budget_reservations", ["turn_id"])
    op.create_index(
        "ix_budget_reservation_org", "tk_budget_reservations", ["organisation", "expires_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_budget_reservation_org", table_name="tk_budget_reservations")
    op.drop_index("ix_tk_budget_reservations_turn_id", table_name="tk_budget_reservations")
    op.drop_table("tk_budget_reservations")
    op.drop_table("tk_budget_limits")
    with op.batch_alter_table("tk_turns", schema=None) as batch_op:
        batch_op.drop_column("principal")
        batch_op.drop_column("department")
        batch_op.drop_column("organisation")
