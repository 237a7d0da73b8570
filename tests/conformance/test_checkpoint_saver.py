"""The embedded SQLite checkpointer stores what a resume needs, and no transaction more.

LangGraph asks for an input checkpoint, then the START task's checkpoint, and for each
task's writes before the checkpoint that holds their result. The saver folds the input
checkpoint into the next transaction and drops task writes a newer checkpoint supersedes;
pending writes of the newest checkpoint, and LangGraph's own channels, are kept.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from turnkit.graph import open_checkpointer

THREAD = "turn-1"


def _checkpoint(n: int) -> Any:
    return {
        "v": 4,
        "id": f"1f0a0000-0000-6000-8000-{n:012d}",
        "ts": "2026-05-01T12:00:00+00:00",
        "channel_values": {"content": f"state {n}"},
        "channel_versions": {"content": n + 1},
        "versions_seen": {},
    }


def _config(parent: int | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = _checkpoint(parent)["id"]
    return {"configurable": conf}


def _stored(path: Path) -> tuple[int, int]:
    """(checkpoints, writes) on disk, read through a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        checkpoints = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        writes = conn.execute("SELECT count(*) FROM writes").fetchone()[0]
    finally:
        conn.close()
    return checkpoints, writes


@pytest.fixture
async def saver(tmp_path: Path) -> AsyncIterator[Any]:
    opened, close = await open_checkpointer(f"sqlite:///{tmp_path / 'tk.db'}")
    try:
        yield opened
    finally:
        await close()


async def test_the_input_checkpoint_lands_with_the_next_one(saver: Any, tmp_path: Path) -> None:
    db = tmp_path / "tk.checkpoints.db"
    await saver.aput(_config(), _checkpoint(0), {"source": "input", "step": -1}, {})
    assert _stored(db) == (0, 0)  # held: nothing has run from it yet
    await saver.aput(_config(parent=0), _checkpoint(1), {"source": "loop", "step": 0}, {})
    assert _stored(db) == (2, 0)
    history = [t async for t in saver.alist({"configurable": {"thread_id": THREAD}})]
    assert [t.checkpoint["id"] for t in history] == [_checkpoint(1)["id"], _checkpoint(0)["id"]]
    assert history[0].parent_config is not None
    assert history[0].parent_config["configurable"]["checkpoint_id"] == _checkpoint(0)["id"]


async def test_task_writes_a_newer_checkpoint_holds_are_not_stored(
    saver: Any, tmp_path: Path
) -> None:
    db = tmp_path / "tk.checkpoints.db"
    await saver.aput(_config(), _checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(_config(parent=1), [("content", "next")], "task-a")
    await saver.aput(_config(parent=1), _checkpoint(2), {"source": "loop", "step": 1}, {})
    assert _stored(db) == (2, 0)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.checkpoint["channel_values"] == {"content": "state 2"}
    assert found.pending_writes == []


async def test_pending_writes_of_the_newest_checkpoint_are_kept(saver: Any, tmp_path: Path) -> None:
    db = tmp_path / "tk.checkpoints.db"
    await saver.aput(_config(), _checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(_config(parent=1), [("content", "done")], "task-a")
    # a sibling task fails: LangGraph's error write goes at once, the held write with it
    await saver.aput_writes(_config(parent=1), [("__error__", "boom")], "task-b")
    assert _stored(db) == (1, 2)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert sorted(found.pending_writes) == [
        ("task-a", "content", "done"),
        ("task-b", "__error__", "boom"),
    ]


async def test_a_read_sees_writes_still_held(saver: Any) -> None:
    await saver.aput(_config(), _checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(_config(parent=1), [("content", "pending")], "task-a")
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.pending_writes == [("task-a", "content", "pending")]
