"""Stop and abort at the edges of a turn's life: while it is claimed, at a pause, as it ends.

Whatever the moment, a Stop ends the turn `cancelled` (or leaves the ending its driver
wrote), no lease is left that nobody renews, and no slot stays taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import GatedModel, PostTurnGate, calls_made, drain, until, waiting_for_slot
from turnkit import (
    Agent,
    Approve,
    RuntimeConfig,
    SessionRuntime,
    StoreUnavailableError,
    ToolContext,
    TurnNotFoundError,
    tool,
)
from turnkit.budgets import BudgetLimit
from turnkit.events import ApprovalRequestedEvent, DoneEvent
from turnkit.ids import SessionId, TurnId
from turnkit.runtime._detached import DetachedTurns
from turnkit.testing import ModelStep, ScriptedModel, call


def _config(tmp_path: Path, **kwargs: Any) -> RuntimeConfig:
    return RuntimeConfig(database_url=f"sqlite:///{tmp_path / 't.db'}", **kwargs)


@tool(approval="always")
async def send_email(to: str, ctx: ToolContext) -> str:
    """Send an email (needs a person's approval)."""
    return f"sent to {to}"


async def test_a_stop_whose_caller_is_cancelled_still_ends_the_turn(tmp_path: Path) -> None:
    """An HTTP handler cancelled mid-Stop, or an app bounding Stop with a timeout."""
    model = GatedModel()
    model.gate.set()
    async with SessionRuntime(
        agent=Agent(model=model), config=_config(tmp_path, max_running_turns=1)
    ) as runtime:
        submission = await runtime.start("s1", "hi")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0):
                await runtime.cancel(submission.turn_id)

        async def cancelled() -> bool:
            return (await runtime.turn(submission.turn_id)).status == "cancelled"

        await until(cancelled, "the Stop runs to its end")
        assert runtime.host.slots.running == 0


