"""Shared fixtures: network guard, runtimes on a temporary SQLite file, the fake OpenAI server."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import turnkit.context.prefix
import turnkit.models
from tests.support.openai_server import openai_server as openai_server
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock

RuntimeFactory = Callable[..., SessionRuntime]


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    """No model client may reach a non-loopback address during tests."""
    turnkit.models.ALLOW_NETWORK = False
    yield
    turnkit.models.ALLOW_NETWORK = True


@pytest.fixture(autouse=True)
def _strict_prefix() -> Iterator[None]:
    """A request that rewrites what an earlier one sent fails the turn (not just a log)."""
    turnkit.context.prefix.STRICT = True
    yield
    turnkit.context.prefix.STRICT = False


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'turnkit.db'}"


@pytest.fixture
async def runtime_factory(database_url: str) -> AsyncIterator[RuntimeFactory]:
    """Build open runtimes on one temporary SQLite database; closed after the test."""
    opened: list[SessionRuntime] = []

    def make(agent: Agent | None = None, **kwargs: Any) -> SessionRuntime:
        config = kwargs.pop("config", None) or RuntimeConfig(database_url=database_url)
        runtime = SessionRuntime(agent=agent or kwargs.pop("agent_obj"), config=config, **kwargs)
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        await runtime.close()


# ── real services: PostgreSQL and Redis ─────────────────────────────────────────────

POSTGRES_URL = os.environ.get(
    "TURNKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("TURNKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip when a service is down on a developer machine; fail under CI=true."""
    if _reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: services must run; see .ci/run)")
    pytest.skip(f"{message}; start it to run this test")


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A fresh PostgreSQL schema name (the code under test creates it), dropped after."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    import asyncpg

    name = f"tk_test_{uuid.uuid4().hex[:12]}"
    yield name
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every query an asyncpg connection opened from now on sends, in order."""
    import asyncpg

    queries: list[str] = []
    opened_connection = asyncpg.Connection.__init__

    def logged(self: asyncpg.Connection, *args: Any, **kwargs: Any) -> None:
        opened_connection(self, *args, **kwargs)
        self.add_query_logger(lambda record: queries.append(record.query))

    monkeypatch.setattr(asyncpg.Connection, "__init__", logged)
    return queries


@pytest.fixture(params=["sqlite", "postgres"])
async def db(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, str | None]]:
    """(database_url, schema) for SQLite and for a real PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'turnkit.db'}", None
        return
    require_service("PostgreSQL", "127.0.0.1", 5432)
    import asyncpg

    schema = f"tk_test_{uuid.uuid4().hex[:12]}"
    try:
        yield POSTGRES_URL, schema
    finally:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand, at 2026-05-01 UTC."""
    return FakeClock(datetime(2026, 5, 1, tzinfo=UTC))


@pytest.fixture
async def store(db: tuple[str, str | None], clock: FakeClock) -> AsyncIterator[SqlStore]:
    """An open `SqlStore` on each store of `db`, on `clock`."""
    url, schema = db
    async with SqlStore.from_url(url, clock=clock, schema=schema) as opened:
        yield opened
