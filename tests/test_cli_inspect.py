"""`turnkit sessions`, `turnkit turns --session` and `turnkit events`: what an operator reads."""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import db_flags
from turnkit import Agent, Organisation, RuntimeConfig, SessionRuntime, tool
from turnkit.cli import main
from turnkit.errors import ProviderError
from turnkit.store.migrate import head_revision
from turnkit.tenancy import Principal
from turnkit.testing import ModelStep, ScriptedModel, call

ANSWER = "Paris is the capital of France."


@tool
async def lookup(country: str) -> str:
    """The capital of a country."""
    return "Paris"


async def _seed(url: str, schema: str | None) -> dict[str, str]:
    """Three sessions: ann of acme (two turns, one failed), ann of globex, nobody's."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("lookup", country="France")),
            ModelStep.text_reply(ANSWER),
            ModelStep.fail(ProviderError("refused", status_code=400)),
            ModelStep.text_reply("Berlin."),
            ModelStep.text_reply("Rome."),
        ]
    )
    config = RuntimeConfig(database_url=url, database_schema=schema, max_attempts=1)
    turns: dict[str, str] = {}
    agent = Agent(model=model, tools=[lookup], skip_stages=frozenset({"anchor-plan"}))
    tenancy = [Organisation(name="acme"), Organisation(name="globex")]
    async with SessionRuntime(agent=agent, config=config, tenancy=tenancy) as rt:
        acme, globex = (
            Principal(id="ann", organisation="acme"),
            Principal(id="ann", organisation="globex"),
        )
        for key, session, text, who in (
            ("capital", "acme-1", "Capital of France?", acme),
            ("broken", "acme-1", "And of Germany?", acme),
            ("globex", "globex-1", "Capital of Germany?", globex),
            ("open", "open-1", "Capital of Italy?", None),
        ):
            submission = await rt.start(session, text, principal=who)
            async for _ in rt.reader().follow(submission.turn_id):
                pass
            turns[key] = submission.turn_id
    return turns


def _run(*argv: str, url: str, schema: str | None) -> tuple[int, str]:
    out = io.StringIO()
    flags = db_flags(url, schema)
    return main([*argv, *flags], out=out), out.getvalue()


def test_an_operator_finds_a_session_its_turns_and_a_turns_log(
    db: tuple[str, str | None], capsys: pytest.CaptureFixture[str]
) -> None:
    url, schema = db
    turns = asyncio.run(_seed(url, schema))

    code, out = _run("sessions", url=url, schema=schema)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "3 session(s), most recently active first:"
    assert [line.split()[0] for line in lines[1:]] == ["open-1", "globex-1", "acme-1"]
    assert "owner ann of acme" in lines[3]
    assert "2 message(s)" in lines[3]
    assert "  anonymous  " in lines[1]  # not "owner nobody", which reads as a principal's id

    code, out = _run("sessions", "--organisation", "acme", url=url, schema=schema)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["acme-1"]
    code, out = _run(
        "sessions", "--principal", "ann", "--organisation", "globex", url=url, schema=schema
    )
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["globex-1"]
    code, out = _run("sessions", "--principal", "bob", url=url, schema=schema)
    assert (code, out) == (0, "no sessions\n")
    code, out = _run("sessions", "--limit", "1", url=url, schema=schema)
    assert len(out.splitlines()) == 2

    code, out = _run("turns", "--session", "acme-1", url=url, schema=schema)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == 'session acme-1 "Capital of France?": 2 turn(s)'
    assert lines[1].split() == [turns["capital"], "succeeded", '"Capital', "of", 'France?"']
    assert "2 model calls" in lines[2]
    assert "agent assistant" in lines[2]
    assert lines[3].startswith(f"  {turns['broken']}  failed (")
    assert "1 model call " in lines[4]

    code, out = _run("events", turns["capital"], url=url, schema=schema)
    assert code == 0
    assert out.splitlines()[0].startswith(f"turn {turns['capital']} · session acme-1")
    assert "  ⚙ lookup(country='France')" in out
    assert ANSWER in out  # the answer's text, from its message.complete
    assert out.rstrip().endswith("✓ succeeded")
    code, out = _run("events", turns["broken"], url=url, schema=schema)
    assert "✗ error [" in out
    assert out.rstrip().endswith("■ failed")

    code, out = _run("events", turns["capital"], "--json", url=url, schema=schema)
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "turn.started"
    assert events[-1]["type"] == "done"


def test_an_unknown_session_or_turn_is_one_line(
    db: tuple[str, str | None], capsys: pytest.CaptureFixture[str]
) -> None:
    url, schema = db
    asyncio.run(_seed(url, schema))
    capsys.readouterr()
    assert _run("turns", "--session", "nope", url=url, schema=schema)[0] == 2
    assert capsys.readouterr().err == (
        "turnkit: no session 'nope' [session-not-found; see docs/errors.md#session-not-found]\n"
    )
    assert _run("turns", "--session", "bad id!", url=url, schema=schema)[0] == 2
    assert "[invalid-session-id;" in capsys.readouterr().err
    assert _run("events", "turn_nope", url=url, schema=schema)[0] == 2
    assert capsys.readouterr().err.startswith("turnkit: no turn 'turn_nope' [turn-not-found;")
    with pytest.raises(SystemExit):
        main(["turns", "--stuck", "--session", "acme-1"])
    assert "not allowed with argument" in capsys.readouterr().err


def _revision(url: str, schema: str | None) -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            table = f'"{schema}".tk_alembic_version' if schema else "tk_alembic_version"
            return str(conn.execute(text(f"SELECT version_num FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def _set_revision(url: str, schema: str | None, revision: str) -> None:
    """Make the database look as an older (or newer) turnkit left it."""
    from sqlalchemy import create_engine, text

    engine_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(engine_url)
    try:
        with engine.begin() as conn:
            table = f'"{schema}".tk_alembic_version' if schema else "tk_alembic_version"
            conn.execute(text(f"UPDATE {table} SET version_num = :v"), {"v": revision})
    finally:
        engine.dispose()


def test_reading_commands_never_migrate_the_schema(
    db: tuple[str, str | None], capsys: pytest.CaptureFixture[str]
) -> None:
    """Processes still running on the older schema must not meet a new one unannounced."""
    url, schema = db
    asyncio.run(_seed(url, schema))
    _set_revision(url, schema, "0012")
    capsys.readouterr()
    for command in (["sessions"], ["turns", "--session", "acme-1"], ["turns", "--stuck"]):
        assert _run(*command, url=url, schema=schema)[0] == 2, command
        err = capsys.readouterr().err
        assert err.startswith("turnkit: the database schema is at '0012', this turnkit reads "), err
        assert "run `turnkit db upgrade`" in err
        assert err.count("\n") == 1
    assert _revision(url, schema) == "0012"  # unchanged
    code, out = _run("db", "current", url=url, schema=schema)
    assert (code, out) == (
        1,
        f"schema: 0012 (this turnkit: {head_revision()}): behind; `turnkit db upgrade` "
        "brings it up to date\n",
    )
    _set_revision(url, schema, "9999")  # as a newer turnkit would leave it
    code, out = _run("db", "current", url=url, schema=schema)
    assert code == 1
    assert out.startswith("schema: 9999 (this turnkit: ")
    assert "written by a newer turnkit" in out
    for command in (["sessions"], ["turns", "--stuck"], ["db", "upgrade"], ["sweep"]):
        assert _run(*command, url=url, schema=schema)[0] == 2, command  # nor migrates back
        err = capsys.readouterr().err
        assert err.startswith("turnkit: the database schema is at '9999', written by a newer "
                              "turnkit (this one knows up to "), err  # fmt: skip
        assert err.count("\n") == 1
    flags = db_flags(url, schema)
    serving = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "serve", "--port", "0", *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert serving.returncode == 2  # before it serves, not a failed startup's traceback
    assert serving.stderr.startswith("turnkit: the database schema is at '9999', written by")
    assert serving.stderr.count("\n") == 1, serving.stderr
    assert _revision(url, schema) == "9999"
    _set_revision(url, schema, head_revision())  # as `turnkit db upgrade` leaves it
    assert _run("sessions", url=url, schema=schema)[0] == 0
    assert _run("db", "current", url=url, schema=schema)[1].endswith("): up to date\n")
    assert _revision(url, schema) == head_revision()  # `db current` changed nothing


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`turnkit events … | head`: the command ends as a shell tool does (exit 141)."""
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    assert (
        main(["run", "x" * 90_000, "--session", "long", "--database-url", url], out=io.StringIO())
        == 0
    )
    turn_id = next(iter(_turn_ids(url, "long")))
    reading = subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", "events", turn_id, "--json", "--database-url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reading.stdout is not None
    assert reading.stdout.read(10)  # a few bytes of a 90 KB answer, then the pipe closes
    reading.stdout.close()
    _, err = reading.communicate(timeout=60)
    assert reading.returncode == 141
    assert b"Traceback" not in err


