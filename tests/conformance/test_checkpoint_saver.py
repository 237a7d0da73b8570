"""The embedded SQLite checkpointer stores what a resume needs, and no transaction more.

LangGraph asks for an input checkpoint, then the START task's checkpoint, and for each
task's writes before the checkpoint that holds their result. The saver folds the input
checkpoint into the next transaction and drops task writes a newer checkpoint supersedes;
pending writes of the newest checkpoint, and LangGraph's own channels, are kept.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import LoopTicker
from tests.support.checkpoints import THREAD, checkpoint, config

from turnkit.graph import open_checkpointer


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
    await saver.aput(config(), checkpoint(0), {"source": "input", "step": -1}, {})
    assert _stored(db) == (0, 0)  # held: nothing has run from it yet
    await saver.aput(config(parent=0), checkpoint(1), {"source": "loop", "step": 0}, {})
    assert _stored(db) == (2, 0)
    history = [t async for t in saver.alist({"configurable": {"thread_id": THREAD}})]
    assert [t.checkpoint["id"] for t in history] == [checkpoint(1)["id"], checkpoint(0)["id"]]
    assert history[0].parent_config is not None
    assert history[0].parent_config["configurable"]["checkpoint_id"] == checkpoint(0)["id"]


async def test_task_writes_a_newer_checkpoint_holds_are_not_stored(
    saver: Any, tmp_path: Path
) -> None:
    db = tmp_path / "tk.checkpoints.db"
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", "next")], "task-a")
    await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    assert _stored(db) == (2, 0)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.checkpoint["channel_values"] == {"content": "state 2"}
    assert found.pending_writes == []


async def test_pending_writes_of_the_newest_checkpoint_are_kept(saver: Any, tmp_path: Path) -> None:
    db = tmp_path / "tk.checkpoints.db"
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", "done")], "task-a")
    # a sibling task fails: LangGraph's error write goes at once, the held write with it
    await saver.aput_writes(config(parent=1), [("__error__", "boom")], "task-b")
    assert _stored(db) == (1, 2)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert sorted(found.pending_writes) == [
        ("task-a", "content", "done"),
        ("task-b", "__error__", "boom"),
    ]


async def test_the_last_stages_checkpoint_waits_for_the_turns_ending(
    saver: Any, tmp_path: Path
) -> None:
    db = tmp_path / "tk.checkpoints.db"
    last = False
    release = saver.hold_last(THREAD, lambda: last)
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    assert _stored(db) == (1, 0)  # not the last stage's: stored at once
    last = True
    await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    assert _stored(db) == (1, 0)  # held: its stage's events are not committed yet
    assert saver.take_written(THREAD) == checkpoint(2)["id"]
    await release(True)  # the ending is committed: now it may follow them
    assert _stored(db) == (2, 0)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.checkpoint["id"] == checkpoint(2)["id"]


async def test_a_held_last_checkpoint_is_dropped_unless_wanted(saver: Any, tmp_path: Path) -> None:
    db = tmp_path / "tk.checkpoints.db"
    release = saver.hold_last(THREAD, lambda: True)
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await release(False)  # the ending failed (a resume starts that stage again), or pruned
    assert _stored(db) == (0, 0)
    await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
    assert _stored(db) == (1, 0)  # released: the thread's checkpoints are stored again


async def test_a_cancelled_tasks_writes_are_not_stored(saver: Any, tmp_path: Path) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    # The node returned (its writes are in), then its task was cancelled: LangGraph saves
    # its writes with the error. A resume would take them as the node's result, though
    # the events it staged were never committed: none is stored, so the node runs again.
    writes = [("content", "done"), ("__error__", asyncio.CancelledError())]
    await saver.aput_writes(config(parent=1), writes, "task-a")
    assert _stored(tmp_path / "tk.checkpoints.db") == (1, 0)
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.pending_writes == []


async def test_a_read_sees_writes_still_held(saver: Any) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", "pending")], "task-a")
    found = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
    assert found is not None
    assert found.pending_writes == [("task-a", "content", "pending")]


class _NotStorable:
    """A value LangGraph's serializer refuses."""


