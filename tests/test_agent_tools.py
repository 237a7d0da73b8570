"""An agent offered to another as a tool: a durable turn of its own, asked once per call."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header
from pydantic import BaseModel

from turnkit import Agent, Approve, Principal, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.errors import AgentNotFoundError, ConfigurationError, InvalidInputError
from turnkit.events import (
    ApprovalRequestedEvent,
    DoneEvent,
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
)
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.ids import SessionId, ToolCallId, TurnId
from turnkit.models import ModelRequest
from turnkit.runtime import delegated_session_id
from turnkit.runtime.agents import AgentCatalog
from turnkit.runtime.worker import Worker
from turnkit.tenancy import Organisation, Tenancy
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events
from turnkit.tools import AgentTool, AgentToolError, Tool

CALLS: list[str] = []


@tool
async def order_status(order_id: str, ctx: ToolContext) -> str:
    """Look an order up."""
    CALLS.append(f"{ctx.principal}:{order_id}")
    return f"order {order_id} shipped on Monday"


def _specialist(*steps: ModelStep, **kwargs: object) -> Agent:
    return Agent(
        name="orders",
        instructions="You answer questions about orders.\nBe brief.",
        model=ScriptedModel(list(steps)),
        tools=[order_status],
        **kwargs,  # type: ignore[arg-type]
    )


def _asking(specialist: Agent, *steps: ModelStep) -> Agent:
    return Agent(name="front-desk", model=ScriptedModel(list(steps)), tools=[specialist.as_tool()])


def _runtime(tmp_path: Path, agent: Agent, **config: object) -> SessionRuntime:
    url = f"sqlite:///{tmp_path / 'agents.db'}"
    return SessionRuntime(agent=agent, config=RuntimeConfig(database_url=url, **config))  # type: ignore[arg-type]


async def test_the_asked_agent_answers_in_a_session_of_its_own(tmp_path: Path) -> None:
    CALLS.clear()
    specialist = _specialist(
        ModelStep.tool_call_reply(call("order_status", order_id="42")),
        ModelStep.text_reply("Order 42 shipped on Monday."),
    )
    seen: list[ModelRequest] = []

    def answer_with_result(request: ModelRequest) -> ModelStep:
        seen.append(request)
        return ModelStep.text_reply("Your order shipped on Monday.")

    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="When did order 42 ship?")),
        ModelStep.respond(answer_with_result),
    )
    async with _runtime(tmp_path, front) as runtime:
        asked = runtime.execute_message("s1", "where is 42?", principal="ann")
        events = await collect_events(asked)
        [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
        assert done.result.output == "Order 42 shipped on Monday."
        progress = [e.message for e in events if isinstance(e, JobProgressEvent)]
        assert progress[1] == "orders: order_status"
        assert CALLS == ["ann:42"]  # the specialist's tool ran once, for the same caller
        # The asking model read the specialist's answer as the call's result.
        assert "Order 42 shipped on Monday." in str(seen[0].messages[-1])
        # The specialist's turn is a session of its own, owned by the caller, not listed.
        listed = await runtime.store.list_sessions(principal="ann")
        assert [s.session_id for s in listed] == ["s1"]
        assert [s.session_id for s in await runtime.store.list_sessions()] == ["s1"]
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert started.idempotency_key is not None
        child_id = delegated_session_id(started.idempotency_key, "orders")
        assert progress[0] == f"asked orders (session {child_id})"
        child = await runtime.store.get_session(child_id)
        assert child is not None
        assert (child.parent_session, child.principal) == ("s1", "ann")
        assert child.title == "orders: When did order 42 ship?"
        [child_turn] = await runtime.store.list_turns(child_id)
        assert (child_turn.status, child_turn.agent) == ("succeeded", "orders")
        # Deleting the asking session deletes the one the specialist answered in.
        assert await runtime.store.delete_session(SessionId("s1"))
        assert await runtime.store.get_session(child_id) is None


class Verdict(BaseModel):
    refund: bool
    reason: str


async def test_an_agent_with_an_output_type_answers_its_json_value(tmp_path: Path) -> None:
    judge = Agent(
        name="judge",
        model=ScriptedModel([ModelStep.text_reply('{"refund": true, "reason": "late"}')]),
        output_type=Verdict,
    )
    front = _asking(
        judge,
        ModelStep.tool_call_reply(call("judge", message="Refund order 7? It came late.")),
        ModelStep.text_reply("Refunded."),
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund 7"))
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == {"refund": True, "reason": "late"}


async def test_an_agent_that_fails_is_a_failed_call_the_asking_model_reads(
    tmp_path: Path,
) -> None:
    broken = _specialist(ModelStep.fail(RuntimeError("provider down")))
    front = _asking(
        broken,
        ModelStep.tool_call_reply(call("orders", message="status of 9?")),
        ModelStep.text_reply("The orders desk is unavailable."),
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "9?"))
        record = await runtime.turn(events[0].turn_id)
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    error = failed.result.error or ""
    assert "the agent 'orders' did not answer" in error
    assert "ended failed" in error
    assert record.status == "succeeded"  # the asking turn goes on and answers


async def test_bad_arguments_are_sent_back_to_the_model(tmp_path: Path) -> None:
    specialist = _specialist(ModelStep.text_reply("unused"))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="  ")),
        ModelStep.text_reply("Sorry."),
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "?"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert "`message` must be non-empty text" in (failed.result.error or "")


def test_the_delegation_itself_may_need_a_persons_approval() -> None:
    model = ScriptedModel([ModelStep.text_reply("x")])
    made = Agent(name="refunds", model=model).as_tool(approval="always", name="ask_refunds")
    assert (made.name, made.approval) == ("ask_refunds", "always")
    assert made.spec().parameters["required"] == ["message"]
    with pytest.raises(ConfigurationError, match="approval"):
        Agent(name="refunds", model=model).as_tool(approval="sometimes")  # type: ignore[arg-type]


def test_the_asking_agent_hosts_the_agent_it_asks_and_versions_with_it() -> None:
    first = _specialist(ModelStep.text_reply("x"))
    second = dataclasses.replace(first, instructions="Answer about orders, kindly.")
    front_1 = _asking(first, ModelStep.text_reply("x"))
    front_2 = _asking(second, ModelStep.text_reply("x"))
    assert front_1.version != front_2.version  # the agent it asks is part of its tool
    catalog = AgentCatalog([front_1])
    assert set(catalog.names) == {"front-desk", "orders"}  # a worker can drive both


async def test_a_tool_called_outside_a_turn_says_so() -> None:
    made = _specialist(ModelStep.text_reply("x")).as_tool()
    ctx = ToolContext(
        session_id=SessionId("s"),
        turn_id=TurnId("t"),
        tool_call_id=ToolCallId("c"),
        idempotency_key="k",
    )
    with pytest.raises(AgentToolError, match="only inside a turn of a SessionRuntime"):
        await made.invoke({"message": "hi"}, ctx)
    assert isinstance(made, AgentTool)


async def test_a_running_turn_bound_does_not_make_the_asking_turn_wait_for_itself(
    tmp_path: Path,
) -> None:
    specialist = _specialist(ModelStep.text_reply("Shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of 3?")),
        ModelStep.text_reply("It shipped."),
    )
    async with _runtime(tmp_path, front, max_running_turns=1) as runtime:
        events = await collect_events(runtime.execute_message("s1", "3?"), timeout_s=20)
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "Shipped."


SLOW: dict[str, object] = {}


@tool
async def slow_lookup(order_id: str, ctx: ToolContext) -> str:
    """Look an order up in a slow system that reports its progress."""
    SLOW["calls"] = int(SLOW.get("calls", 0)) + 1  # type: ignore[call-overload]
    if SLOW.get("block"):
        await asyncio.Event().wait()  # the first process dies in here
    for _ in range(int(SLOW.get("reports", 0))):  # type: ignore[call-overload]
        await ctx.report_progress(None, "still looking")
        await asyncio.sleep(0.2)
    return f"order {order_id} is packed"


def _crashing(
    url: str,
    schema: str | None,
    specialist: list[ModelStep],
    front: list[ModelStep],
    *,
    tools: tuple[Tool, ...] = (),
    **config: object,
) -> SessionRuntime:
    """The specialist has `slow_lookup` and `tools` (the same in every process)."""
    slow = Agent(name="orders", model=ScriptedModel(specialist), tools=[slow_lookup, *tools])
    asking = Agent(name="front-desk", model=ScriptedModel(front), tools=[slow.as_tool()])
    settings = RuntimeConfig(
        database_url=url,
        database_schema=schema,
        lease_ttl_s=1.0,
        recover_in_process=True,
        **config,  # type: ignore[arg-type]
    )
    return SessionRuntime(agent=asking, config=settings)


async def _leave_while_the_specialist_works(
    url: str, schema: str | None, tools: tuple[Tool, ...] = ()
) -> tuple[TurnId, SessionId]:
    SLOW.clear()
    SLOW["block"] = True
    first = _crashing(
        url,
        schema,
        [ModelStep.tool_call_reply(call("slow_lookup", order_id="8"))],
        [ModelStep.tool_call_reply(call("orders", message="Is order 8 packed?"))],
        tools=tools,
    )
    await first.open()
    submission = await first.start("s1", "is 8 packed?")
    started = await _first_tool_of(first, submission.turn_id)
    assert started.idempotency_key is not None
    await _until_the_specialists_tool_runs()
    await first.close()  # the process goes away while the specialist works
    return submission.turn_id, delegated_session_id(started.idempotency_key, "orders")


async def _until_the_specialists_tool_runs() -> None:
    for _ in range(1000):  # bounded: 20 s (a loaded CI machine took longer than 5 s)
        if SLOW.get("calls") == 1:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the specialist's tool never ran")


async def _finished(runtime: SessionRuntime, turn_id: TurnId, child: SessionId) -> None:
    deadline = time.monotonic() + 30
    while (await runtime.turn(turn_id)).status == "running":
        assert time.monotonic() < deadline, "the asking turn was never finished"
        await asyncio.sleep(0.05)
    record = await runtime.turn(turn_id)
    assert (record.status, record.error_code) == ("succeeded", None)
    events = [e async for e in runtime.events(turn_id)]
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert doubt.resolution == "reconciled"
    # The job the first attempt dispatched is completed by the one that joined it.
    assert len([e for e in events if isinstance(e, JobDispatchedEvent)]) == 1
    assert len([e for e in events if isinstance(e, JobCompletedEvent)]) == 1
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "Order 8 is packed."
    [child_turn] = await runtime.store.list_turns(child)  # asked once
    assert (child_turn.status, child_turn.attempts) == ("succeeded", 2)  # taken over


async def _first_tool_of(runtime: SessionRuntime, turn_id: str) -> ToolStartedEvent:
    for _ in range(250):  # bounded: until the asking turn's call to the specialist began
        for event in [e async for e in runtime.events(turn_id)]:
            if isinstance(event, ToolStartedEvent):
                return event
        await asyncio.sleep(0.02)
    raise AssertionError("the asking turn never called the specialist")


async def test_stopping_the_asking_turn_stops_the_asked_one(tmp_path: Path) -> None:
    SLOW.clear()
    SLOW["block"] = True
    runtime = _crashing(
        f"sqlite:///{tmp_path / 'app.db'}",
        None,
        [ModelStep.tool_call_reply(call("slow_lookup", order_id="4"))],
        [ModelStep.tool_call_reply(call("orders", message="Is order 4 packed?"))],
    )
    async with runtime:
        submission = await runtime.start("s1", "is 4 packed?")
        started = await _first_tool_of(runtime, submission.turn_id)
        assert started.asked_session_id is not None
        await _until_the_specialists_tool_runs()
        assert await runtime.cancel(submission.turn_id) == "cancelled"
        [child_turn] = await runtime.store.list_turns(SessionId(started.asked_session_id))
    assert child_turn.status == "cancelled"


async def test_a_worker_drives_both_turns_on_either_store(db: tuple[str, str | None]) -> None:
    """Production's path: the API process only submits; a worker drives the asking turn,
    and the asked agent's turn beside it, hosted because the asking agent asks it."""
    url, schema = db
    specialist = _specialist(ModelStep.text_reply("Order 11 shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of 11?")),
        ModelStep.text_reply("It shipped."),
    )
    config = RuntimeConfig(database_url=url, database_schema=schema, run_in_process=False)
    async with SessionRuntime(agent=front, config=config) as runtime:
        submission = await runtime.start("s1", "11?", principal="ann")
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
        running = asyncio.create_task(worker.run(stop))
        try:
            deadline = time.monotonic() + 20
            while (await runtime.turn(submission.turn_id)).status == "running":
                assert time.monotonic() < deadline, "the worker never finished the turn"
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await running
        events = [e async for e in runtime.events(submission.turn_id)]
        [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
        assert done.result.output == "Order 11 shipped."
        assert [s.session_id for s in await runtime.store.list_sessions()] == ["s1"]


def test_a_listed_agent_and_an_asked_one_of_the_same_name_are_refused() -> None:
    asked = _specialist(ModelStep.text_reply("x"))
    other = Agent(name="orders", model=ScriptedModel([ModelStep.text_reply("y")]))
    front = _asking(asked, ModelStep.text_reply("x"))
    for listed in ([other, front], [front, other]):
        with pytest.raises(ConfigurationError, match="two agents are named 'orders'"):
            AgentCatalog(listed)
    catalog = AgentCatalog([front], tools=[asked.as_tool(name="ask_orders")])
    assert catalog.names == ("front-desk", "orders")  # the default stays the first listed


async def test_a_person_may_approve_the_delegation_itself(tmp_path: Path) -> None:
    specialist = _specialist(ModelStep.text_reply("Order 2 shipped."))
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("orders", message="status of 2?")),
                ModelStep.text_reply("It shipped."),
            ]
        ),
        tools=[specialist.as_tool(approval="always")],
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "2?"))
        [asked] = [e for e in events if isinstance(e, ApprovalRequestedEvent)]
        assert asked.arguments == {"message": "status of 2?"}  # the card shows the message
        assert [e for e in events if isinstance(e, JobProgressEvent)] == []  # not asked yet
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        after = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
    [done] = [e for e in after if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "Order 2 shipped."


async def test_deleting_the_asking_session_deletes_the_asked_turns_checkpoints(
    tmp_path: Path,
) -> None:
    specialist = _specialist(ModelStep.text_reply("Order 6 shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of 6?")),
        ModelStep.text_reply("It shipped."),
    )
    async with _runtime(tmp_path, front, keep_ended_checkpoints=True) as runtime:
        events = await collect_events(runtime.execute_message("s1", "6?"))
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert started.idempotency_key is not None
        child_id = delegated_session_id(started.idempotency_key, "orders")
        [child_turn] = await runtime.store.list_turns(child_id)
        threads = await runtime.turn_threads(after="", limit=100)
        assert threads is not None
        assert child_turn.turn_id in threads  # kept: the turn ended, its checkpoints stay
        assert await runtime.store.delegated_sessions(SessionId("s1")) == [child_id]
        assert await runtime.delete_session("s1")
        assert await runtime.turn_threads(after="", limit=100) == []
        assert await runtime.store.get_session(child_id) is None