def _turn_ids(url: str, session: str) -> list[str]:
    out = io.StringIO()
    assert main(["turns", "--session", session, "--database-url", url], out=out) == 0
    return re.findall(r"turn_[0-9a-f-]+", out.getvalue())


def test_db_current_calls_a_database_without_tables_empty_and_behind(
    db: tuple[str, str | None], tmp_path: Path
) -> None:
    """An empty SQLite file and an empty PostgreSQL schema read alike: behind, exit 1."""
    url, schema = db
    if schema is None:
        url = f"sqlite:///{tmp_path / 'empty.db'}"
        (tmp_path / "empty.db").touch()
    code, out = _run("db", "current", url=url, schema=schema)
    assert (code, out) == (
        1,
        f"schema: empty (this turnkit: {head_revision()}): behind; `turnkit db upgrade` "
        "brings it up to date\n",
    )


def test_budget_commands_never_migrate_a_database_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`budgets list|set|delete` refuse an older schema as the reading commands do.

    Only a database that is not there yet is created (`budgets set`).
    """
    from sqlalchemy import create_engine

    from turnkit.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            upgrade(conn, "0012")  # as an older turnkit left it, its processes still running
    finally:
        engine.dispose()
    capsys.readouterr()
    for command in (
        ["budgets", "list"],
        ["budgets", "delete", "--scope", "organisation"],
        ["budgets", "set", "--scope", "organisation", "--usd", "5"],
    ):
        assert _run(*command, url=url, schema=None)[0] == 2, command
        err = capsys.readouterr().err
        assert err.startswith("turnkit: the database schema is at '0012', this turnkit reads "), err
        assert err.count("\n") == 1
    assert _revision(url, None) == "0012"  # unchanged
    empty = tmp_path / "empty.db"
    empty.touch()  # a file with no turnkit tables is one `budgets set` may set up
    code, out = _run("budgets", "set", "--scope", "organisation", "--usd", "5",
                     url=f"sqlite:///{empty}", schema=None)  # fmt: skip
    assert code == 0
    assert out.startswith(f"no turnkit database at sqlite:///{empty} yet: creating it\n")
    assert _revision(f"sqlite:///{empty}", None) == head_revision()


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions"],
        ["db", "upgrade"],
        ["db", "current"],
        ["budgets", "set", "--scope", "organisation", "--usd", "5"],
    ],
)
def test_a_schema_beside_a_sqlite_url_is_refused_by_every_command(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `turnkit run` and `RuntimeConfig` refuse it: SQLite has no schemas to choose."""
    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    assert main(["db", "upgrade", "--database-url", url], out=io.StringIO()) == 0
    capsys.readouterr()
    assert _run(*argv, url=url, schema="turnkit")[0] == 2
    err = capsys.readouterr().err
    assert err.startswith("turnkit: database schema 'turnkit' applies to PostgreSQL only"), err


def test_db_copy_refuses_a_schema_beside_a_sqlite_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = tmp_path / "a.db", tmp_path / "b.db"
    assert main(["db", "upgrade", "--database-url", f"sqlite:///{source}"], out=io.StringIO()) == 0
    capsys.readouterr()
    argv = ["db", "copy", "--from", f"sqlite:///{source}", "--to", f"sqlite:///{target}"]
    assert main([*argv, "--to-schema", "turnkit"], out=io.StringIO()) == 2
    assert "applies to PostgreSQL only" in capsys.readouterr().err
    assert not target.exists()  # nothing copied into the file as if it were the schema
