"""`turnkit db copy`: every turnkit row and the live turns' checkpoints, into an empty
database; a turn paused on the source resumes on the target."""

from __future__ import annotations

import asyncio
import io
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL, require_service
from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.budgets import BudgetLimit, BudgetSubject
from turnkit.cli import main
from turnkit.events import ApprovalRequestedEvent, DoneEvent, StreamEvent, ToolCompletedEvent
from turnkit.ids import SessionId, TurnId
from turnkit.runtime.reader import Frame
from turnkit.store._copy_sql import TABLES, read_pages
from turnkit.store._tables import metadata
from turnkit.store.sql import SqlStore
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

DB = tuple[str, str | None]
SENT: list[str] = []


@tool(approval="always")
async def send_email(to: str, ctx: ToolContext) -> str:
    """Send an email (needs a person's approval)."""
    SENT.append(to)
    return f"sent to {to}"


@dataclass
class Databases:
    """Makes fresh databases of either kind; drops the PostgreSQL schemas afterwards."""

    tmp_path: Path
    schemas: list[str]

    def make(self, kind: str) -> DB:
        if kind == "sqlite":
            return f"sqlite:///{self.tmp_path / f'{uuid.uuid4().hex[:8]}.db'}", None
        require_service("PostgreSQL", "127.0.0.1", 5432)
        schema = f"tk_test_{uuid.uuid4().hex[:12]}"
        self.schemas.append(schema)
        return POSTGRES_URL, schema


@pytest.fixture
def dbs(tmp_path: Path) -> Iterator[Databases]:
    made = Databases(tmp_path, [])
    yield made
    if made.schemas:
        asyncio.run(_drop(made.schemas))


async def _drop(schemas: list[str]) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _config(db: DB) -> RuntimeConfig:
    return RuntimeConfig(database_url=db[0], database_schema=db[1])


def _copy(source: DB, target: DB, *flags: str) -> tuple[int, str, str]:
    argv = ["db", "copy", "--from", source[0], "--to", target[0]]
    argv += ["--from-schema", source[1]] if source[1] else []
    argv += ["--to-schema", target[1]] if target[1] else []
    out = io.StringIO()
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stderr", err)
        code = main([*argv, *flags], out=out)
    return code, out.getvalue(), err.getvalue()


