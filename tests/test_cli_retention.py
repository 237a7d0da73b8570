"""`turnkit sessions prune` and `turnkit sweep` delete what nothing will read again: idle
sessions with their turns' checkpoints, and the checkpoints of the turns a sweep ends."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL, require_service
from tests.helpers import db_flags
from tests.support.retention import ShiftedClock, checkpoint_rows
from turnkit import Agent, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.cli import main
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

DB = tuple[str, str | None]


@pytest.fixture(params=["sqlite", "postgres"])
def cli_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DB]:
    """(database_url, schema) on SQLite and on a fresh PostgreSQL schema (for sync tests)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'turnkit.db'}", None
        return
    require_service("PostgreSQL", "127.0.0.1", 5432)
    schema = f"tk_test_{uuid.uuid4().hex[:12]}"
    try:
        yield POSTGRES_URL, schema
    finally:
        asyncio.run(_drop(schema))


async def _drop(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _flags(db: DB) -> list[str]:
    return db_flags(*db)


def _config(db: DB, **kw: object) -> RuntimeConfig:
    url, schema = db
    return RuntimeConfig(database_url=url, database_schema=schema, **kw)  # type: ignore[arg-type]


async def _sessions(db: DB) -> dict[str, str]:
    """Sessions by id (`old-…` from 100 days ago, `recent` now) and their turns."""
    clock = ShiftedClock(timedelta(days=-100))
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Noted.")], repeat_last=True))
    config = _config(db, keep_ended_checkpoints=True)
    turns = {}
    async with SessionRuntime(agent=agent, config=config, clock=clock) as runtime:
        for session_id in ("old-1", "old-2", "old-3"):
            clock.shift += timedelta(minutes=1)
            done = await collect_events(runtime.execute_message(session_id, "hello"))
            turns[session_id] = done[-1].turn_id
        clock.shift = timedelta(0)
        done = await collect_events(runtime.execute_message("recent", "hello"))
        turns["recent"] = done[-1].turn_id
    return turns


def _prune(db: DB, *flags: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["sessions", "prune", *flags, *_flags(db)], out=out)
    return code, out.getvalue()


def test_prune_deletes_idle_sessions_with_their_checkpoints(cli_db: DB) -> None:
    turns = asyncio.run(_sessions(cli_db))
    assert set(turns.values()) <= set(asyncio.run(checkpoint_rows(*cli_db)))

    code, out = _prune(cli_db, "--idle-for", "90d")

    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("sessions idle for 90d: last active before ")
    assert lines[1].startswith("  deleted 3 session(s) with 3 turn(s), last active ")
    assert lines[2:] == ["deleted 3 session(s) with 3 turn(s)"]
    assert set(asyncio.run(checkpoint_rows(*cli_db))) == {turns["recent"]}
    listed = io.StringIO()
    assert main(["sessions", *_flags(cli_db)], out=listed) == 0
    assert "old-" not in listed.getvalue()
    assert "  recent  " in listed.getvalue()


async def _rows_only(db: DB, session_id: str) -> None:
    """Delete a session's rows and not its checkpoints: a prune interrupted in between."""
    from turnkit.ids import SessionId
    from turnkit.store.sql import SqlStore

    store = SqlStore.from_url(db[0], schema=db[1])
    try:
        deleted = await store.delete_idle_sessions(
            [SessionId(session_id)], idle_before=ShiftedClock().now() - timedelta(days=90)
        )
    finally:
        await store.close()
    assert deleted == [session_id]


def test_prune_deletes_the_checkpoints_an_interrupted_one_left(cli_db: DB) -> None:
    turns = asyncio.run(_sessions(cli_db))
    asyncio.run(_rows_only(cli_db, "old-1"))
    assert turns["old-1"] in asyncio.run(checkpoint_rows(*cli_db))

    code, out = _prune(cli_db, "--idle-for", "90d", "--dry-run")
    assert code == 0
    assert turns["old-1"] in asyncio.run(checkpoint_rows(*cli_db))  # a dry run deletes nothing

    code, out = _prune(cli_db, "--idle-for", "90d")

    assert code == 0, out
    lines = out.splitlines()
    assert lines[1] == (
        "  deleted the checkpoints of 1 turn(s) already deleted (an earlier prune was interrupted)"
    )
    assert lines[-1] == "deleted 2 session(s) with 2 turn(s)"
    assert set(asyncio.run(checkpoint_rows(*cli_db))) == {turns["recent"]}


def test_a_dry_run_lists_what_would_go_and_deletes_nothing(cli_db: DB) -> None:
    turns = asyncio.run(_sessions(cli_db))
    before = asyncio.run(checkpoint_rows(*cli_db))

    code, out = _prune(cli_db, "--idle-for", "90d", "--dry-run")

    assert code == 0
    lines = out.splitlines()
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["would", "delete", "old-1"],
        ["would", "delete", "old-2"],
        ["would", "delete", "old-3"],
    ]
    assert lines[4:] == [
        "would delete 3 session(s) with 3 turn(s); nothing was deleted (--dry-run)"
    ]
    assert asyncio.run(checkpoint_rows(*cli_db)) == before
    assert set(turns.values()) <= set(before)


