"""An embedded SQLite database on a disk that fills up: an outage to ride out, as on
PostgreSQL. The caller gets `StoreUnavailableError` (HTTP 503), nothing is half-written,
no turn is failed for it, and once there is room again the turns go on."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.errors import StoreUnavailableError
from turnkit.testing import ModelStep, ScriptedModel

ANSWER = "A long answer. " * 400  # 6 KB a turn, with its events and checkpoints more


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a file system of its own, 2 MB, that can be grown (`_grow`)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _grow(disk: Path) -> None:
    """Make room: the operator freed space."""
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)


def _runtime(disk: Path) -> SessionRuntime:
    config = RuntimeConfig(
        database_url=f"sqlite:///{disk / 'app.db'}", lease_ttl_s=1.0, recover_in_process=True
    )
    model = ScriptedModel([ModelStep.text_reply(ANSWER)], repeat_last=True)
    return SessionRuntime(agent=Agent(model=model), config=config)


async def test_a_full_disk_is_an_outage_not_a_failed_turn(small_disk: Path) -> None:
    runtime = _runtime(small_disk)
    await runtime.open()
    refused: StoreUnavailableError | None = None
    started = []
    try:
        for n in range(400):  # 2 MB holds a few dozen turns
            try:
                started.append((await runtime.start(f"s{n}", "hello")).turn_id)
            except StoreUnavailableError as exc:  # was a bare sqlite3/SQLAlchemy error
                refused = exc
                break
            for _ in range(100):  # until it ends, or an outage leaves it running
                if (await runtime.turn(started[-1])).status != "running":
                    break
                await asyncio.sleep(0.02)
        assert refused is not None, "the disk never filled"
        assert "out of disk space" in refused.message
        assert "nothing was written" in refused.message
        with pytest.raises(StoreUnavailableError):  # a caller streaming a turn is told so
            async with asyncio.timeout(20):
                [e async for e in runtime.execute_message("streamed", "hello")]
    finally:
        await runtime.close()  # on a full disk too: it raised the saver's error
    assert started

    _grow(small_disk)
    async with _runtime(small_disk) as again:
        async with asyncio.timeout(30):  # turns the outage left running are taken over
            while True:
                statuses = {t: (await again.turn(t)).status for t in started}
                if not {"running", "queued"} & set(statuses.values()):
                    break
                await asyncio.sleep(0.2)
        assert set(statuses.values()) == {"succeeded"}, statuses  # none failed for the disk
        async with asyncio.timeout(20):
            events = [e async for e in again.execute_message("after", "hello")]
        assert events[-1].type == "done"
        assert events[-1].status == "succeeded"


async def test_an_apps_own_sqlite_that_cannot_write_still_fails_the_turn(tmp_path: Path) -> None:
    """Only turnkit's own database counts as an outage, not a file the app's code writes."""
    import sqlite3

    own = tmp_path / "reference.db"
    sqlite3.connect(own).execute("CREATE TABLE notes (x)").connection.close()

    def deps(scope: object) -> object:
        conn = sqlite3.connect(f"file:{own}?mode=ro", uri=True)
        conn.execute("INSERT INTO notes VALUES (1)")  # attempt to write a readonly database
        return conn

    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'app.db'}")
    model = ScriptedModel([ModelStep.text_reply("never")])
    async with SessionRuntime(agent=Agent(model=model), config=config, deps=deps) as runtime:
        async with asyncio.timeout(20):  # it hung: the turn was left for a recovery
            events = [e async for e in runtime.execute_message("s1", "hello")]
    assert events[-1].type == "done"
    assert (events[-1].status, events[-1].error_code) == ("failed", "internal-error")