async def test_a_stop_cuts_a_driver_here_while_the_database_does_not_answer_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looking up the turns a stopped turn asked fails (a database blip): the Stop still
    cuts the model call this process drives, instead of answering 503 while it runs on."""
    model = GatedModel()  # never answers: only the Stop ends the call
    async with SessionRuntime(agent=Agent(model=model), config=_config(tmp_path)) as runtime:
        submission = await runtime.start("s1", "hi")
        await until(lambda: model.active == 1, "the model call is under way")

        async def unavailable(turn_id: TurnId) -> list[TurnId]:
            raise StoreUnavailableError("the database did not answer")

        monkeypatch.setattr(runtime.store, "asked_turns", unavailable)
        async with asyncio.timeout(10):
            status = await runtime.cancel(submission.turn_id)
        assert status == "cancelled"
        assert model.active == 0
        assert (await runtime.turn(submission.turn_id)).status == "cancelled"


async def test_a_stop_of_a_turn_the_recovery_loop_drives_stops_it_at_once(
    tmp_path: Path,
) -> None:
    model = GatedModel()
    config = _config(tmp_path, recover_in_process=True)
    elsewhere = _config(tmp_path, run_in_process=False)  # an API process with no driver
    async with (
        SessionRuntime(agent=Agent(model=model), config=config) as runtime,
        SessionRuntime(agent=Agent(model=model), config=elsewhere) as api,
    ):
        busy = await runtime.start("s-busy", "hi")
        await until(lambda: calls_made(model, 1), "the first turn reaches the model")
        waiting = await api.start("s-wait", "hello")
        assert waiting.lease is None
        # Nobody drives it where it was sent: the recovery loop claims and drives it.
        await until(lambda: calls_made(model, 2), "the recovery loop drives the waiting turn")
        assert await runtime.cancel(waiting.turn_id) == "cancelled"
        assert model.active == 1  # its model call was aborted, not left to run
        events = [e async for e in runtime.events(waiting.turn_id)]
        assert [e.type for e in events][-2:] == ["run.finished", "done"]
        model.gate.set()
        async with asyncio.timeout(20):
            ended = (await drain(runtime.reader().events(busy.turn_id)))[-1]
    assert isinstance(ended, DoneEvent)
    assert ended.status == "succeeded"


async def _follow_then_leave(
    runtime: SessionRuntime,
    model: GatedModel,
    busy: asyncio.Task[Any],
    moment: asyncio.Event,
    **options: Any,
) -> str:
    """Follow a turn that waits for the only slot (`busy` holds it); leave at `moment`."""
    started: list[str] = []

    async def follow() -> None:
        async for event in runtime.execute_message("s-wait", "hello", **options):
            started.append(event.turn_id)

    waiter = asyncio.create_task(follow())
    await until(lambda: waiting_for_slot(runtime, 1), "the second turn waits for a slot")
    model.gate.set()
    await busy
    await asyncio.wait_for(moment.wait(), 10)
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    return started[0]


async def test_a_caller_cancelled_as_its_waiting_turn_is_claimed_ends_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    model = GatedModel()
    async with SessionRuntime(
        agent=Agent(model=model), config=_config(tmp_path, max_running_turns=1)
    ) as runtime:
        busy = asyncio.create_task(drain(runtime.execute_message("s-busy", "hi")))
        await until(lambda: calls_made(model, 1), "the first turn holds the only slot")
        claimed = asyncio.Event()
        real_claim = runtime.store.claim

        async def claim(*args: Any, **kwargs: Any) -> Any:
            lease = await real_claim(*args, **kwargs)
            if lease is not None and kwargs.get("turn_id") is not None:
                claimed.set()
                await asyncio.sleep(0.2)  # the claim committed; its caller is cancelled here
            return lease

        monkeypatch.setattr(runtime.store, "claim", claim)
        turn_id = await _follow_then_leave(runtime, model, busy, claimed)
        record = await runtime.turn(turn_id)
    assert (record.status, record.lease_owner) == ("cancelled", None)


async def test_a_caller_cancelled_while_its_claimed_turn_gets_a_driver_ends_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    model = GatedModel()
    async with SessionRuntime(
        agent=Agent(model=model), config=_config(tmp_path, max_running_turns=1)
    ) as runtime:
        busy = asyncio.create_task(drain(runtime.execute_message("s-busy", "hi")))
        await until(lambda: calls_made(model, 1), "the first turn holds the only slot")
        store = runtime.store
        real_claim, real_get = store.claim, store.get_turn
        claimed, reading = asyncio.Event(), asyncio.Event()

        async def claim(*args: Any, **kwargs: Any) -> Any:
            lease = await real_claim(*args, **kwargs)
            if lease is not None and kwargs.get("turn_id") is not None:
                claimed.set()
            return lease

        async def get_turn(turn_id: Any) -> Any:
            if claimed.is_set() and not reading.is_set():
                reading.set()  # the driver being built reads the claimed turn's record
                await asyncio.sleep(0.2)
            return await real_get(turn_id)

        monkeypatch.setattr(store, "claim", claim)
        monkeypatch.setattr(store, "get_turn", get_turn)
        # Deps are kept while the turn may resume here, and not after it ended.
        turn_id = await _follow_then_leave(runtime, model, busy, reading, deps={"db": object()})
        record = await real_get(turn_id)
        assert record is not None
        assert (record.status, record.lease_owner) == ("cancelled", None)
        assert runtime.host.slots.running == 0
        assert turn_id not in runtime.host._deps


async def test_closing_the_stream_at_a_pause_keeps_the_turn_paused(tmp_path: Path) -> None:
    """With budgets enforced the driver still awaits the Store after its pause is written."""
    model = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    agent = Agent(model=model, tools=[send_email])
    config = _config(tmp_path, budgets="enforce", budget_reserve_tokens=50)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.set_budget_limit(BudgetLimit(scope="principal", key="ann", tokens=100_000))
        turn_id = None
        stream = runtime.execute_message("s1", "email Ada", principal="ann")
        async for event in stream:
            turn_id = event.turn_id
            if isinstance(event, ApprovalRequestedEvent):
                break  # a UI shows the approval and stops listening
        await stream.aclose()
        assert turn_id is not None
        assert (await runtime.turn(turn_id)).status == "awaiting_approval"


async def test_a_stop_as_the_turn_ends_still_runs_its_requeued_guide(
    tmp_path: Path, monkeypatch: Any
) -> None:
    gate = PostTurnGate()
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    async with SessionRuntime(
        agent=Agent(model=model, plugins=[gate]), config=_config(tmp_path)
    ) as runtime:
        picking = asyncio.Event()
        real_claim = runtime.store.claim

        async def claim(*args: Any, **kwargs: Any) -> Any:
            lease = await real_claim(*args, **kwargs)  # committed, whatever happens next
            if kwargs.get("session_id") is not None:
                picking.set()
                await asyncio.sleep(0.2)
            return lease

        monkeypatch.setattr(runtime.store, "claim", claim)
        first = await runtime.start("s1", "first")
        await asyncio.wait_for(gate.entered.wait(), 10)
        assert (await runtime.submit("s1", "one more thing", delivery="guide")).guided
        gate.release.set()
        await asyncio.wait_for(picking.wait(), 10)  # the turn ended; its guide is claimed
        assert await runtime.cancel(first.turn_id) == "succeeded"

        async def both_ended() -> bool:
            turns = await runtime.store.list_turns(SessionId("s1"))
            return [t.status for t in turns] == ["succeeded", "succeeded"]

        await until(both_ended, "the re-queued guide runs as its own turn")


async def test_a_turn_whose_session_is_deleted_while_it_runs_ends_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's next write finds no turn: one line, not an unretrieved task exception."""
    started = asyncio.Event()

    @tool
    async def slow() -> str:
        """Takes a while."""
        started.set()
        await asyncio.sleep(0.3)
        return "done"

    model = ScriptedModel([ModelStep.tool_call_reply(call("slow")), ModelStep.text_reply("x")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'gone.db'}")
    caplog.set_level(logging.INFO, logger="turnkit.runtime")
    async with SessionRuntime(agent=Agent(model=model, tools=[slow]), config=config) as runtime:
        submission = await runtime.start("s1", "go")
        await asyncio.wait_for(started.wait(), 10)
        await runtime.store.delete_session(SessionId("s1"))
        async with asyncio.timeout(10):
            while not any("deleted while it ran" in r.message for r in caplog.records):
                await asyncio.sleep(0.05)
        with pytest.raises(TurnNotFoundError):
            await runtime.turn(submission.turn_id)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


RAN: list[str] = []
WORKING = asyncio.Event()
FINISH = asyncio.Event()


@tool
async def slow_lookup(ctx: ToolContext) -> str:
    """Look something up (slowly)."""
    WORKING.set()
    await asyncio.wait_for(FINISH.wait(), timeout=10)
    return "found"


@tool(approval="always")
async def wire_money(to: str, ctx: ToolContext) -> str:
    """Wire money (needs a person's approval)."""
    RAN.append(to)
    await asyncio.sleep(0.2)
    return f"wired to {to}"


def _looks_up_then_wires() -> ScriptedModel:
    return ScriptedModel(
        [
            ModelStep.tool_call_reply(call("slow_lookup")),
            ModelStep.tool_call_reply(call("wire_money", to="bob")),
            ModelStep.text_reply("Done."),
        ]
    )


async def test_a_stop_from_another_process_is_not_lost_at_the_next_pause(
    tmp_path: Path,
) -> None:
    """Stop pressed in another process while a tool runs: the turn's driver hears of it at
    its next renewal; a pause that comes first ends the turn `cancelled` instead, so the
    Stop does not wait for someone to approve, then cut the approved work."""
    RAN.clear()
    WORKING.clear()
    FINISH.clear()
    config = _config(tmp_path, lease_ttl_s=60)  # no renewal happens during the test
    agent = Agent(model=_looks_up_then_wires(), tools=[slow_lookup, wire_money])
    async with (
        SessionRuntime(agent=agent, config=config) as driving,
        SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config) as elsewhere,
    ):
        submission = await driving.start("s1", "pay bob")
        await asyncio.wait_for(WORKING.wait(), timeout=10)
        assert await elsewhere.cancel(submission.turn_id) == "running"  # its driver stops
        FINISH.set()

        async def ended() -> bool:
            return (await driving.turn(submission.turn_id)).status == "cancelled"

        await until(ended, "the turn ends cancelled instead of pausing")
        events = [e async for e in driving.events(submission.turn_id)]
    assert events[-1].type == "done"
    assert RAN == []


