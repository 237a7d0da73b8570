"""Deleting a session deletes what its turns wrote, the graph checkpoints included: they
hold the conversation's messages."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import sqlalchemy as sa
from fastapi import FastAPI

from tests.conftest import POSTGRES_URL
from tests.helpers import add
from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime
from turnkit.events import DoneEvent
from turnkit.http import create_turnkit_router
from turnkit.ids import SessionId
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

SECRET = "the vault code is 7-4-1-9"


async def _checkpointed_text(database_url: str, schema: str | None) -> bytes:
    """Every byte the checkpointer's tables hold, as one blob to search."""
    if schema is None:
        path = database_url.split("///", 1)[1].replace(".db", ".checkpoints.db")
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT checkpoint, metadata FROM checkpoints").fetchall()
            rows += conn.execute("SELECT value FROM writes").fetchall()
        return b"".join(bytes(cell) for row in rows for cell in row if cell is not None)
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        found = b""
        for query in (
            "SELECT checkpoint::text FROM checkpoints",
            "SELECT coalesce(blob, ''::bytea) FROM checkpoint_blobs",
            "SELECT coalesce(blob, ''::bytea) FROM checkpoint_writes",
        ):
            for (cell,) in await conn.fetch(query):
                found += cell.encode() if isinstance(cell, str) else bytes(cell)
        return found
    finally:
        await conn.close()


def _runtime(db: tuple[str, str | None], model: ScriptedModel) -> SessionRuntime:
    url, schema = db
    agent = Agent(model=model, tools=[add], approval="always")
    config = RuntimeConfig(database_url=url, database_schema=schema)
    return SessionRuntime(agent=agent, config=config)


async def test_deleting_a_session_deletes_its_turns_checkpoints(
    db: tuple[str, str | None],
) -> None:
    model = ScriptedModel(
        [
            ModelStep.text_reply("Noted."),
            ModelStep.tool_call_reply(call("add", a=2, b=3)),  # paused for an approval
            ModelStep.text_reply("Kept."),
        ]
    )
    async with _runtime(db, model) as runtime, _runtime(db, model) as other:
        done = await collect_events(runtime.execute_message("s1", SECRET))
        assert isinstance(done[-1], DoneEvent)
        assert done[-1].status == "succeeded"
        paused = await collect_events(runtime.execute_message("s1", f"again: {SECRET}"))
        assert (await runtime.turn(paused[-1].turn_id)).status == "awaiting_approval"
        await collect_events(other.execute_message("s2", f"another session: {SECRET}"))
        assert SECRET.encode() in await _checkpointed_text(*db)

        assert await runtime.delete_session("s1")

        left = await _checkpointed_text(*db)
        assert f"another session: {SECRET}".encode() in left  # other sessions keep theirs
        assert f"again: {SECRET}".encode() not in left
        assert left.count(SECRET.encode()) == left.count(b"another session: " + SECRET.encode())
        assert not await runtime.delete_session("s1")


async def test_the_http_route_deletes_the_checkpoints_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    model = ScriptedModel([ModelStep.text_reply("Noted.")])
    async with _runtime((url, None), model) as runtime:
        await collect_events(runtime.execute_message("s1", SECRET))
        assert SECRET.encode() in await _checkpointed_text(url, None)
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            assert (await http.delete("/api/harness/sessions/s1")).status_code == 204
        assert SECRET.encode() not in await _checkpointed_text(url, None)


async def _threads(database_url: str, schema: str | None) -> set[str]:
    """The turns (checkpoint threads) the checkpointer holds anything for."""
    if schema is None:
        path = database_url.split("///", 1)[1].replace(".db", ".checkpoints.db")
        with sqlite3.connect(path) as conn:
            rows = conn.execute(
                "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM writes"
            ).fetchall()
        return {str(r[0]) for r in rows}
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        rows = await conn.fetch(
            "SELECT thread_id FROM checkpoints UNION SELECT thread_id FROM checkpoint_blobs "
            "UNION SELECT thread_id FROM checkpoint_writes"
        )
        return {str(r[0]) for r in rows}
    finally:
        await conn.close()