def test_prune_deletes_at_most_its_limit_oldest_first(tmp_path: Path) -> None:
    db: DB = (f"sqlite:///{tmp_path / 'turnkit.db'}", None)
    turns = asyncio.run(_sessions(db))

    code, out = _prune(db, "--idle-for", "90d", "--limit", "2")

    assert code == 0, out
    assert out.splitlines()[-1] == "deleted 2 session(s) with 2 turn(s)"
    left = set(asyncio.run(checkpoint_rows(*db)))
    assert left == {turns["old-3"], turns["recent"]}
    # The limit may come before `prune`, as the database flags may.
    out_before = io.StringIO()
    argv = ["sessions", "--limit", "1", *_flags(db), "prune", "--idle-for", "90d"]
    assert main(argv, out=out_before) == 0
    assert out_before.getvalue().splitlines()[-1] == "deleted 1 session(s) with 1 turn(s)"
    assert set(asyncio.run(checkpoint_rows(*db))) == {turns["recent"]}


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--idle-for", "abc"], "argument --idle-for: 'abc' is not a duration such as 90d"),
        (["--idle-for=-5d"], "argument --idle-for: '-5d' is not a duration above 0"),
        (["--idle-for", "0d"], "argument --idle-for: '0d' is not a duration above 0"),
        (["--idle-for", "90"], "'90' is not a duration such as 90d, 12h or 30m"),
        (["--idle-for", "90d", "--limit", "0"], "argument --limit: '0' is not a whole number"),
        ([], "the following arguments are required: --idle-for"),
    ],
)
def test_bad_input_is_one_line_and_deletes_nothing(
    tmp_path: Path, flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db: DB = (f"sqlite:///{tmp_path / 'turnkit.db'}", None)
    turns = asyncio.run(_sessions(db))
    with pytest.raises(SystemExit) as stopped:
        main(["sessions", "prune", *flags, *_flags(db)], out=io.StringIO())
    assert stopped.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("turnkit sessions prune: error: ")
    assert says in line
    assert set(asyncio.run(checkpoint_rows(*db))) == set(turns.values())


def test_prune_is_not_narrowed_to_an_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db: DB = (f"sqlite:///{tmp_path / 'turnkit.db'}", None)
    turns = asyncio.run(_sessions(db))
    argv = ["sessions", "--principal", "ann", "prune", "--idle-for", "90d", *_flags(db)]
    assert main(argv, out=io.StringIO()) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "`turnkit sessions prune` takes no --principal: it deletes every idle session" in line
    assert set(asyncio.run(checkpoint_rows(*db))) == set(turns.values())


def test_prune_refuses_a_database_that_is_not_there_or_at_another_revision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "turnkti.db"
    assert _prune((f"sqlite:///{typo}", None), "--idle-for", "90d")[0] == 2
    assert capsys.readouterr().err.startswith(f"turnkit: there is no database at {str(typo)!r}")
    assert not typo.exists()

    db: DB = (f"sqlite:///{tmp_path / 'turnkit.db'}", None)
    turns = asyncio.run(_sessions(db))
    import sqlite3

    with sqlite3.connect(tmp_path / "turnkit.db") as conn:
        conn.execute("UPDATE tk_alembic_version SET version_num = '0012'")
    assert _prune(db, "--idle-for", "90d") == (2, "")
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("turnkit: the database schema is at '0012', this turnkit reads")
    assert set(asyncio.run(checkpoint_rows(*db))) == set(turns.values())
    with sqlite3.connect(tmp_path / "turnkit.db") as conn:  # not migrated
        assert conn.execute("SELECT version_num FROM tk_alembic_version").fetchall() == [("0012",)]


# ── turnkit sweep ────────────────────────────────────────────────────────────────────


@tool
async def _slow(ctx: ToolContext) -> str:
    """Take a minute."""
    await asyncio.sleep(60)
    return "late"


async def _orphan(db: DB) -> str:
    """A turn whose process went away mid-tool two hours ago: past the ceiling, checkpointed."""
    model = ScriptedModel([ModelStep.tool_call_reply(call("_slow"))])
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[_slow]),
        config=_config(db),
        clock=ShiftedClock(timedelta(hours=-2)),
    )
    await runtime.open()
    submission = await runtime.start("s1", "slow please")
    async with asyncio.timeout(10):
        while "tool.started" not in [e.type async for e in runtime.events(submission.turn_id)]:
            await asyncio.sleep(0.02)
    await runtime.close()  # nobody takes the turn over
    return submission.turn_id