async def test_an_organisation_pinned_to_the_asking_agent_may_still_delegate(
    tmp_path: Path,
) -> None:
    specialist = _specialist(ModelStep.text_reply("Order 7 shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of 7?")),
        ModelStep.text_reply("It shipped."),
    )
    tenancy = Tenancy([Organisation(name="acme", default_agent="front-desk")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    async with SessionRuntime(agent=front, config=config, tenancy=tenancy) as runtime:
        ann = Principal(id="ann", organisation="acme")
        events = await collect_events(runtime.execute_message("s1", "7?", principal=ann))
    assert [e for e in events if isinstance(e, ToolFailedEvent)] == []
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "Order 7 shipped."


async def test_a_message_cannot_name_an_agent_only_a_tool_asks(tmp_path: Path) -> None:
    """Else `as_tool(approval="always")` would be skipped by asking the specialist directly."""
    refunds = Agent(name="refunds", model=ScriptedModel([ModelStep.text_reply("Refunded.")]))
    front = Agent(
        name="front-desk",
        model=ScriptedModel([ModelStep.text_reply("hi")]),
        tools=[refunds.as_tool(approval="always")],  # a person approves each refund
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    async with SessionRuntime(agent=front, config=config) as runtime:
        with pytest.raises(AgentNotFoundError, match="no agent named 'refunds'"):
            await collect_events(
                runtime.execute_message("s2", "refund 7", principal="mallory", agent="refunds")
            )
        assert await runtime.store.get_session(SessionId("s2")) is None  # nothing written
    listed = SessionRuntime(agents=[front, refunds], config=config)  # hosted in its own right
    assert not listed.agents.asked_only("refunds")


async def test_the_asked_session_has_the_asking_sessions_owner(tmp_path: Path) -> None:
    """Also for a message of the app's own (no principal), such as a scheduled job's."""
    specialist = _specialist(ModelStep.text_reply("Shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of ann's order 3?")),
        ModelStep.text_reply("It shipped."),
    )
    async with _runtime(tmp_path, front) as runtime:
        await runtime.store.create_session(SessionId("s1"), principal="ann", organisation="acme")
        events = await collect_events(runtime.execute_message("s1", "check order 3"))
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert started.idempotency_key is not None
        child_id = delegated_session_id(started.idempotency_key, "orders")
        child = await runtime.store.get_session(child_id)
    assert child is not None
    assert (child.principal, child.organisation) == ("ann", "acme")
    assert not child.visible_to(None, None)  # not readable by anonymous callers


async def test_one_recovery_slot_finishes_the_asking_turn_and_the_asked_one(
    db: tuple[str, str | None],
) -> None:
    """The recovered asking turn holds the only slot while it joins the asked turn: that
    turn runs in the asking turn's slot, not waiting for one (which would never come)."""
    url, schema = db
    turn_id, child = await _leave_while_the_specialist_works(url, schema)
    SLOW["block"] = False
    second = _crashing(
        url,
        schema,
        [ModelStep.text_reply("Order 8 is packed.")],
        [ModelStep.text_reply("Packed.")],
        recovery_concurrency=1,
        idle_window_s=20.0,
    )
    async with second:
        await _finished(second, turn_id, child)


async def test_joining_after_a_crash_keeps_the_asking_turn_alive(tmp_path: Path) -> None:
    """While the recovered asking turn waits for the asked agent, its reports restart the
    idle window, as they do before a crash: a specialist working longer than the window
    does not time the asking turn out."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    turn_id, child = await _leave_while_the_specialist_works(url, None)
    SLOW["block"], SLOW["reports"] = False, 15  # about 3 s, well past the window
    second = _crashing(
        url,
        None,
        [ModelStep.text_reply("Order 8 is packed.")],
        [ModelStep.text_reply("Packed.")],
        idle_window_s=1.0,
        heartbeat_interval_s=0.05,
    )
    async with second:
        await _finished(second, turn_id, child)


async def test_a_short_idle_window_holds_while_the_asked_agent_reports_progress(
    tmp_path: Path,
) -> None:
    """The asked agent's tool reports for about 3 s, past the 1 s idle window: its reports,
    forwarded to the asking call, keep the asking turn going; `tool.started` names the
    session the specialist answers in."""
    SLOW.clear()
    SLOW["reports"] = 15
    runtime = _crashing(
        f"sqlite:///{tmp_path / 'app.db'}",
        None,
        [
            ModelStep.tool_call_reply(call("slow_lookup", order_id="9")),
            ModelStep.text_reply("Order 9 is packed."),
        ],
        [
            ModelStep.tool_call_reply(call("orders", message="Is order 9 packed?")),
            ModelStep.text_reply("Packed."),
        ],
        idle_window_s=1.0,
        heartbeat_interval_s=0.05,
    )
    async with runtime:
        events = await collect_events(runtime.execute_message("s1", "9?"), timeout_s=30)
    [done] = [e for e in events if isinstance(e, DoneEvent)]
    assert done.status == "succeeded"
    [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
    assert started.idempotency_key is not None
    assert started.asked_session_id == delegated_session_id(started.idempotency_key, "orders")
    progress = [e.message for e in events if isinstance(e, JobProgressEvent)]
    assert "orders: still looking" in progress  # what the specialist's own tool said


async def test_an_agent_that_does_not_answer_in_time_is_stopped(tmp_path: Path) -> None:
    SLOW.clear()
    SLOW["block"] = True  # the specialist's tool hangs
    slow = Agent(
        name="orders",
        model=ScriptedModel([ModelStep.tool_call_reply(call("slow_lookup", order_id="1"))]),
        tools=[slow_lookup],
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("orders", message="Is order 1 packed?")),
                ModelStep.text_reply("The warehouse is slow today."),
            ]
        ),
        tools=[slow.as_tool(timeout_s=0.5)],
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "1?"), timeout_s=20)
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert started.asked_session_id is not None
        [child_turn] = await runtime.store.list_turns(SessionId(started.asked_session_id))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert "did not answer within 0.5 s: its turn was stopped" in (failed.result.error or "")
    assert child_turn.status == "cancelled"
    assert [e for e in events if isinstance(e, DoneEvent)][0].status == "succeeded"
    with pytest.raises(ConfigurationError, match="timeout_s of the tool 'orders'"):
        slow.as_tool(timeout_s=0)


# Review (agents-as-tools, second pass)


def _orders_desk(text: str = "Order 7 shipped.", instructions: str = "Orders.") -> Agent:
    return Agent(
        name="orders", instructions=instructions, model=ScriptedModel([ModelStep.text_reply(text)])
    )


def _asking_orders(specialist: Agent) -> Agent:
    return Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("orders", message="status of 7?")),
                ModelStep.text_reply("It shipped."),
            ]
        ),
        tools=[specialist.as_tool()],
    )


async def test_pinned_org_may_delegate_to_an_agent_also_listed(tmp_path: Path) -> None:
    """Docs: 'An organisation pinned to a default agent still lets that agent ask others.'"""
    specialist = _orders_desk()
    front = _asking_orders(specialist)
    tenancy = Tenancy([Organisation(name="acme", default_agent="front-desk")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    async with SessionRuntime(
        agents=[front, specialist], config=config, tenancy=tenancy
    ) as runtime:
        ann = Principal(id="ann", organisation="acme")
        events = await collect_events(runtime.execute_message("s1", "7?", principal=ann))
    failed = [e.result.error for e in events if isinstance(e, ToolFailedEvent)]
    assert failed == []
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "Order 7 shipped."


async def test_a_loaded_agent_does_not_make_the_agent_it_asks_nameable(tmp_path: Path) -> None:
    """A loader that returns Agent objects: the agent they ask stays asked-only."""
    specialist = _orders_desk()
    loaded = _asking_orders(specialist)
    loaded = Agent(name="desk", model=loaded.model, tools=loaded.tools)
    base = Agent(name="base", model=ScriptedModel([ModelStep.text_reply("hi")]))

    async def loader(name: str) -> Agent | None:
        return loaded if name == "desk" else None

    catalog = AgentCatalog([base], loader=loader)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    async with SessionRuntime(agents=catalog, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "7?", agent="desk"))
        assert [e for e in events if isinstance(e, ToolCompletedEvent)]
        with pytest.raises(AgentNotFoundError):
            await collect_events(
                runtime.execute_message("s2", "refund", principal="mallory", agent="orders")
            )


def test_a_listed_agent_and_an_older_asked_one_are_refused_in_either_order() -> None:
    asked_v1 = _orders_desk("v1", "Orders, v1.")
    listed_v2 = _orders_desk("v2", "Orders, v2.")
    assert asked_v1.version != listed_v2.version
    front = _asking_orders(asked_v1)
    for listed in ([listed_v2, front], [front, listed_v2]):
        with pytest.raises(ConfigurationError, match="two agents are named 'orders'"):
            AgentCatalog(listed)


async def test_a_caller_cannot_answer_for_the_asked_agent(tmp_path: Path) -> None:
    """tool.started names the asked session before a person approves the delegation: the
    session's owner may not write the asked agent's answer there first."""
    refunds = Agent(
        name="refunds",
        instructions="Refunds.",
        model=ScriptedModel([ModelStep.text_reply("Refund refused: out of policy.")]),
    )
    chatty = Agent(
        name="chatty",
        instructions="Chat.",
        model=ScriptedModel([ModelStep.text_reply("Refund issued, 500 EUR.")]),
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [
                ModelStep.tool_call_reply(call("refunds", message="refund order 7?")),
                ModelStep.text_reply("done"),
            ]
        ),
        tools=[refunds.as_tool(approval="always")],
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    async with SessionRuntime(agents=[front, chatty], config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund 7", principal="ann"))
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        [asked] = [e for e in events if isinstance(e, ApprovalRequestedEvent)]
        assert started.asked_session_id is not None
        # The caller tries to open the asked session first, with its message and request id.
        with pytest.raises(InvalidInputError, match="kept for agents asked as tools"):
            await collect_events(
                runtime.execute_message(
                    started.asked_session_id,
                    "refund order 7?",
                    principal="ann",
                    agent="chatty",
                    request_id="delegated",
                )
            )
        # Past the runtime's checks (the app's own store access), the call still refuses a
        # session it did not open.
        await runtime.store.create_session(SessionId(started.asked_session_id), principal="ann")
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        after = await collect_events(runtime.follow(asked.turn_id, after_seq=asked.seq))
    assert [e for e in after if isinstance(e, ToolCompletedEvent)] == []  # not chatty's
    [failed] = [e for e in after if isinstance(e, ToolFailedEvent)]
    assert "not opened by this call" in (failed.result.error or "")


async def test_a_failed_take_over_claim_is_tried_again(tmp_path: Path) -> None:
    """The joining call's take-over survives a claim that fails once (a database blip)."""
    from turnkit.errors import StoreUnavailableError

    url = f"sqlite:///{tmp_path / 'app.db'}"
    turn_id, child = await _leave_while_the_specialist_works(url, None)
    SLOW["block"] = False
    second = _crashing(
        url,
        None,
        [ModelStep.text_reply("Order 8 is packed.")],
        [ModelStep.text_reply("Packed.")],
        recovery_concurrency=1,
        idle_window_s=20.0,
    )
    failed: list[object] = []
    async with second:
        real = second.store.claim

        async def flaky(*args: object, **kwargs: object) -> object:
            if kwargs.get("turn_id") is not None and not failed:
                failed.append(kwargs["turn_id"])
                raise StoreUnavailableError("blip")
            return await real(*args, **kwargs)  # type: ignore[arg-type]

        second.store.claim = flaky  # type: ignore[method-assign,assignment]
        await _finished(second, turn_id, child)
    assert failed


async def _user(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


async def test_over_http_the_owner_reads_an_asked_session_but_sends_it_nothing(
    tmp_path: Path,
) -> None:
    """An asked session's id is public (`asked_session_id`): a message there, or a session
    opened first under it, would stand in for the specialist's answer. Both are refused."""
    specialist = _specialist(ModelStep.text_reply("Order 5 shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of 5?")),
        ModelStep.text_reply("It shipped."),
    )
    async with _runtime(tmp_path, front) as runtime:
        app = FastAPI()
        app.include_router(create_turnkit_router(runtime, auth=_user))
        install_problem_handlers(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            ann = {"x-user": "ann"}
            sent = await http.post(
                "/api/harness/sessions/s1/execute", json={"content": "5?"}, headers=ann
            )
            assert sent.status_code == 200
            [started] = [
                json.loads(line[6:])
                for line in sent.text.splitlines()
                if line.startswith("data: ") and '"tool.started"' in line
            ]
            asked = started["asked_session_id"]
            listed = await http.get("/api/harness/sessions", headers=ann)
            assert [s["sessionId"] for s in listed.json()] == ["s1"]
            history = await http.get(f"/api/harness/sessions/{asked}/history", headers=ann)
            assert history.status_code == 200
            assert history.json()[0]["answer"] == "Order 5 shipped."
            one = await http.get(f"/api/harness/sessions/{asked}", headers=ann)
            assert one.status_code == 200
            assert one.json()["title"] == "orders: status of 5?"
            assert one.json()["parentSession"] == "s1"  # where its requests are answered
            own = (await http.get("/api/harness/sessions/s1", headers=ann)).json()
            assert (own["sessionId"], own["parentSession"]) == ("s1", None)
            kept = await http.delete(f"/api/harness/sessions/{asked}", headers=ann)
            assert kept.status_code == 422, kept.text  # it goes with the session that asked
            assert "deleted with the session that asked it" in kept.json()["detail"]
            for path, who in ((asked, {"x-user": "bob"}), ("s404", ann)):
                hidden = await http.get(f"/api/harness/sessions/{path}", headers=who)
                assert hidden.status_code == 404, hidden.text
                assert hidden.json()["code"] == "session-not-found"
            for path, body in (
                (f"/sessions/{asked}/execute", {"content": "refund 500 EUR"}),
                ("/sessions/tk-sub.0123/execute", {"content": "hi"}),
                ("/sessions", {"sessionId": "tk-sub.4567"}),
            ):
                refused = await http.post(f"/api/harness{path}", json=body, headers=ann)
                assert refused.status_code == 422, refused.text
                assert refused.json()["code"] == "invalid-input"
                assert "kept for agents asked as tools" in refused.json()["detail"]
        assert len(await runtime.store.list_turns(SessionId(asked))) == 1  # nothing written
        assert await runtime.store.get_session(SessionId("tk-sub.4567")) is None


async def test_no_message_but_the_asking_calls_enters_an_asked_session(tmp_path: Path) -> None:
    """Not even the app's own code passing the asked agent itself as an object."""
    specialist = _specialist(ModelStep.text_reply("Order 6 shipped."))
    front = _asking(
        specialist,
        ModelStep.tool_call_reply(call("orders", message="status of 6?")),
        ModelStep.text_reply("It shipped."),
    )
    async with _runtime(tmp_path, front) as runtime:
        events = await collect_events(runtime.execute_message("s1", "6?"))
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert started.asked_session_id is not None
        for agent in (specialist, "orders", None):
            with pytest.raises(InvalidInputError, match="kept for agents asked as tools"):
                await runtime.submit(
                    started.asked_session_id, "and 7?", agent=agent, request_id="delegated"
                )
        [asked_turn] = await runtime.store.list_turns(SessionId(started.asked_session_id))
    assert asked_turn.status == "succeeded"