async def test_an_ended_turns_checkpoints_are_deleted_and_a_paused_turns_kept(
    db: tuple[str, str | None],
) -> None:
    """The checkpoint tables hold live turns only: a long session does not pile them up."""
    model = ScriptedModel(
        [
            ModelStep.text_reply("One."),
            ModelStep.text_reply("Two."),
            ModelStep.tool_call_reply(call("add", a=2, b=3)),  # paused for an approval
            ModelStep.text_reply("Five."),
            ModelStep.tool_call_reply(call("add", a=1, b=1)),  # paused, then Stopped
        ]
    )
    async with _runtime(db, model) as runtime:
        ended = [
            (await collect_events(runtime.execute_message("s1", text)))[-1].turn_id
            for text in ("one", "two")
        ]
        paused = (await collect_events(runtime.execute_message("s1", "add")))[-1].turn_id
        await runtime.wait_background()  # deletes what ended, without waiting for a batch
        assert await _threads(*db) == {paused}
        request = (await runtime.view("s1")).pending[0].request_id
        await runtime.resume(paused, request, Approve())
        await collect_events(runtime.reader().follow(paused))
        assert (await runtime.turn(paused)).status == "succeeded"  # resumed from its checkpoint
        stopped = (await collect_events(runtime.execute_message("s2", "add")))[-1].turn_id
        assert await runtime.cancel(stopped) == "cancelled"  # ended in the Store, no driver
        await runtime.wait_background()
        assert await _threads(*db) == set()
        assert [(await runtime.turn(t)).status for t in ended] == ["succeeded", "succeeded"]
        assert len(await runtime.history("s1")) == 3  # what ended is read from the Store


async def test_ended_checkpoints_can_be_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    config = RuntimeConfig(database_url=url, keep_ended_checkpoints=True)
    model = ScriptedModel([ModelStep.text_reply("Noted.")])
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        done = await collect_events(runtime.execute_message("s1", "hello"))
        await runtime.wait_background()
        assert await _threads(url, None) == {done[-1].turn_id}


