"""Data that leaves or moves: deleted sessions' usage, titles any store keeps, exports, UTC days."""

from __future__ import annotations

import dataclasses

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.models import Usage
from turnkit.testing import ModelStep, ScriptedModel, collect_events

DB = tuple[str, str | None]


def _runtime(db: DB) -> SessionRuntime:
    url, schema = db
    step = dataclasses.replace(
        ModelStep.text_reply("Noted."), usage=Usage(input_tokens=100, output_tokens=10)
    )
    model = ScriptedModel([step], repeat_last=True)
    config = RuntimeConfig(database_url=url, database_schema=schema)
    return SessionRuntime(agent=Agent(model=model), config=config)


async def test_deleting_a_session_keeps_its_owners_usage_report(db: DB) -> None:
    """A turn the app sent into ann's session (no principal on the message) is ann's in
    usage reports; deleting the session must not move its spend to anonymous."""
    async with _runtime(db) as runtime:
        await runtime.create_session("s-ann", principal="ann")
        await collect_events(runtime.execute_message("s-ann", "hello"))  # the app, no principal
        before = await runtime.store.usage_report(by="principal", principal="ann")
        anon_before = await runtime.store.usage_report(by="session", anonymous=True)
        assert [line.turns for line in before] == [1]
        assert anon_before == []

        assert await runtime.delete_session("s-ann")

        assert await runtime.store.usage_report(by="principal", principal="ann") == before
        # ...and an anonymous caller's own usage does not start listing ann's session.
        assert await runtime.store.usage_report(by="session", anonymous=True) == []


def _pg_schema_dropped(schema: str) -> None:
    import asyncio

    import asyncpg

    from tests.conftest import POSTGRES_URL

    async def drop() -> None:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def _seed_titled(url: str, said: str) -> None:
    import asyncio

    utility = ScriptedModel([ModelStep.text_reply(said)], repeat_last=True)
    model = ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True)

    async def seed() -> None:
        config = RuntimeConfig(database_url=url)
        agent = Agent(model=model, utility_model=utility, skip_stages=frozenset({"anchor-plan"}))
        async with SessionRuntime(agent=agent, config=config) as runtime:
            await collect_events(runtime.execute_message("s1", "plan my trip"))
            await runtime.wait_background()

    asyncio.run(seed())


def test_a_title_the_model_writes_holds_no_nul(tmp_path) -> None:
    """A utility model's title with NUL went into tk_sessions.title as written (SQLite
    keeps it; PostgreSQL cannot), so that database could never be copied to PostgreSQL."""
    import sqlite3

    _seed_titled(f"sqlite:///{tmp_path / 'src.db'}", "Trip\x00plan")
    with sqlite3.connect(tmp_path / "src.db") as conn:
        [(title,)] = conn.execute("SELECT title FROM tk_sessions").fetchall()
    assert title == "Tripplan"


def test_db_copy_names_a_row_the_target_cannot_store_instead_of_copy_again(tmp_path) -> None:
    """A SQLite database already holding a NUL in a text column (an older turnkit's
    title): the copy said 'the target database failed ...: copy again', which fails the
    same way forever. It must name the row and say that copying again will not help."""
    import io
    import sqlite3
    import uuid

    import pytest

    from tests.conftest import POSTGRES_URL, require_service
    from turnkit.cli import main

    require_service("PostgreSQL", "127.0.0.1", 5432)
    url = f"sqlite:///{tmp_path / 'src.db'}"
    _seed_titled(url, "Trip plan")
    with sqlite3.connect(tmp_path / "src.db") as conn:
        conn.execute("UPDATE tk_sessions SET title = 'Trip' || char(0) || 'plan'")
    schema = f"tk_test_{uuid.uuid4().hex[:12]}"
    err = io.StringIO()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("sys.stderr", err)
            code = main(
                ["db", "copy", "--from", url, "--to", POSTGRES_URL, "--to-schema", schema],
                out=io.StringIO(),
            )
    finally:
        _pg_schema_dropped(schema)
    said = err.getvalue()
    assert code == 2
    assert said.count("\n") == 1
    assert "tk_sessions ('s1',) (column title)" in said, said
    assert "copy again [" not in said, said


def test_an_export_goes_on_past_an_audit_row_it_cannot_read(tmp_path, capsys) -> None:
    """A damaged (or newer turnkit's) audit row stopped the whole export with
    `turnkit: invalid setting: …`, a message about flags, and no line of the session:
    the export that is meant to be taken before a deletion cannot be taken at all."""
    import asyncio
    import io
    import json
    import sqlite3

    from tests.test_cli_export import _seed
    from turnkit.cli import main

    db = tmp_path / "turnkit.db"
    url = f"sqlite:///{db}"
    seeded = asyncio.run(_seed(url, None))
    turn_id = seeded["turns"][0]
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE tk_audit SET data = ? WHERE turn_id = ? AND seq_within_turn = "
            "(SELECT min(seq_within_turn) FROM tk_audit WHERE turn_id = ?)",
            (b'{"kind": "fromTheFuture"}', turn_id, turn_id),
        )
    out = io.StringIO()
    code = main(["sessions", "export", "s-1", "--database-url", url], out=out)
    err = capsys.readouterr().err
    assert "invalid setting" not in err, err
    assert code == 0, err
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[-1]["kind"] == "end"
    assert lines[-1]["turns"] == 2


async def test_usage_by_day_is_by_utc_day_on_postgresql_whatever_its_time_zone(
    pg_schema: str,
) -> None:
    """`GET /usage?by=day` is documented as UTC days. On PostgreSQL `date(timestamptz)`
    uses the session's TimeZone (a server, database or role default such as
    `ALTER DATABASE … SET timezone`), so the same turns fall on other days than on SQLite,
    and a `db copy` from SQLite moves them."""
    from datetime import UTC, datetime

    from tests.conftest import POSTGRES_URL
    from tests.support.retention import ShiftedClock

    at = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)  # 2025-12-31 19:00 in Los Angeles
    clock = ShiftedClock(at - datetime.now(UTC))
    url = f"{POSTGRES_URL}?timezone=America/Los_Angeles"  # as a database default would
    step = dataclasses.replace(
        ModelStep.text_reply("Noted."), usage=Usage(input_tokens=100, output_tokens=10)
    )
    config = RuntimeConfig(database_url=url, database_schema=pg_schema)
    agent = Agent(model=ScriptedModel([step], repeat_last=True))
    async with SessionRuntime(agent=agent, config=config, clock=clock) as runtime:
        await collect_events(runtime.execute_message("s1", "hello"))
        lines = await runtime.store.usage_report(by="day")
    assert [line.key for line in lines] == ["2026-01-01"]
