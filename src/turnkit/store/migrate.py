"""Schema migrations for the SQL store (Alembic), as `turnkit db upgrade` and on start."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection

from turnkit.errors import StoreError

__all__ = ("current_revision", "head_revision", "is_newer", "refuse_newer", "upgrade")

_SCRIPTS = Path(__file__).parent / "migrations"


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Bring the schema on `connection` up to `revision` (inside its transaction).

    Raises:
        StoreError: the schema was written by a newer turnkit (a rollback): nothing is
            changed, and this turnkit cannot use it.
    """
    refuse_newer(current_revision(connection))
    command.upgrade(_config(connection), revision)


def is_newer(revision: str) -> bool:
    """Whether `revision` is one this turnkit does not ship: a newer turnkit wrote it."""
    try:
        return _shipped().get_revision(revision) is None
    except CommandError:
        return True


def refuse_newer(revision: str | None) -> None:
    """Refuse a schema a newer turnkit wrote (a rollback): this one cannot use it.

    Raises:
        StoreError: `revision` is one this turnkit does not ship.
    """
    if revision is None or not is_newer(revision):
        return
    raise StoreError(
        f"the database schema is at {revision!r}, written by a newer turnkit (this one "
        f"knows up to {head_revision()!r}): run that turnkit, or downgrade the schema with it",
        revision=revision,
    )


@functools.cache
def _shipped() -> ScriptDirectory:
    """The migration scripts this turnkit ships, read once a process."""
    return ScriptDirectory.from_config(_config())


def current_revision(connection: Connection) -> str | None:
    """The schema revision the database is at (None: no turnkit tables yet)."""
    ctx = MigrationContext.configure(connection, opts={"version_table": "tk_alembic_version"})
    return ctx.get_current_revision()


def head_revision() -> str:
    """The newest revision this turnkit version ships."""
    head = _shipped().get_current_head()
    assert head is not None
    return head
