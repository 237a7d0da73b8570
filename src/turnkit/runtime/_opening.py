"""Opening a runtime's own Store: connect, then migrate or check the schema."""

from __future__ import annotations

from turnkit.clock import Clock
from turnkit.config import RuntimeConfig
from turnkit.errors import ConfigurationError
from turnkit.store.migrate import head_revision
from turnkit.store.sql import SqlStore

__all__ = ("open_store",)


async def open_store(config: RuntimeConfig, clock: Clock) -> SqlStore:
    """The Store `config.database_url` names, its schema at this turnkit's revision.

    With `auto_migrate` the schema is brought up to date; without, one at another
    revision raises `ConfigurationError`. A database that cannot be reached leaves
    nothing open.
    """
    store = SqlStore.from_url(config.database_url, clock=clock, schema=config.database_schema)
    try:
        if config.auto_migrate:
            await store.setup()
        else:
            await _check_revision(store)
    except BaseException:
        await store.close()  # a database not up yet: leave nothing open behind
        raise
    return store


async def _check_revision(store: SqlStore) -> None:
    current = await store.schema_revision()
    if current != head_revision():
        raise ConfigurationError(
            f"the database schema is at {current!r}, this turnkit needs {head_revision()!r}: "
            "run `turnkit db upgrade` (or set `RuntimeConfig.auto_migrate=True`)"
        )
