"""Session workspace files, run against SQLite and the real PostgreSQL (parametrised by `db`)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from turnkit.errors import InvalidInputError, SessionNotFoundError
from turnkit.ids import SessionId, TurnId
from turnkit.store import WorkspaceFile, check_workspace_path
from turnkit.store.migrate import _config, upgrade
from turnkit.store.sql import SqlStore
from turnkit.testing import FakeClock

DB = tuple[str, str | None]
S1 = SessionId("s1")
T1 = TurnId("turn_1")
T2 = TurnId("turn_2")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 5, 1, tzinfo=UTC))


@pytest.fixture
async def store(db: DB, clock: FakeClock) -> AsyncIterator[SqlStore]:
    url, schema = db
    async with SqlStore.from_url(url, clock=clock, schema=schema) as opened:
        await opened.create_session(S1)
        yield opened


async def test_files_are_written_read_and_listed_by_path(store: SqlStore, clock: FakeClock) -> None:
    spec = await store.write_file(S1, "spec.md", "# Spëc\n", turn_id=T1)
    assert spec == WorkspaceFile(
        session_id=S1,
        path="spec.md",
        content="# Spëc\n",
        media_type="text/markdown",
        size=len("# Spëc\n".encode()),  # bytes, not characters
        version=1,
        updated_at=clock.now(),
        turn_id=T1,
    )
    await store.write_file(S1, "plan.md", "1. write the spec\n")
    await store.write_file(S1, "data/rows.csv", "a,b\n1,2\n")
    await store.write_file(S1, "data/Config.JSON", "{}")
    await store.write_file(S1, "notes", "plain")
    await store.write_file(S1, "page.txt", "<p>", media_type="Text/HTML")
    assert await store.read_file(S1, "spec.md") == spec
    listed = await store.list_files(S1)
    assert [(f.path, f.media_type, f.turn_id) for f in listed] == [
        ("data/Config.JSON", "application/json", None),
        ("data/rows.csv", "text/csv", None),
        ("notes", "text/plain", None),
        ("page.txt", "text/html", None),
        ("plan.md", "text/markdown", None),
        ("spec.md", "text/markdown", T1),
    ]
    assert listed[-1] == spec


async def test_the_version_moves_only_when_the_file_changes(
    store: SqlStore, clock: FakeClock
) -> None:
    first = await store.write_file(S1, "plan.md", "step 1", turn_id=T1)
    clock.advance(5)
    again = await store.write_file(S1, "plan.md", "step 1", turn_id=T2)  # a retried call
    assert again == first  # not the version, the time or the turn
    changed = await store.write_file(S1, "plan.md", "step 1\nstep 2", turn_id=T2)
    assert (changed.version, changed.updated_at, changed.turn_id) == (2, clock.now(), T2)
    assert changed.size == len("step 1\nstep 2")
    retyped = await store.write_file(S1, "plan.md", "step 1\nstep 2", media_type="text/plain")
    assert (retyped.version, retyped.media_type, retyped.turn_id) == (3, "text/plain", None)
    assert await store.read_file(S1, "plan.md") == retyped


async def test_concurrent_writes_each_get_their_own_version(store: SqlStore) -> None:
    written = await asyncio.gather(
        *(store.write_file(S1, "log.md", f"entry {i}") for i in range(6))
    )
    assert sorted(f.version for f in written) == [1, 2, 3, 4, 5, 6]
    newest = max(written, key=lambda f: f.version)
    assert await store.read_file(S1, "log.md") == newest


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../b",
        "./a",
        ".",
        "a//b",
        "a/",
        "a b.md",
        "ré.md",
        "a\\b",
        "a\x00b",
        "x" * 201,
    ],
    ids=repr,
)
async def test_bad_paths_are_refused_and_nothing_is_written(store: SqlStore, path: str) -> None:
    with pytest.raises(InvalidInputError, match="workspace path") as refused:
        await store.write_file(S1, path, "content")
    assert refused.value.code == "invalid-input"
    with pytest.raises(InvalidInputError):
        await store.read_file(S1, path)
    assert await store.list_files(S1) == []


@pytest.mark.parametrize(
    "content",
    ["x" * 1_000_001, "nul \x00 inside", "lone \ud800 surrogate"],
    ids=["too-long", "nul", "surrogate"],
)
async def test_bad_content_is_refused_and_nothing_is_written(store: SqlStore, content: str) -> None:
    with pytest.raises(InvalidInputError, match="nothing was written"):
        await store.write_file(S1, "spec.md", content)
    assert await store.list_files(S1) == []


async def test_the_longest_path_and_content_are_accepted(store: SqlStore) -> None:
    path = "/".join(["d" * 99, "f" * 100])
    assert len(path) == 200
    written = await store.write_file(S1, path, "é" * 1_000_000)
    assert (written.size, written.media_type) == (2_000_000, "text/plain")
    assert await store.read_file(S1, path) == written


async def test_a_bad_media_type_is_refused(store: SqlStore) -> None:
    with pytest.raises(InvalidInputError, match="media type"):
        await store.write_file(S1, "a.md", "x", media_type="text/markdown; charset=latin-1")
    assert await store.list_files(S1) == []


async def test_an_unknown_session_is_refused(store: SqlStore) -> None:
    with pytest.raises(SessionNotFoundError) as refused:
        await store.write_file(SessionId("nope"), "spec.md", "x")
    assert refused.value.code == "session-not-found"
    assert await store.list_files(SessionId("nope")) == []
    assert await store.read_file(SessionId("nope"), "spec.md") is None


async def test_files_belong_to_their_session_and_go_with_it(store: SqlStore) -> None:
    await store.create_session(SessionId("s2"))
    await store.write_file(S1, "spec.md", "one")
    other = await store.write_file(SessionId("s2"), "spec.md", "two")
    assert other.version == 1
    assert await store.read_file(S1, "missing.md") is None
    assert await store.delete_session(S1)
    assert await store.list_files(S1) == []
    assert await store.list_files(SessionId("s2")) == [other]


def test_check_workspace_path_returns_a_good_path() -> None:
    assert check_workspace_path("docs/v1.2/plan_final-2.md") == "docs/v1.2/plan_final-2.md"
    with pytest.raises(InvalidInputError, match="relative"):
        check_workspace_path("/spec.md")
    with pytest.raises(InvalidInputError, match=r"`\.` or `\.\.`"):
        check_workspace_path("../spec.md")


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


async def test_the_migration_adds_the_table_to_an_older_database(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        upgrade(conn, "0005")
    assert "tk_workspace_files" not in _tables(path)
    async with SqlStore.from_url(f"sqlite:///{path}") as store:  # opening upgrades to head
        await store.create_session(S1)
        assert (await store.write_file(S1, "spec.md", "x")).version == 1
    with engine.begin() as conn:
        command.downgrade(_config(conn), "0005")
    assert "tk_workspace_files" not in _tables(path)
    engine.dispose()
