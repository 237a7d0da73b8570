"""A PostgreSQL connection the server closed (a restart, an admin's kill) is never handed
out: the next call after it gets a fresh one, and no check costs a round trip per call."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from tests.conftest import POSTGRES_URL

from turnkit.graph import open_checkpointer
from turnkit.ids import SessionId
from turnkit.store.sql import SqlStore


async def _kill(pids: set[int]) -> None:
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        for pid in pids:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await asyncio.sleep(0.3)  # the server's goodbye reaches the idle sockets


async def test_the_store_replaces_a_connection_the_server_closed(pg_schema: str) -> None:
    store = SqlStore(POSTGRES_URL, schema=pg_schema)
    await store.setup()
    try:
        async with store._async_engine.connect() as conn:  # type: ignore[union-attr]
            raw: Any = await conn.get_raw_connection()
            pid = raw.driver_connection.get_server_pid()
        await _kill({pid})
        assert await store.list_turns(SessionId("s1")) == []  # not an error: a new connection
    finally:
        await store.close()


async def test_the_checkpointer_replaces_a_connection_the_server_closed(pg_schema: str) -> None:
    admin = await asyncpg.connect(POSTGRES_URL)
    await admin.execute(f'CREATE SCHEMA "{pg_schema}"')
    await admin.close()
    saver, close = await open_checkpointer(POSTGRES_URL, schema=pg_schema)
    try:
        config: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        assert await saver.aget_tuple(config) is None
        async with saver.pool.acquire() as conn:
            pid = conn.get_server_pid()
        await _kill({pid})
        assert await saver.aget_tuple(config) is None  # not an error: a new connection
    finally:
        await close()
