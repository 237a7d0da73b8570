"""A single-process app recovers its own turns after a restart (`recover_in_process`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

from pydantic import JsonValue

from tests.helpers import turn_status
from turnkit import Agent, Approve, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.errors import StoreUnavailableError
from turnkit.events import (
    ApprovalRequestedEvent,
    StreamEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
)
from turnkit.ids import TurnId
from turnkit.models import ToolSpec
from turnkit.testing import ModelStep, ScriptedModel, call
from turnkit.tools import NOT_APPLIED, Tool

SLOW = {"seconds": 60.0}


@tool
async def fetch(n: int) -> int:
    """Fetch something slowly."""
    await asyncio.sleep(SLOW["seconds"])
    return n


def _runtime(db: Path, model: ScriptedModel, *, recover: bool) -> SessionRuntime:
    config = RuntimeConfig(
        database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=recover
    )
    return SessionRuntime(agent=Agent(model=model, tools=[fetch]), config=config)


async def test_a_restarted_app_finishes_the_turn_it_was_driving(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    before = ScriptedModel([ModelStep.tool_call_reply(call("fetch", n=7))])
    first = _runtime(db, before, recover=True)
    await first.open()
    submission = await first.start("s1", "fetch 7")
    started = False
    for _ in range(200):  # bounded: until the tool runs
        events = [e async for e in first.events(submission.turn_id)]
        if any(isinstance(e, ToolStartedEvent) for e in events):
            started = True
            break
        await asyncio.sleep(0.02)
    assert started
    await first.close()  # the process goes away mid-tool (its lease lapses, nothing ends)
    assert (await turn_status(db, submission.turn_id)) == "running"

    SLOW["seconds"] = 0.0
    after = ScriptedModel([ModelStep.text_reply("Got 7.")])
    second = _runtime(db, after, recover=True)
    await second.open()  # no `turnkit worker` anywhere: the app recovers it itself
    try:
        deadline = time.monotonic() + 20
        while (await second.turn(submission.turn_id)).status == "running":
            assert time.monotonic() < deadline, "the restarted app never took the turn over"
            await asyncio.sleep(0.05)
        record = await second.turn(submission.turn_id)
        assert record.status == "succeeded"
        assert record.attempts == 2
        [turn] = await second.history("s1")
        assert turn.answer == "Got 7."
    finally:
        await second.close()
        SLOW["seconds"] = 60.0


async def test_without_the_switch_the_turn_waits_for_a_worker(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    first = _runtime(
        db, ScriptedModel([ModelStep.tool_call_reply(call("fetch", n=1))]), recover=False
    )
    await first.open()
    submission = await first.start("s1", "fetch 1")
    await asyncio.sleep(0.3)
    await first.close()
    second = _runtime(db, ScriptedModel([ModelStep.text_reply("x")]), recover=False)
    await second.open()
    try:
        await asyncio.sleep(1.5)  # past the lease: nobody takes it over
        assert (await second.turn(submission.turn_id)).status == "running"
    finally:
        await second.close()


RAN: list[int] = []


async def _already_sent(key: str, arguments: dict[str, object]) -> object:
    """The reconcile hook: the payment provider knows this key, so it took effect."""
    return {"sent": arguments["amount"], "key": key} if SENT.get(key) else NOT_APPLIED


SENT: dict[str, bool] = {}


@tool(reconcile=_already_sent)
async def pay(amount: int, ctx: ToolContext) -> dict[str, object]:
    """Pay once (the provider dedupes on the idempotency key)."""
    SENT[ctx.idempotency_key] = True  # it takes effect ...
    RAN.append(amount)
    await asyncio.sleep(SLOW["seconds"])  # ... and the process dies before the result lands
    return {"sent": amount, "key": ctx.idempotency_key}


def _recovering(db: Path, tool: Tool, model: ScriptedModel) -> SessionRuntime:
    """A runtime that takes over turns whose driver is gone (a 1 s lease)."""
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=True)
    return SessionRuntime(agent=Agent(model=model, tools=[tool]), config=config)


async def _dies_mid_call(first: SessionRuntime, message: str) -> TurnId:
    """Start a turn whose tool appends to RAN, and close the runtime once the tool runs."""
    await first.open()
    submission = await first.start("s1", message)
    for _ in range(200):
        if RAN:
            break
        await asyncio.sleep(0.02)
    await first.close()  # dies after the call took effect, before its result was saved
    return submission.turn_id


async def _taken_over(second: SessionRuntime, turn_id: TurnId) -> list[StreamEvent]:
    """Open `second`, wait for it to end the turn; the turn's events."""
    await second.open()
    try:
        deadline = time.monotonic() + 20
        while (await second.turn(turn_id)).status == "running":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        return [e async for e in second.events(turn_id)]
    finally:
        await second.close()