async def test_a_turn_a_reader_times_out_loses_its_checkpoints(tmp_path: Path) -> None:
    """The process driving it died: a reader ends it, and nothing will resume it."""
    import asyncio

    from turnkit import ToolContext, tool

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Take a minute."""
        await asyncio.sleep(60)
        return "late"

    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    config = RuntimeConfig(
        database_url=url, idle_window_s=1.0, heartbeat_interval_s=0.2, lease_ttl_s=1.0
    )
    model = ScriptedModel([ModelStep.tool_call_reply(call("slow"))])
    first = SessionRuntime(agent=Agent(model=model, tools=[slow]), config=config)
    await first.open()
    submission = await first.start("s1", "slow please")
    async with asyncio.timeout(10):
        while "tool.started" not in [e.type async for e in first.events(submission.turn_id)]:
            await asyncio.sleep(0.02)
    await first.close()  # the process goes away mid-tool; nobody takes the turn over
    assert await _threads(url, None) == {submission.turn_id}

    async with SessionRuntime(agent=Agent(model=model, tools=[slow]), config=config) as second:
        async with asyncio.timeout(20):
            frames = [f async for f in second.reader().follow(submission.turn_id)]
        assert frames
        assert (await second.turn(submission.turn_id)).status == "timed_out"
        await second.wait_background()
        assert await _threads(url, None) == set()


async def test_a_message_committed_while_its_session_is_deleted_is_not_left_behind(
    pg_schema: str,
) -> None:
    """The delete locks the session first: a message it waited for goes with it, whole.

    Without the lock, a delete that had already removed the session's turns when the
    message committed went on to remove the session row only, leaving a turn (and its
    input and events) that no session holds.
    """
    import asyncio

    import asyncpg

    config = RuntimeConfig(
        database_url=POSTGRES_URL, database_schema=pg_schema, run_in_process=False
    )
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]))
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.submit("s1", "first")
        holder = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": pg_schema})
        try:
            hold = holder.transaction()
            await hold.start()  # another writer holds the session's row for a moment
            await holder.execute("SELECT 1 FROM tk_sessions WHERE session_id = 's1' FOR UPDATE")
            sending = asyncio.create_task(runtime.submit("s1", "second"))
            await asyncio.sleep(0.3)  # the message waits for the row first, then the delete
            deleting = asyncio.create_task(runtime.store.delete_session(SessionId("s1")))
            await asyncio.sleep(0.3)
            await hold.commit()
            async with asyncio.timeout(10):
                await sending
                assert await deleting
            left = await holder.fetch("SELECT status FROM tk_turns WHERE session_id = 's1'")
            inputs = await holder.fetch("SELECT seq FROM tk_inputs WHERE session_id = 's1'")
        finally:
            await holder.close()
        assert await runtime.store.get_session(SessionId("s1")) is None
        assert (left, inputs) == ([], [])


async def test_deleting_a_session_while_its_approval_is_answered_does_not_deadlock(
    pg_schema: str,
) -> None:
    """An answer locks the turn, then its pause; the delete takes the turn's row first too.

    The delete used to remove the pauses before the turns: racing an answer (which holds
    the turn's row and wants the pause's) it deadlocked, and PostgreSQL aborted one of them
    (a 500 over HTTP).
    """
    import asyncio

    import asyncpg

    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=pg_schema)
    model = ScriptedModel([ModelStep.tool_call_reply(call("add", a=2, b=3))])
    agent = Agent(model=model, tools=[add], approval="always")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        paused = (await collect_events(runtime.execute_message("s1", "add")))[-1].turn_id
        assert (await runtime.turn(paused)).status == "awaiting_approval"
        answering = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": pg_schema})
        try:
            answer = answering.transaction()
            await answer.start()  # an answer's first step: the turn's row
            await answering.execute(
                "UPDATE tk_turns SET status = 'running' WHERE turn_id = $1", paused
            )
            deleting = asyncio.create_task(runtime.store.delete_session(SessionId("s1")))
            await asyncio.sleep(0.3)  # the delete now waits for the turn's row
            async with asyncio.timeout(10):  # its second step: the pause's row
                await answering.execute(
                    "UPDATE tk_pauses SET status = 'answered' WHERE turn_id = $1", paused
                )
                await answer.commit()
                assert await deleting
        finally:
            await answering.close()
        assert await runtime.store.get_turn(paused) is None


_AUDIT_TABLES = ("tk_audit", "tk_usage", "tk_budget_limits", "tk_budget_reservations")


def _audit_foreign_keys(conn: sa.Connection) -> dict[str, list[str]]:
    found = sa.inspect(conn)
    return {
        table: [fk["referred_table"] for fk in found.get_foreign_keys(table)]
        for table in _AUDIT_TABLES
    }


async def test_audit_rows_outlive_their_deleted_chat(db: tuple[str, str | None]) -> None:
    """On both stores: no audit table points at a chat table, so a deleted chat's turns
    keep their audit rows and their spend (a delete can neither cascade nor be refused)."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "hi"))
        turn_id = events[0].turn_id
        before = await runtime.audit(turn_id)
        await runtime.delete_session("s1")
        after = await runtime.store.read_audit(turn_id)
        usage = await runtime.store.read_usage(turn_id)
        keys = await runtime.store._migrate(_audit_foreign_keys)  # type: ignore[attr-defined]
    assert keys == dict.fromkeys(_AUDIT_TABLES, [])
    assert before
    assert after == before
    assert usage.model_calls == 1
