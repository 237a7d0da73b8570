"""Alembic environment for turnkit's own tables (run through `turnkit.store.migrate`)."""

from __future__ import annotations

from alembic import context

from turnkit.store._tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table="tk_alembic_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