async def test_a_call_in_doubt_is_reconciled_not_run_twice(tmp_path: Path) -> None:
    first = _recovering(
        tmp_path / "pay.db", pay, ScriptedModel([ModelStep.tool_call_reply(call("pay", amount=40))])
    )
    turn_id = await _dies_mid_call(first, "pay 40")
    SLOW["seconds"] = 0.0
    try:
        second = _recovering(
            tmp_path / "pay.db", pay, ScriptedModel([ModelStep.text_reply("Paid.")])
        )
        events = await _taken_over(second, turn_id)
    finally:
        SLOW["seconds"] = 60.0
    assert RAN == [40]  # the payment ran once
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert doubt.resolution == "reconciled"
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == {"sent": 40, "key": doubt.idempotency_key}
    [recovering] = [e for e in events if isinstance(e, TurnRecoveringEvent)]
    assert recovering.attempt == 2
    assert events[-1].type == "done"


class _PayByHand:
    """`pay` written by hand, its reconcile hook in the decorator's shape by mistake: it
    returns the receipt (a two-key dict) instead of `(applied, result)`."""

    name = "pay"

    def spec(self) -> ToolSpec:
        return pay.spec()

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        return await pay.invoke(arguments, ctx)

    async def reconcile(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> object:
        return {"sent": arguments["amount"], "key": ctx.idempotency_key}


async def test_a_reconcile_answer_of_the_wrong_shape_fails_the_call_not_runs_it_again(
    tmp_path: Path,
) -> None:
    """A two-key dict must not unpack into (applied, result), nor the payment run twice."""
    RAN.clear()
    by_hand = _PayByHand()
    first = _recovering(
        tmp_path / "pay.db",
        by_hand,
        ScriptedModel([ModelStep.tool_call_reply(call("pay", amount=40))]),
    )
    turn_id = await _dies_mid_call(first, "pay 40")
    SLOW["seconds"] = 0.0
    try:
        model = ScriptedModel([ModelStep.text_reply("It may have gone through; check.")])
        events = await _taken_over(_recovering(tmp_path / "pay.db", by_hand, model), turn_id)
    finally:
        SLOW["seconds"] = 60.0
    assert RAN == [40]  # not run again
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert doubt.resolution == "failed"
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert "the reconcile hook of 'pay' returned dict" in (failed.result.error or "")
    assert [e.type for e in events if e.type == "tool.completed"] == []
    assert events[-1].type == "done"


SEEN_WHILE_RERUN: list[str] = []
RUNTIME: dict[str, SessionRuntime] = {}


@tool
async def export(rows: int, ctx: ToolContext) -> int:
    """Export rows (no reconcile hook: a call in doubt runs again)."""
    if "second" in RUNTIME:  # the re-run: what has the turn committed by now?
        events = RUNTIME["second"].events(ctx.turn_id)
        SEEN_WHILE_RERUN.extend([e.type async for e in events])
        return rows
    RAN.append(rows)
    await asyncio.sleep(60)  # the process dies mid-call
    return rows


async def test_a_call_run_again_is_in_doubt_on_record_before_it_runs(tmp_path: Path) -> None:
    """Readers learn at once that the call runs again, not only once it has finished."""
    db = tmp_path / "export.db"
    RAN.clear()
    first = _recovering(
        db, export, ScriptedModel([ModelStep.tool_call_reply(call("export", rows=7))])
    )
    turn_id = await _dies_mid_call(first, "export")
    second = _recovering(db, export, ScriptedModel([ModelStep.text_reply("Exported.")]))
    RUNTIME["second"] = second
    try:
        await _taken_over(second, turn_id)
    finally:
        RUNTIME.clear()
    assert SEEN_WHILE_RERUN[-2:] == ["turn.recovering", "tool.in_doubt"]


APPROVED: list[int] = []


@tool(approval="always", reconcile=_already_sent)
async def pay_approved(amount: int, ctx: ToolContext) -> dict[str, object]:
    """Pay once a person approved it (the provider dedupes on the idempotency key)."""
    SENT[ctx.idempotency_key] = True  # it takes effect ...
    APPROVED.append(amount)
    await asyncio.sleep(SLOW["seconds"])  # ... and the process dies before the result lands
    return {"sent": amount, "key": ctx.idempotency_key}


async def test_an_approved_call_killed_while_it_ran_is_in_doubt(tmp_path: Path) -> None:
    """Approved, then the process died mid-call: the next attempt reconciles, not re-runs."""
    db = tmp_path / "approved.db"
    agent = Agent(
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("pay_approved", amount=40)),
                ModelStep.text_reply("Paid."),
            ]
        ),
        tools=[pay_approved],
    )

    def runtime() -> SessionRuntime:
        config = RuntimeConfig(
            database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=True
        )
        return SessionRuntime(agent=agent, config=config)

    first = runtime()
    await first.open()
    events = [e async for e in first.execute_message("s1", "pay 40")]
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    await first.resume(asked.turn_id, asked.request_id, Approve())
    for _ in range(200):
        if APPROVED:
            break
        await asyncio.sleep(0.02)
    assert APPROVED == [40]
    await first.close()  # dies after the approved payment took effect, before its result
    SLOW["seconds"] = 0.0
    second = runtime()
    await second.open()
    try:
        deadline = time.monotonic() + 20
        while (await second.turn(asked.turn_id)).status == "running":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        record = await second.turn(asked.turn_id)
        events = [e async for e in second.events(asked.turn_id)]
    finally:
        await second.close()
        SLOW["seconds"] = 60.0
    assert record.status == "succeeded"
    assert APPROVED == [40]  # the payment ran once
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert (doubt.tool_name, doubt.resolution) == ("pay_approved", "reconciled")
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == {"sent": 40, "key": doubt.idempotency_key}
    assert [e.type for e in events].count("approval.requested") == 1  # not asked again


