"""tell listening workers when a turn becomes claimable (PostgreSQL)

A worker with room used to find new work only at its next poll. Now a trigger on
`tk_turns` sends `NOTIFY turnkit_work` (its payload the table's schema) when a turn
becomes claimable: inserted unclaimed, put back unclaimed (a pause answered, a budget
with room again), or when a turn ends while a later turn of its session waits. The
notification is delivered when the writing transaction commits. A lease that lapses is
not announced: workers still poll for those. SQLite has no notifications: nothing here.

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNFINISHED = "('running', 'awaiting_approval', 'awaiting_input', 'awaiting_budget')"

_FUNCTION = f"""
CREATE OR REPLACE FUNCTION tk_notify_claimable() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.status = 'running' AND NEW.lease_owner IS NULL THEN
        PERFORM pg_notify('turnkit_work', TG_TABLE_SCHEMA);
    ELSIF NEW.status NOT IN {_UNFINISHED} AND EXISTS (
        SELECT 1 FROM tk_turns t
        WHERE t.session_id = NEW.session_id AND t.status = 'running'
          AND t.input_seq > NEW.input_seq AND t.lease_owner IS NULL
    ) THEN
        PERFORM pg_notify('turnkit_work', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$
"""

_ON_INSERT = """
CREATE TRIGGER tk_turns_claimable_insert AFTER INSERT ON tk_turns FOR EACH ROW
WHEN (NEW.status = 'running' AND NEW.lease_owner IS NULL)
EXECUTE FUNCTION tk_notify_claimable()
"""

_ON_UPDATE = f"""
CREATE TRIGGER tk_turns_claimable_update AFTER UPDATE OF status, lease_owner ON tk_turns
FOR EACH ROW WHEN (
    (NEW.status = 'running' AND NEW.lease_owner IS NULL
     AND (OLD.status <> 'running' OR OLD.lease_owner IS NOT NULL))
    OR (OLD.status IN {_UNFINISHED} AND NEW.status NOT IN {_UNFINISHED})
)
EXECUTE FUNCTION tk_notify_claimable()
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_FUNCTION)
    op.execute(_ON_INSERT)
    op.execute(_ON_UPDATE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS tk_turns_claimable_update ON tk_turns")
    op.execute("DROP TRIGGER IF EXISTS tk_turns_claimable_insert ON tk_turns")
    op.execute("DROP FUNCTION IF EXISTS tk_notify_claimable()")