def test_sweep_deletes_the_checkpoints_of_the_turns_it_ends(cli_db: DB) -> None:
    turn_id = asyncio.run(_orphan(cli_db))
    assert turn_id in asyncio.run(checkpoint_rows(*cli_db))

    out = io.StringIO()
    assert main(["sweep", *_flags(cli_db)], out=out) == 0

    assert out.getvalue().splitlines() == [
        "swept 1 turn(s)",
        f"  {turn_id}",
        "deleted the checkpoints of 1 turn(s)",
    ]
    assert asyncio.run(checkpoint_rows(*cli_db)) == {}
    again = io.StringIO()
    assert main(["sweep", *_flags(cli_db)], out=again) == 0
    assert again.getvalue() == "swept 0 turn(s)\n"


def test_sweep_keeps_them_when_ended_checkpoints_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db: DB = (f"sqlite:///{tmp_path / 'turnkit.db'}", None)
    turn_id = asyncio.run(_orphan(db))
    monkeypatch.setenv("TURNKIT_KEEP_ENDED_CHECKPOINTS", "1")
    out = io.StringIO()
    assert main(["sweep", *_flags(db)], out=out) == 0
    assert out.getvalue().splitlines()[-1] == (
        "kept their checkpoints (TURNKIT_KEEP_ENDED_CHECKPOINTS)"
    )
    assert turn_id in asyncio.run(checkpoint_rows(*db))


def test_a_span_longer_than_the_calendar_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db: DB = (f"sqlite:///{tmp_path / 'turnkit.db'}", None)
    turns = asyncio.run(_sessions(db))
    code = main(["sessions", "prune", "--idle-for", "1000000d", *_flags(db)], out=io.StringIO())
    assert code != 0  # was an OverflowError's traceback
    [line] = capsys.readouterr().err.splitlines()
    assert "reaches back before the year 1" in line
    assert set(asyncio.run(checkpoint_rows(*db))) == set(turns.values())
