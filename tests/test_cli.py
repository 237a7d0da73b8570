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
