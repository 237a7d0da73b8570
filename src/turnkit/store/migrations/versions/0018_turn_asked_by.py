"""a turn of an agent asked as a tool names the turn that asked it

An agent offered as a tool (`Agent.as_tool`) answers each call in a turn of its own. That
turn now keeps the id of the asking turn, written with it, so an ending of the asking turn
other than its success stops it in the same transaction even when the asking turn was
never handed one of its requests (it was still working). Existing turns keep none: for
them the asking turn's saved requests still tell.

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ASKED = sa.text("asked_by IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("tk_turns") as batch:
        batch.add_column(sa.Column("asked_by", sa.String(length=64), nullable=True))
    op.create_index(
        "ix_turn_asked_by",
        "tk_turns",
        ["asked_by"],
        sqlite_where=_ASKED,
        postgresql_where=_ASKED,
    )


def downgrade() -> None:
    op.drop_index("ix_turn_asked_by", table_name="tk_turns")
    with op.batch_alter_table("tk_turns") as batch:
        batch.drop_column("asked_by")
