"""Schema migrations for the SQL store (Alembic), as `turnkit db upgrade` and on start."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

__all__ = ("current_revision", "head_revision", "upgrade")

_SCRIPTS = Path(__file__).parent / "migrations"


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Bring the schema on `connection` up to `revision` (inside its transaction)."""
    command.upgrade(_config(connection), revision)


def current_revision(connection: Connection) -> str | None:
    """The schema revision the database is at (None: no turnkit tables yet)."""
    ctx = MigrationContext.configure(connection, opts={"version_table": "tk_alembic_version"})
    return ctx.get_current_revision()


def head_revision() -> str:
    """The newest revision this turnkit version ships."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head
