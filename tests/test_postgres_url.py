"""A PostgreSQL URL with libpq's usual options works everywhere turnkit connects.

Production URLs carry `?sslmode=…`, `application_name=…` or `connect_timeout=…`; each of
turnkit's connections (the Store's pools, the checkpointer, the CLI) takes them, and a
URL turnkit cannot use is refused in one line that shows no password.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asyncpg

from tests.conftest import POSTGRES_URL
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.testing import ModelStep, ScriptedModel, collect_events

ROOT = Path(__file__).parent.parent
OPTIONS = "sslmode=disable&application_name=tk-url-test&connect_timeout=5"


async def test_a_turn_runs_on_a_url_with_libpq_options(pg_schema: str) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    config = RuntimeConfig(database_url=f"{POSTGRES_URL}?{OPTIONS}", database_schema=pg_schema)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "hi"))
        assert events[-1].status == "succeeded"  # type: ignore[union-attr]
        seen = await asyncpg.connect(POSTGRES_URL)
        try:
            named = await seen.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tk-url-test'"
            )
        finally:
            await seen.close()
        assert named >= 2  # the Store's connections and the checkpointer's, by the URL's name


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnkit.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_the_cli_takes_the_options_and_refuses_what_it_cannot_use(pg_schema: str) -> None:
    upgraded = _cli("db", "upgrade", "--database-url", f"{POSTGRES_URL}?{OPTIONS}",
                    "--database-schema", pg_schema)  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    assert "Traceback" not in upgraded.stderr

    bad = _cli("db", "current", "--database-url", f"{POSTGRES_URL}?connect_timeout=soon")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1, bad.stderr
    assert "connect_timeout='soon' in the database URL is not a positive number" in bad.stderr

    other = _cli("db", "current", "--database-url", "mysql://me:hunter2@db.internal/app")
    assert other.returncode == 2
    assert "hunter2" not in other.stderr
    assert other.stderr.count("\n") == 1, other.stderr