async def test_a_held_write_that_cannot_be_stored_blocks_no_other_turn(
    saver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
    await saver.aput_writes(config(parent=1), [("content", _NotStorable())], "task-a")
    other: Any = {"configurable": {"thread_id": "turn-2", "checkpoint_ns": ""}}
    await saver.aput(other, checkpoint(5), {"source": "loop", "step": 0}, {})
    found = await saver.aget_tuple({"configurable": {"thread_id": "turn-2"}})
    assert found is not None
    assert found.checkpoint["id"] == checkpoint(5)["id"]
    assert "dropped a held task write of thread turn-1" in caplog.text


async def test_a_read_waiting_on_the_thread_leaves_the_loop_no_lock_wait(tmp_path: Path) -> None:
    """A read the saver's thread runs (its lock was busy) sets a long busy timeout on the
    shared connection; the loop must not write through it meanwhile and wait on another
    process's lock. The write waits on the thread instead, and the loop keeps running."""
    saver, close = await open_checkpointer(f"sqlite:///{tmp_path / 'tk.db'}")
    try:
        await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
        plain_get_tuple = saver.get_tuple

        def slow_on_the_thread(config: Any) -> Any:
            if threading.current_thread().name.startswith("turnkit-checkpoints"):
                time.sleep(0.3)  # the read sits on the thread, long timeout set
            return plain_get_tuple(config)

        saver.get_tuple = slow_on_the_thread
        taken = threading.Event()

        def hold_lock() -> None:
            with saver.lock:
                taken.set()
                time.sleep(0.05)

        threading.Thread(target=hold_lock).start()
        taken.wait()
        read = asyncio.create_task(saver.aget_tuple({"configurable": {"thread_id": THREAD}}))
        await asyncio.sleep(0.1)  # the read went to the thread
        other = sqlite3.connect(
            tmp_path / "tk.checkpoints.db", isolation_level=None, check_same_thread=False
        )
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock for 0.6 s
        releaser = threading.Timer(0.6, lambda: other.execute("COMMIT"))
        releaser.start()
        async with LoopTicker() as ticker:
            started = time.perf_counter()
            await saver.aput(config(parent=1), checkpoint(2), {"source": "loop", "step": 1}, {})
            elapsed = time.perf_counter() - started
        await read
        releaser.join()
        other.close()
        assert elapsed >= 0.3  # it did wait for the other process's lock ...
        assert ticker.ticks >= elapsed / 0.01 / 2  # ... but not on the loop
    finally:
        await close()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
async def test_an_in_memory_url_keeps_checkpoints_in_memory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    saver, close = await open_checkpointer(url)
    try:
        await saver.aput(config(), checkpoint(1), {"source": "loop", "step": 0}, {})
        assert await saver.aget_tuple({"configurable": {"thread_id": THREAD}}) is not None
    finally:
        await close()
    assert os.listdir(tmp_path) == []  # no file in the working directory


async def test_a_new_threads_opening_read_reads_nothing(
    saver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object) -> None:
        raise AssertionError("read the database")

    saver.expect_new(THREAD)
    monkeypatch.setattr(saver, "get_tuple", refused)
    assert await saver.aget_tuple(config()) is None
    monkeypatch.undo()
    await saver.aput(config(), checkpoint(0), {"source": "loop", "step": 0}, {})
    found = await saver.aget_tuple(config())  # taken once: later reads read
    assert found is not None
    assert found.checkpoint["id"] == checkpoint(0)["id"]


async def test_checkpoints_that_wait_for_the_lock_share_a_transaction(tmp_path: Path) -> None:
    """Under load the loop finds the lock taken and hands checkpoints to the saver's thread:
    those that queue meanwhile are committed together, and one that fails fails alone."""
    saver, close = await open_checkpointer(f"sqlite:///{tmp_path / 'tk.db'}")
    try:
        put = saver.put

        def put_refusing_one(conf: Any, *args: Any) -> Any:
            if conf["configurable"]["thread_id"] == "bad":
                raise ValueError("this one cannot be stored")
            return put(conf, *args)

        saver.put = put_refusing_one
        taken, release = threading.Event(), threading.Event()

        def hold_lock() -> None:  # as a batch on the thread would: the loop must not wait
            with saver.lock:
                taken.set()
                release.wait(5)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        assert taken.wait(5)
        threads = [f"t{i}" for i in range(20)] + ["bad"]
        writes = [
            asyncio.create_task(
                saver.aput(config(thread=t), checkpoint(1), {"source": "loop", "step": 1}, {})
            )
            for t in threads
        ]
        await asyncio.sleep(0.1)
        assert not any(w.done() for w in writes)  # all waiting for the lock, off the loop
        release.set()
        outcomes = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 10)
        holder.join(5)
        assert [type(o).__name__ for o in outcomes] == ["dict"] * 20 + ["ValueError"]
        assert saver.group.committed == 21
        assert saver.group.batches <= 3  # not one transaction each
        for t in threads[:-1]:
            found = await saver.aget_tuple({"configurable": {"thread_id": t}})
            assert found is not None, t
        assert await saver.aget_tuple({"configurable": {"thread_id": "bad"}}) is None
        assert _stored(tmp_path / "tk.checkpoints.db")[0] == 20
    finally:
        await close()


async def test_a_checkpoint_drops_only_its_own_turns_held_writes(
    saver: Any, tmp_path: Path
) -> None:
    """With many turns at once, many turns' task writes wait for the next transaction. A
    turn's new checkpoint drops the writes it supersedes (its parent's), and no other
    turn's; the drop is made once, when a transaction takes what is held, not by looking
    through every turn's held writes at each put."""
    turns = 200
    for i in range(turns):  # held: the next transaction writes them
        await saver.aput_writes(config(parent=1, thread=f"t{i}"), [("content", "x")], "task")
    for i in range(turns):  # each turn's input checkpoint, held too
        await saver.aput(config(thread=f"n{i}"), checkpoint(0), {"source": "input"}, {})
    # One transaction takes what is held: t0's write is superseded by its new checkpoint.
    await saver.aput(config(parent=1, thread="t0"), checkpoint(2), {"source": "loop"}, {})
    assert _stored(tmp_path / "tk.checkpoints.db") == (turns + 1, turns - 1)
