"""The `turnkit` command line, in-process."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from turnkit.cli import main


def test_run_streams_a_turn_on_the_offline_demo_model(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(
        ["run", "What is (12 + 3) * 7?", "--database-url", f"sqlite:///{tmp_path / 'cli.db'}"],
        out=out,
    )
    text = out.getvalue()
    assert code == 0
    assert "OFFLINE DEMO model" in text  # clearly labelled as a demo
    assert "calculator(expression='(12 + 3) * 7')" in text
    assert "→ 105" in text
    assert "[demo model]" in text
    assert "✓ succeeded" in text


def test_db_upgrade_then_sweep(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    out = io.StringIO()
    assert main(["db", "upgrade", "--database-url", url], out=out) == 0
    assert "empty →" in out.getvalue()
    again = io.StringIO()
    assert main(["db", "upgrade", "--database-url", url], out=again) == 0
    assert "→" in again.getvalue()
    swept = io.StringIO()
    assert main(["sweep", "--database-url", url], out=swept) == 0
    assert "swept 0 turn(s)" in swept.getvalue()


def test_a_bad_agent_path_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    code = main(["worker", "--agent", "nowhere", "--database-url", url], out=io.StringIO())
    assert code == 2
    assert "package.module:name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://x", "supports SQLite and PostgreSQL"),
        ("sqlite:////nonexistent-dir/x.db", "does its folder exist"),
        ("postgresql://postgres@127.0.0.1:1/x", "the database cannot be reached"),
    ],
)
def test_a_bad_database_url_is_one_clear_line(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "hi", "--database-url", url], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert says in err
    assert err.count("\n") == 1  # one line, no traceback
    assert err.startswith("turnkit: ")


def test_a_missing_extra_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "redis", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    monkeypatch.delitem(sys.modules, "turnkit.replay.redis", raising=False)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    code = main(
        ["worker", "--redis-url", "redis://127.0.0.1:1", "--database-url", url], out=io.StringIO()
    )
    err = capsys.readouterr().err
    assert code == 2
    assert 'pip install "turnkit[redis]"' in err
    assert err.count("\n") == 1


async def _abandoned_turn(url: str) -> str:
    from turnkit import Agent, RuntimeConfig, SessionRuntime
    from turnkit.testing import ModelStep, ScriptedModel

    config = RuntimeConfig(database_url=url, lease_ttl_s=0.2)
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.hang("...")])), config=config
    )
    async with runtime:
        submission = await runtime.submit("s1", "hi", claim=True)  # claimed, never driven
    return submission.turn_id


def test_turns_stuck_lists_a_turn_with_no_live_driver(tmp_path: Path) -> None:
    import asyncio
    import time

    url = f"sqlite:///{tmp_path / 'stuck.db'}"
    clean = io.StringIO()
    assert main(["db", "upgrade", "--database-url", url], out=io.StringIO()) == 0
    assert main(["turns", "--stuck", "--database-url", url], out=clean) == 0
    assert "no stuck turns" in clean.getvalue()
    turn_id = asyncio.run(_abandoned_turn(url))
    time.sleep(0.3)  # its lease lapses
    out = io.StringIO()
    assert main(["turns", "--stuck", "--database-url", url], out=out) == 1
    assert turn_id in out.getvalue()
    assert "no live driver" in out.getvalue()
