"""`turnkit db copy` losing a database mid-copy: one line on stderr, a non-zero exit, and
a target left with no turnkit row (the rows go in one target transaction)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.services import PrivatePostgres, private_postgres  # noqa: F401 - fixture
from tests.test_cli_db_copy import DB, Databases, _copy, _rows, _seed, dbs  # noqa: F401
from turnkit.store import _copy_sql


def _kill_after(pages: int, kill: Callable[[], None], patch: pytest.MonkeyPatch) -> None:
    """Stop the database once `pages` pages have been inserted on the target."""
    insert = _copy_sql._insert
    done = [0]

    def insert_then_kill(conn: Any, *args: Any) -> None:
        insert(conn, *args)
        done[0] += 1
        if done[0] == pages:
            kill()

    patch.setattr(_copy_sql, "_insert", insert_then_kill)


def test_a_source_lost_mid_copy_is_one_line_and_leaves_the_target_without_rows(
    private_postgres: PrivatePostgres,  # noqa: F811
    dbs: Databases,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source: DB = (private_postgres.url, None)
    target = dbs.make("sqlite")
    asyncio.run(_seed(source))
    _kill_after(2, private_postgres.kill, monkeypatch)

    code, out, err = _copy(source, target, "--batch-size", "2")

    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith("turnkit: the copy stopped: the source database cannot be reached")
    assert "the target holds no turnkit row" in err
    assert "Traceback" not in err
    monkeypatch.undo()
    assert not any(asyncio.run(_rows(target)).values())


def test_a_target_lost_mid_copy_is_one_line_and_keeps_no_rows(
    private_postgres: PrivatePostgres,  # noqa: F811
    dbs: Databases,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = dbs.make("sqlite")
    target: DB = (private_postgres.url, None)
    asyncio.run(_seed(source))
    _kill_after(2, private_postgres.kill, monkeypatch)

    code, out, err = _copy(source, target, "--batch-size", "2")

    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith("turnkit: the copy stopped: the target database cannot be reached")
    assert "the target holds no turnkit row" in err
    monkeypatch.undo()
    private_postgres.start()
    assert not any(asyncio.run(_rows(target)).values())


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_database_lost_while_checkpoints_are_copied_is_one_line(
    private_postgres: PrivatePostgres,  # noqa: F811
    dbs: Databases,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    side: str,
) -> None:
    from turnkit.cli import _copy as cli_copy

    pg: DB = (private_postgres.url, None)
    source, target = (pg, dbs.make("sqlite")) if side == "source" else (dbs.make("sqlite"), pg)
    asyncio.run(_seed(source))
    read_thread = cli_copy.read_thread

    async def kill_then_read(*args: Any) -> Any:
        private_postgres.kill()
        return await read_thread(*args)

    monkeypatch.setattr(cli_copy, "read_thread", kill_then_read)

    code, out, err = _copy(source, target)

    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith(f"turnkit: the copy stopped: the {side} database cannot be reached")
    assert "the target holds no turnkit row" in err
    monkeypatch.undo()
    if side == "target":
        private_postgres.start()
    assert not any(asyncio.run(_rows(target)).values())