async def test_a_stop_racing_an_approval_in_one_process_stops_the_approved_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approval's driver takes the turn between Stop's look for a driver here and its
    write: Stop still ends the turn `cancelled` at once, not `running` with the tool going."""
    RAN.clear()
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("wire_money", to="bob")), ModelStep.text_reply("Done.")]
    )
    async with SessionRuntime(
        agent=Agent(model=model, tools=[wire_money]), config=_config(tmp_path)
    ) as runtime:
        events = await drain(runtime.execute_message("s1", "pay bob"))
        [asked] = [e for e in events if isinstance(e, ApprovalRequestedEvent)]
        looked = DetachedTurns.stop
        stops = 0

        async def approved_meanwhile(self: DetachedTurns, turn_id: TurnId) -> bool:
            nonlocal stops
            stops += 1
            found = await looked(self, turn_id)  # the first time: nothing drives it here yet
            if stops == 1:
                await runtime.resume(asked.turn_id, asked.request_id, Approve())

                async def claimed() -> bool:
                    return (await runtime.turn(asked.turn_id)).lease_owner is not None

                await until(claimed, "the approval's driver takes the turn")
            return found

        monkeypatch.setattr(DetachedTurns, "stop", approved_meanwhile)
        assert await runtime.cancel(asked.turn_id) == "cancelled"
        record = await runtime.turn(asked.turn_id)
        events = [e async for e in runtime.events(asked.turn_id)]
    assert record.status == "cancelled"
    assert not [e for e in events if e.type == "tool.completed"]


async def test_a_stop_that_ends_an_orphaned_turn_gives_its_unread_guide_a_turn(
    tmp_path: Path,
) -> None:
    """Its driver is gone (its process closed, the lease lapsed): Stop ends the turn in the
    Store, which must give the guide message it never presented a turn of its own, and
    close the requests nobody will answer."""
    model = GatedModel()
    config = _config(tmp_path, lease_ttl_s=0.5)
    first = SessionRuntime(agent=Agent(model=model), config=config)
    submission = await first.start("s1", "compare A and B")
    await until(lambda: calls_made(model, 1), "the turn reaches the model")
    guided = await first.submit("s1", "also check C", delivery="guide")
    assert guided.guided
    await first.close()  # abandoned: no driver writes its ending

    model.gate.set()  # the same agent answers from now on
    async with SessionRuntime(agent=Agent(model=model), config=config) as other:

        async def lapsed() -> bool:
            record = await other.turn(submission.turn_id)
            return record.lease_expires_at is None or record.lease_expires_at < other.clock.now()

        await until(lapsed, "the lease lapses")
        assert await other.cancel(submission.turn_id) == "cancelled"
        later = await other.start("s1", "and then D")

        async def all_answered() -> bool:
            turns = await other.store.list_turns(SessionId("s1"))
            return len(turns) == 3 and all(t.status != "running" for t in turns)

        await until(all_answered, "the guide's turn runs, then the next message's")
        turns = await other.store.list_turns(SessionId("s1"))
    assert [(t.content, t.status) for t in turns] == [
        ("compare A and B", "cancelled"),
        ("also check C", "succeeded"),
        ("and then D", "succeeded"),
    ]
    assert turns[2].turn_id == later.turn_id


async def test_a_stop_landing_as_the_turn_pauses_ends_it_when_someone_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop from another process in the instant between the driver's last look and its
    pause: the turn pauses with the Stop noted; whoever answers resumes a turn that ends
    `cancelled` before it runs anything, never one whose approved tool is cut mid-run."""
    RAN.clear()
    WORKING.clear()
    FINISH.set()
    config = _config(tmp_path, lease_ttl_s=60)
    agent = Agent(model=_looks_up_then_wires(), tools=[slow_lookup, wire_money])
    async with (
        SessionRuntime(agent=agent, config=config) as driving,
        SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config) as elsewhere,
    ):
        renew = driving.store.renew
        stops: list[str] = []

        async def renew_then_stop(lease: Any, **kwargs: Any) -> Any:
            renewed = await renew(lease, **kwargs)
            if not stops:  # the renewal before the pause: Stop lands right after it
                stops.append(await elsewhere.cancel(lease.turn_id))
            return renewed

        monkeypatch.setattr(driving.store, "renew", renew_then_stop)
        events = await drain(driving.execute_message("s1", "pay bob"))
        [asked] = [e for e in events if isinstance(e, ApprovalRequestedEvent)]
        assert stops == ["running"]
        await driving.resume(asked.turn_id, asked.request_id, Approve())

        async def ended() -> bool:
            return (await driving.turn(asked.turn_id)).status == "cancelled"

        await until(ended, "the resumed turn ends cancelled")
    assert RAN == []