async def _seed(db: DB) -> ApprovalRequestedEvent:
    """A finished turn with a file and a budget, and a turn paused for approval."""
    model = ScriptedModel(
        [
            ModelStep.text_reply("Hello there."),
            ModelStep.tool_call_reply(call("send_email", to="ada@example.com")),
        ]
    )
    agent = Agent(model=model, tools=[send_email])
    async with SessionRuntime(agent=agent, config=_config(db)) as runtime:
        done = await collect_events(runtime.execute_message("chat", "hi"))
        assert isinstance(done[-1], DoneEvent)
        store = runtime.store
        assert isinstance(store, SqlStore)
        await store.write_file(SessionId("chat"), "notes.md", "# notes\n")
        await store.set_budget_limit(BudgetLimit(scope="organisation", usd=5.0))
        subject = BudgetSubject(
            organisation="default", department="", principal=None, session_id="chat"
        )
        await store.reserve_budget(
            subject, turn_id=TurnId(done[-1].turn_id), usd=0.01, tokens=10, ttl_s=3600
        )
        events = await collect_events(runtime.execute_message("s1", "email Ada"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    return asked


async def _rows(db: DB) -> dict[str, list[dict[str, Any]]]:
    """Every row of every turnkit table, in primary-key order."""
    store = SqlStore.from_url(db[0], schema=db[1])
    try:
        return {
            table.name: [row async for page in read_pages(store, table, size=2) for row in page]
            for table in TABLES
        }
    finally:
        await store.close()


async def _history(db: DB) -> list[Any]:
    agent = Agent(model=ScriptedModel([]), tools=[send_email])
    async with SessionRuntime(agent=agent, config=_config(db)) as runtime:
        return [await runtime.history(s) for s in ("chat", "s1")]


async def _resume(db: DB, asked: ApprovalRequestedEvent) -> list[StreamEvent]:
    """Approve the paused turn on `db` and follow it to its end."""
    from turnkit.events import decode_event

    model = ScriptedModel([ModelStep.text_reply("Done: sent.")])
    async with SessionRuntime(
        agent=Agent(model=model, tools=[send_email]), config=_config(db)
    ) as rt:
        assert (await rt.turn(asked.turn_id)).status == "awaiting_approval"
        await rt.resume(asked.turn_id, asked.request_id, Approve())
        rest: list[StreamEvent] = []
        async with asyncio.timeout(20):
            async for frame in rt.reader().follow(TurnId(asked.turn_id), after_seq=asked.seq):
                if isinstance(frame, Frame) and frame.seq is not None:
                    rest.append(decode_event(frame.data))
                    if isinstance(rest[-1], DoneEvent):
                        break
        model.assert_complete()
    return rest


@pytest.mark.parametrize(
    ("source_kind", "target_kind"),
    [
        ("sqlite", "postgres"),
        ("postgres", "postgres"),
        ("postgres", "sqlite"),
        ("sqlite", "sqlite"),
    ],
)
def test_a_copy_holds_every_row_and_a_paused_turn_resumes_there(
    dbs: Databases, source_kind: str, target_kind: str
) -> None:
    SENT.clear()
    source, target = dbs.make(source_kind), dbs.make(target_kind)
    asked = asyncio.run(_seed(source))
    before = asyncio.run(_rows(source))

    code, out, err = _copy(source, target)

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[2] == "target schema: empty → " + lines[2].rsplit(" ", 1)[-1]
    for table in TABLES:
        assert f"  {table.name:<24} {len(before[table.name]):>10,} row(s) in " in out
    assert "  checkpoints" in out
    assert "3 of 1 thread(s) in " in out  # the paused turn: the ended turn's are gone
    assert lines[-1].startswith(f"copied {sum(map(len, before.values())):,} row(s) in 11 tables")
    after = asyncio.run(_rows(target))
    assert after == before  # every row, every value (times compare as instants)
    assert all(before[t.name] for t in TABLES)  # something in each table
    assert asyncio.run(_rows(source)) == before  # the source is only read
    assert asyncio.run(_history(target)) == asyncio.run(_history(source))

    rest = asyncio.run(_resume(target, asked))

    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert [e.result.output for e in rest if isinstance(e, ToolCompletedEvent)] == [
        "sent to ada@example.com"
    ]
    assert SENT == ["ada@example.com"]
    seqs = [e.seq for e in rest if hasattr(e, "seq")]  # type: ignore[union-attr]
    assert seqs == list(range(asked.seq + 1, asked.seq + 1 + len(seqs)))  # gap-free


def test_every_turnkit_table_is_copied_parents_first() -> None:
    assert {t.name for t in TABLES} == {n for n in metadata.tables if n.startswith("tk_")}
    for i, table in enumerate(TABLES):
        parents = {fk.referred_table.name for fk in table.foreign_key_constraints}
        assert parents <= {t.name for t in TABLES[:i]}


def test_a_target_with_turnkit_rows_is_refused(dbs: Databases) -> None:
    source, target = dbs.make("sqlite"), dbs.make("postgres")
    asyncio.run(_seed(source))
    assert _copy(source, target)[0] == 0

    code, out, err = _copy(source, target)

    assert code == 2
    assert err.count("\n") == 1
    assert "already holds" in err
    assert "copy into an empty database" in err
    assert "row(s) in " not in out  # no table was copied


def test_a_target_with_rows_at_another_revision_is_refused_before_it_is_migrated(
    dbs: Databases,
) -> None:
    source, target = dbs.make("sqlite"), dbs.make("sqlite")
    asyncio.run(_seed(source))
    assert _copy(source, target)[0] == 0
    path = target[0].removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE tk_alembic_version SET version_num = '0013'")

    dry = _copy(source, target, "--dry-run")
    code, out, err = _copy(source, target)

    assert dry[0] == 0
    assert "target: holds 39 turnkit row(s): the copy would be refused" in dry[1]
    assert code == 2
    assert "already holds 39 turnkit row(s)" in err
    assert "target schema" not in out
    with sqlite3.connect(path) as conn:  # not migrated
        assert conn.execute("SELECT version_num FROM tk_alembic_version").fetchall() == [("0013",)]


def test_running_or_queued_turns_are_refused_unless_forced(dbs: Databases) -> None:
    source, target = dbs.make("sqlite"), dbs.make("sqlite")

    async def queue() -> None:
        agent = Agent(model=ScriptedModel([]))
        async with SessionRuntime(agent=agent, config=_config(source)) as runtime:
            await runtime.submit("s1", "later")  # queued: no worker drives it

    asyncio.run(queue())

    code, out, err = _copy(source, target)

    assert (code, out) == (2, "")
    assert err.startswith("turnkit: the source has 1 running or queued turn(s)")
    assert err.count("\n") == 1
    assert not Path(target[0].removeprefix("sqlite:///")).exists()  # nothing was made

    code, out, err = _copy(source, target, "--force")

    assert (code, err) == (0, "")
    assert asyncio.run(_rows(target))["tk_turns"][0]["status"] == "running"


def test_a_source_at_another_revision_is_refused_and_left_alone(dbs: Databases) -> None:
    source, target = dbs.make("sqlite"), dbs.make("sqlite")
    asyncio.run(_seed(source))
    path = source[0].removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE tk_alembic_version SET version_num = '0013'")

    code, out, err = _copy(source, target)

    assert (code, out) == (2, "")
    assert "the database schema is at '0013'" in err
    assert err.count("\n") == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version_num FROM tk_alembic_version").fetchall() == [("0013",)]


def test_a_dry_run_counts_and_writes_nothing(dbs: Databases) -> None:
    source, target = dbs.make("sqlite"), dbs.make("postgres")
    asyncio.run(_seed(source))
    before = asyncio.run(_rows(source))

    code, out, err = _copy(source, target, "--dry-run")

    assert (code, err) == (0, "")
    assert f"  tk_events                {len(before['tk_events']):>10,} row(s)" in out
    assert "  checkpoints              of 1 thread(s)" in out
    assert "target: no turnkit tables yet: the copy creates them" in out
    assert out.endswith("nothing was written (--dry-run)\n")
    store = SqlStore.from_url(target[0], schema=target[1])

    async def revision() -> str | None:
        try:
            return await store.schema_revision()
        finally:
            await store.close()

    assert asyncio.run(revision()) is None


def test_the_same_database_on_both_sides_is_refused(dbs: Databases) -> None:
    source = dbs.make("sqlite")

    code, _, err = _copy(source, source)

    assert code == 2
    assert "--from and --to name the same database" in err
