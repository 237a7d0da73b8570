"""The commit started before a model call: what streams meanwhile waits for it, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from turnkit.clock import SystemClock
from turnkit.events import (
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    ErrorEvent,
    PluginSignalEvent,
    StepEndEvent,
    StepStartEvent,
)
from turnkit.ids import SessionId, TurnId
from turnkit.store import CommitResult
from turnkit.telemetry import Recorder


class _GatedStore:
    """Commits only when the test opens each one's gate; logs what it committed."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.gates: list[asyncio.Event] = []

    async def commit(self, turn_id: TurnId, *, events: Sequence[DurableEvent], **_: Any) -> Any:
        gate = asyncio.Event()
        self.gates.append(gate)
        await asyncio.wait_for(gate.wait(), 5)
        self.log.extend(f"commit {e.seq}" for e in events)
        return CommitResult(carried=_.get("rider") is not None)

    async def open_all(self) -> None:
        for _ in range(50):  # bounded: each pass lets waiting commits reach their gates
            for gate in self.gates:
                gate.set()
            await asyncio.sleep(0.001)


def _recorder(log: list[str]) -> tuple[Recorder, _GatedStore]:
    store = _GatedStore(log)

    def publish(events: Sequence[DurableEvent | EphemeralEvent]) -> None:
        for e in events:
            log.append(f"send {e.seq}" if isinstance(e, DurableEvent) else f"send {e.type}")

    rec = Recorder(
        store=store,  # type: ignore[arg-type]
        session_id=SessionId("s"),
        turn_id=TurnId("t"),
        epoch=1,
        clock=SystemClock(),
        publish=publish,
    )
    return rec, store


def _sent_after_committed(log: list[str]) -> None:
    committed: set[str] = set()
    for line in log:
        kind, what = line.split(" ", 1)
        if kind == "commit":
            committed.add(what)
        elif what.isdigit():
            assert what in committed, f"{line} before its commit: {log}"


async def test_a_second_commit_ahead_waits_for_the_first_and_keeps_order() -> None:
    """A checkpoint waiting on the first commit does not let the next call's commit pass it."""
    log: list[str] = []
    rec, store = _recorder(log)
    rec.durable(StepStartEvent, "tool-loop", step="tool-loop", iteration=1)
    await rec.flush_ahead()
    await rec.delta("tool-loop", "b1", "one")
    rec.durable(StepEndEvent, "tool-loop", step="tool-loop", iteration=1, duration_ms=1.0)
    checkpoint = asyncio.create_task(rec.commit_carrying(rider=object()))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # it waits for the first commit
    rec.durable(StepStartEvent, "synthesize", step="synthesize")
    second = asyncio.create_task(rec.flush_ahead())
    await asyncio.sleep(0)
    await store.open_all()
    await asyncio.wait_for(asyncio.gather(checkpoint, second), 5)
    await rec.delta("synthesize", "b2", "two")
    await store.open_all()
    await rec.join_ahead()
    sent = [line for line in log if line.startswith("send")]
    assert sent == ["send 1", "send message.delta", "send 2", "send 3", "send message.delta"]
    _sent_after_committed(log)


async def test_a_plugin_event_sent_from_the_commits_own_callback_goes_out() -> None:
    log: list[str] = []
    rec, store = _recorder(log)

    async def on_commit(events: Sequence[DurableEvent]) -> None:
        await rec.ephemeral(PluginSignalEvent, "tool-loop", plugin="p", name="plugin.p.seen")

    rec.on_commit = on_commit
    rec.durable(StepStartEvent, "tool-loop", step="tool-loop", iteration=1)
    await rec.flush_ahead()
    await store.open_all()  # the commit and its callback finish before anyone waits
    await rec.join_ahead()
    assert log == ["commit 1", "send 1", "send plugin.signal"]


async def test_a_waiter_cancelled_does_not_cut_the_commit_off() -> None:
    log: list[str] = []
    rec, store = _recorder(log)
    rec.durable(StepStartEvent, "tool-loop", step="tool-loop", iteration=1)
    await rec.flush_ahead()
    waiter = asyncio.create_task(rec.flush())
    await asyncio.sleep(0.001)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await store.open_all()
    await rec.join_ahead()
    assert log == ["commit 1", "send 1"]


async def test_a_turn_left_at_shutdown_commits_its_work_but_none_of_its_ending() -> None:
    """An ending cut off on its way (its `error` staged with its `done`) is not committed.

    The step's work before it is: the attempt that takes the turn over writes its own ending.
    """
    log: list[str] = []
    rec, store = _recorder(log)
    rec.durable(StepStartEvent, "tool-loop", step="tool-loop", iteration=1)
    rec.ending_begins()
    rec.durable(ErrorEvent, "runtime", code="internal-error", message="cut off", details={})
    rec.durable(DoneEvent, "runtime", status="failed", error_code="internal-error")
    left = asyncio.create_task(rec.commit_left())
    await store.open_all()
    await asyncio.wait_for(left, 5)
    assert [line for line in log if line.startswith("commit")] == ["commit 1"]