async def test_a_turn_whose_database_drops_mid_turn_is_recovered_not_failed(
    tmp_path: Path,
) -> None:
    """An attempt that cannot reach the database stops writing; a later one finishes."""
    model = ScriptedModel(
        [
            ModelStep.fail(StoreUnavailableError("the database is unavailable: test")),
            ModelStep.text_reply("Back again."),
        ]
    )
    runtime = _runtime(tmp_path / "drop.db", model, recover=True)
    await runtime.open()
    try:
        submission = await runtime.start("s1", "hello")
        deadline = time.monotonic() + 20
        while (await runtime.turn(submission.turn_id)).status == "running":
            assert time.monotonic() < deadline, "the turn was never taken over"
            await asyncio.sleep(0.05)
        record = await runtime.turn(submission.turn_id)
        events = [e async for e in runtime.events(submission.turn_id)]
    finally:
        await runtime.close()
    assert (record.status, record.attempts) == ("succeeded", 2)
    assert [e.type for e in events if e.type in ("error", "turn.recovering")] == ["turn.recovering"]


async def test_closing_hands_a_recovered_turn_over_at_once(tmp_path: Path) -> None:
    """A turn the app's recovery loop took over is left to the next process when the app
    closes, as its own turns are: it is not waited on (a deploy's grace is short)."""
    db = tmp_path / "app.db"
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0, run_in_process=False)
    model = ScriptedModel([ModelStep.tool_call_reply(call("fetch", n=3))])
    async with SessionRuntime(agent=Agent(model=model, tools=[fetch]), config=config) as api:
        submission = await api.submit("s1", "fetch 3")  # queued for any process to take
    app = _runtime(db, model, recover=True)
    await app.open()
    try:
        deadline = time.monotonic() + 20
        while not [e async for e in app.events(submission.turn_id) if e.type == "tool.started"]:
            assert time.monotonic() < deadline, "the recovery loop never took the turn"
            await asyncio.sleep(0.05)
    finally:
        began = time.monotonic()
        await app.close()
        took = time.monotonic() - began
    assert took < 10, f"close waited {took:.1f} s for the turn (a worker's drain is 30 s)"
    async with SessionRuntime(agent=Agent(model=model, tools=[fetch]), config=config) as after:
        turn = await after.turn(submission.turn_id)
    assert turn.status == "running"
    assert turn.lease_owner == "(handed over)"  # another process takes it at once


REFUNDS: list[int] = []


@tool
async def refund(amount: int) -> str:
    """Refund (fast; no reconcile hook: a call in doubt would run again)."""
    REFUNDS.append(amount)
    return f"refunded {amount}"


@tool
async def slow_lookup(order: int) -> str:
    """Look an order up (the process dies while it runs)."""
    RAN.append(order)
    await asyncio.sleep(SLOW["seconds"])
    return f"order {order}"


async def test_a_call_that_finished_beside_one_still_running_is_not_run_again(
    tmp_path: Path,
) -> None:
    """Each result of a batch is committed as it comes in: the process dies while the slow
    call runs, and the recovered turn re-runs only that one."""
    RAN.clear()
    db = tmp_path / "batch.db"
    asks = ModelStep.tool_call_reply(call("refund", amount=5), call("slow_lookup", order=7))
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=True)

    def runtime(model: ScriptedModel) -> SessionRuntime:
        return SessionRuntime(agent=Agent(model=model, tools=[refund, slow_lookup]), config=config)

    REFUNDS.clear()
    turn_id = await _dies_mid_call(runtime(ScriptedModel([asks])), "refund and look up")
    SLOW["seconds"] = 0.0
    try:
        events = await _taken_over(runtime(ScriptedModel([ModelStep.text_reply("Done.")])), turn_id)
    finally:
        SLOW["seconds"] = 60.0
    assert REFUNDS == [5]  # ran once
    doubts = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    starts = {
        e.block.tool_call_id: e.block.tool_name for e in events if isinstance(e, ToolStartedEvent)
    }
    assert [starts[d.tool_call_id] for d in doubts] == ["slow_lookup"]
    assert events[-1].type == "done"
