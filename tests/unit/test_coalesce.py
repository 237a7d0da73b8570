"""`Coalescer`: reads asked for together are answered by one batched read."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from turnkit.store._coalesce import Coalescer


class Source:
    """A batched read that records each call and can be told to fail or to wait."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def read_many(self, keys: Sequence[int]) -> dict[int, str]:
        self.calls.append(list(keys))
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), 5)
        if self.fail is not None:
            raise self.fail
        return {k: f"v{k}" for k in keys if k % 10 != 0}


async def test_reads_asked_together_share_one_call_and_each_gets_its_own_value() -> None:
    source = Source()
    batch = Coalescer(source.read_many, most=100)
    got = await asyncio.gather(*(batch.get(k) for k in (1, 2, 3, 2, 10)))
    assert got == ["v1", "v2", "v3", "v2", None]
    assert source.calls == [[1, 2, 3, 10]]  # a key asked twice is read once


async def test_more_keys_than_one_call_takes_are_read_in_several() -> None:
    source = Source()
    batch = Coalescer(source.read_many, most=3)
    got = await asyncio.gather(*(batch.get(k) for k in range(1, 8)))
    assert got == [f"v{k}" for k in range(1, 8)]
    assert source.calls == [[1, 2, 3], [4, 5, 6], [7]]


async def test_keys_asked_while_a_read_runs_go_in_the_next_one() -> None:
    source = Source()
    source.gate = asyncio.Event()
    batch = Coalescer(source.read_many, most=100)
    first = asyncio.ensure_future(batch.get(1))
    for _ in range(3):
        await asyncio.sleep(0)
    assert source.calls == [[1]]
    later = [asyncio.ensure_future(batch.get(k)) for k in (4, 5)]
    source.gate.set()
    assert await first == "v1"
    assert [await f for f in later] == ["v4", "v5"]
    assert source.calls == [[1], [4, 5]]


async def test_a_failed_read_raises_to_everyone_in_it_and_the_next_read_works() -> None:
    source = Source()
    source.fail = RuntimeError("database gone")
    batch = Coalescer(source.read_many, most=100)
    results = await asyncio.gather(batch.get(1), batch.get(2), return_exceptions=True)
    assert [str(r) for r in results] == ["database gone", "database gone"]
    source.fail = None
    assert await batch.get(3) == "v3"


async def test_an_asker_that_stops_waiting_leaves_the_others_their_answers() -> None:
    source = Source()
    source.gate = asyncio.Event()
    batch = Coalescer(source.read_many, most=100)
    gone = asyncio.ensure_future(batch.get(1))
    kept = asyncio.ensure_future(batch.get(2))
    for _ in range(3):
        await asyncio.sleep(0)
    gone.cancel()
    source.gate.set()
    assert await kept == "v2"
    with pytest.raises(asyncio.CancelledError):
        await gone


def test_a_batch_used_from_another_event_loop_reads_alone() -> None:
    source = Source()
    batch = Coalescer(source.read_many, most=100)

    async def in_main() -> tuple[str | None, str | None]:
        gate = source.gate = asyncio.Event()
        held = asyncio.ensure_future(batch.get(1))
        for _ in range(3):
            await asyncio.sleep(0)
        box: list[str | None] = []

        def other() -> None:  # another thread's loop, while this loop's read is running
            source.gate = None
            box.append(asyncio.run(batch.get(7)))

        thread = threading.Thread(target=other)
        thread.start()
        await asyncio.to_thread(thread.join, 5)
        gate.set()
        return await held, box[0]

    assert asyncio.run(in_main()) == ("v1", "v7")


async def test_a_call_cancelled_before_it_ran_leaves_the_next_asks_answered() -> None:
    """As when its loop closes: the call's task is cancelled before its first step."""
    source = Source()
    batch = Coalescer(source.read_many, most=100)
    first = asyncio.ensure_future(batch.get(1))
    await asyncio.sleep(0)  # asked: the call's task is scheduled, not yet run
    calls = [t for t in asyncio.all_tasks() if "Coalescer._run" in repr(t.get_coro())]
    assert len(calls) == 1
    calls[0].cancel()
    await asyncio.sleep(0)
    assert await asyncio.wait_for(batch.get(2), 5) == "v2"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert source.calls == [[2]]


def test_loops_of_several_threads_asking_at_once_all_get_their_answers() -> None:
    source = Source()
    batch = Coalescer(source.read_many, most=16)
    answers: dict[int, list[str | None]] = {}

    def keys_of(offset: int) -> list[int]:
        return [offset + k for k in range(1, 1000)]

    async def ask(offset: int) -> list[str | None]:
        got: list[str | None] = []
        keys = keys_of(offset)
        for start in range(0, len(keys), 50):
            chunk = keys[start : start + 50]
            got += await asyncio.wait_for(asyncio.gather(*(batch.get(k) for k in chunk)), 10)
        return got

    def run(offset: int) -> None:
        answers[offset] = asyncio.run(ask(offset))

    threads = [threading.Thread(target=run, args=(i * 10_000,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == [0, 10_000, 20_000]
    for offset, got in answers.items():
        assert got == [f"v{k}" if k % 10 else None for k in keys_of(offset)]
