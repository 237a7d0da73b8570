"""What the agents a turn asked as tools spent: in the asking turn's account, counted once.

The asking turn's own totals (`model_calls`, tokens, `cost_usd`) keep counting only its own
model calls; `asked` on its `usage` and `run.finished` events (and its `RunSummary`) adds
up the asked turns' accounts, nested asks included, also when an asked turn failed or was
stopped, and the same after the asking turn was taken over from a process that died.
"""

from __future__ import annotations

import asyncio
import io
import time

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.audit import AskedTurnPayload
from turnkit.cli._inspect import Printer, asked_line
from turnkit.events import (
    AskedUsage,
    RunFinishedEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    UsageEvent,
)
from turnkit.ids import SessionId, TurnId
from turnkit.models import Usage
from turnkit.projection import project
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

# Costs are binary fractions, so sums compare exactly.


def _text(text: str, tokens: int, cost: float) -> ModelStep:
    return ModelStep(text=text, usage=Usage(input_tokens=tokens, output_tokens=1, cost_usd=cost))


def _calls(tokens: int, cost: float, name: str, **arguments: str) -> ModelStep:
    usage = Usage(input_tokens=tokens, output_tokens=1, cost_usd=cost)
    return ModelStep(tool_calls=(call(name, **arguments),), usage=usage)


def _config(db: tuple[str, str | None], **config: object) -> RuntimeConfig:
    url, schema = db
    return RuntimeConfig(database_url=url, database_schema=schema, **config)  # type: ignore[arg-type]


BLOCK: dict[str, object] = {}


@tool
async def lookup(order_id: str) -> str:
    """Look an order up (it hangs while `BLOCK["on"]`: the process dies in here)."""
    BLOCK["calls"] = int(BLOCK.get("calls", 0)) + 1  # type: ignore[call-overload]
    if BLOCK.get("on"):
        await asyncio.Event().wait()
    return f"order {order_id} is packed"


async def _account(
    runtime: SessionRuntime, turn_id: TurnId
) -> tuple[RunFinishedEvent, list[AskedTurnPayload]]:
    events = [e async for e in runtime.events(turn_id)]
    [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
    rows = await runtime.store.read_audit(turn_id)
    return finished, [r.payloads.asked_turn for r in rows if r.payloads.asked_turn is not None]


async def _ended(runtime: SessionRuntime, turn_id: TurnId) -> None:
    deadline = time.monotonic() + 30
    for _ in range(1500):  # bounded: 30 s
        if (await runtime.turn(turn_id)).status == "succeeded":
            return
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    raise AssertionError("the asking turn never ended")


async def test_nested_asks_add_up_in_the_asking_turns_account(db: tuple[str, str | None]) -> None:
    billing = Agent(name="billing", model=ScriptedModel([_text("Paid.", 100, 1.0)]))
    shipping = Agent(
        name="shipping",
        model=ScriptedModel(
            [_calls(20, 0.25, "billing", message="Is A7 paid?"), _text("A7 arrives.", 30, 0.5)]
        ),
        tools=[billing.as_tool()],
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [_calls(1, 0.125, "shipping", message="Where is A7?"), _text("Today.", 2, 0.125)]
        ),
        tools=[shipping.as_tool()],
    )
    async with SessionRuntime(agent=front, config=_config(db)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "A7?"), timeout_s=30)
        turn_id = events[0].turn_id
        finished, spent = await _account(runtime, turn_id)
        record = await runtime.turn(turn_id)
        [answered] = [e for e in events if isinstance(e, ToolCompletedEvent)]
        [started] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert started.asked_session_id is not None
        [shipping_turn] = await runtime.store.list_turns(SessionId(started.asked_session_id))
        inner, inner_spent = await _account(runtime, shipping_turn.turn_id)
    everything = AskedUsage(
        turns=2, model_calls=3, input_tokens=150, output_tokens=3, cost_usd=1.75
    )
    # The asking turn's own totals are what they always were: its own two calls.
    assert (finished.model_calls, finished.input_tokens, finished.cost_usd) == (2, 3, 0.25)
    assert finished.asked == everything
    [usage] = [e for e in events if isinstance(e, UsageEvent)]
    assert (usage.model_calls, usage.cost_usd, usage.asked) == (2, 0.25, everything)
    printed = io.StringIO()
    Printer(printed).show(usage)  # `turnkit events` and `turnkit run` print it so
    assert printed.getvalue().endswith(" · $0.25 · + asked agents: 2 turns, 3 model calls, $1.75\n")
    assert record.summary is not None
    assert record.summary.asked == everything
    assert project(turn_id, events).asked == everything  # the view a front end draws
    assert answered.result.output == "A7 arrives."
    assert [(s.agent, s.status, s.turns, s.model_calls, s.cost_usd) for s in spent] == [
        ("shipping", "succeeded", 2, 3, 1.75)
    ]
    assert spent[0].tool_call_id == answered.tool_call_id
    # The asked turn's account counts the agent it asked in turn.
    assert (inner.model_calls, inner.cost_usd) == (2, 0.75)
    assert inner.asked == AskedUsage(
        turns=1, model_calls=1, input_tokens=100, output_tokens=1, cost_usd=1.0
    )
    assert [(s.agent, s.turns) for s in inner_spent] == [("billing", 1)]


async def test_a_failed_asked_turn_still_counts(db: tuple[str, str | None]) -> None:
    broken = Agent(
        name="orders",
        model=ScriptedModel(
            [_calls(40, 0.5, "lookup", order_id="9"), ModelStep.fail(RuntimeError("down"))]
        ),
        tools=[lookup],
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [_calls(1, 0.25, "orders", message="Order 9?"), _text("Unavailable.", 2, 0.25)]
        ),
        tools=[broken.as_tool()],
    )
    BLOCK.clear()
    async with SessionRuntime(agent=front, config=_config(db)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "9?"), timeout_s=30)
        finished, spent = await _account(runtime, events[0].turn_id)
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert "ended failed" in (failed.result.error or "")
    # Its failed call is a model call that reported no tokens.
    assert finished.asked == AskedUsage(
        turns=1, model_calls=2, input_tokens=40, output_tokens=1, cost_usd=0.5
    )
    assert [(s.status, s.tool_call_id) for s in spent] == [("failed", failed.tool_call_id)]
    assert (finished.model_calls, finished.cost_usd) == (2, 0.5)


async def test_an_asked_turn_stopped_past_its_timeout_counts(db: tuple[str, str | None]) -> None:
    BLOCK.clear()
    BLOCK["on"] = True  # the specialist's tool hangs until its turn is stopped
    slow = Agent(
        name="orders",
        model=ScriptedModel([_calls(40, 0.5, "lookup", order_id="1")]),
        tools=[lookup],
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [_calls(1, 0.25, "orders", message="Order 1?"), _text("Slow today.", 2, 0.25)]
        ),
        tools=[slow.as_tool(timeout_s=0.5)],
    )
    async with SessionRuntime(agent=front, config=_config(db)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "1?"), timeout_s=30)
        finished, spent = await _account(runtime, events[0].turn_id)
    BLOCK.clear()
    assert [e for e in events if isinstance(e, ToolFailedEvent)]
    assert finished.asked == AskedUsage(
        turns=1, model_calls=1, input_tokens=40, output_tokens=1, cost_usd=0.5
    )
    assert [s.status for s in spent] == ["cancelled"]


def _crashing(
    db: tuple[str, str | None], specialist: list[ModelStep], front: list[ModelStep]
) -> SessionRuntime:
    orders = Agent(name="orders", model=ScriptedModel(specialist), tools=[lookup])
    asking = Agent(name="front-desk", model=ScriptedModel(front), tools=[orders.as_tool()])
    return SessionRuntime(
        agent=asking, config=_config(db, lease_ttl_s=1.0, recover_in_process=True)
    )


async def test_a_takeover_after_the_asked_turn_ended_counts_it_once(
    db: tuple[str, str | None],
) -> None:
    """The process dies in the asking turn's next model call, after the asked turn ended
    and its answer was committed: the attempt that takes over reads the account back."""
    BLOCK.clear()
    first = _crashing(
        db,
        [_text("Order 8 is packed.", 30, 0.5)],
        [_calls(1, 0.25, "orders", message="Order 8?"), ModelStep.hang()],
    )
    await first.open()
    submission = await first.start("s1", "8?")
    for _ in range(1500):  # bounded: 30 s, until the answer of the asked agent is committed
        events = [e async for e in first.events(submission.turn_id)]
        if any(isinstance(e, ToolCompletedEvent) for e in events):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the asked agent never answered")
    await first.close()  # the process goes away while the asking turn's model call runs
    second = _crashing(db, [], [_text("Packed.", 2, 0.25)])  # the specialist is not asked
    async with second:
        await _ended(second, submission.turn_id)
        finished, spent = await _account(second, submission.turn_id)
    assert finished.attempt == 2
    assert finished.asked == AskedUsage(
        turns=1, model_calls=1, input_tokens=30, output_tokens=1, cost_usd=0.5
    )
    assert len(spent) == 1


async def test_a_joined_asked_turn_is_counted_once(db: tuple[str, str | None]) -> None:
    """The process dies while the asked agent works; the attempt that takes the asking turn
    over joins the asked turn (not asking again) and counts both its attempts' calls once."""
    BLOCK.clear()
    BLOCK["on"] = True
    first = _crashing(
        db, [_calls(40, 0.5, "lookup", order_id="8")], [_calls(1, 0.25, "orders", message="8?")]
    )
    await first.open()
    submission = await first.start("s1", "8?")
    for _ in range(1500):  # bounded: 30 s, until the specialist's tool runs
        if BLOCK.get("calls") == 1:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the specialist's tool never ran")
    await first.close()
    BLOCK["on"] = False
    second = _crashing(db, [_text("Order 8 is packed.", 30, 0.25)], [_text("Packed.", 2, 0.25)])
    async with second:
        await _ended(second, submission.turn_id)
        finished, spent = await _account(second, submission.turn_id)
        events = [e async for e in second.events(submission.turn_id)]
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert doubt.resolution == "reconciled"
    assert finished.asked == AskedUsage(
        turns=1, model_calls=2, input_tokens=70, output_tokens=2, cost_usd=0.75
    )
    assert len(spent) == 1


@tool(approval="always")
async def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


async def test_a_stop_of_a_paused_asking_turn_keeps_what_it_asked(
    db: tuple[str, str | None],
) -> None:
    """The Store ends a paused turn itself on Stop: its account still counts the agent the
    turn asked before it paused."""
    orders = Agent(name="orders", model=ScriptedModel([_text("Order 3 shipped.", 30, 0.5)]))
    front = Agent(
        name="front-desk",
        model=ScriptedModel(
            [_calls(1, 0.25, "orders", message="Order 3?"), _calls(2, 0.25, "refund", order_id="3")]
        ),
        tools=[orders.as_tool(), refund],
    )
    async with SessionRuntime(agent=front, config=_config(db)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund 3"), timeout_s=30)
        turn_id = events[-1].turn_id
        assert events[-1].type == "approval.requested"
        assert await runtime.cancel(turn_id) == "cancelled"
        finished, spent = await _account(runtime, turn_id)
        record = await runtime.turn(turn_id)
    asked = AskedUsage(turns=1, model_calls=1, input_tokens=30, output_tokens=1, cost_usd=0.5)
    assert (finished.status, finished.model_calls, finished.asked) == ("cancelled", 2, asked)
    assert record.summary is not None
    assert record.summary.asked == asked
    assert len(spent) == 1


async def test_a_stop_of_the_asking_turn_counts_the_agent_it_stopped(
    db: tuple[str, str | None],
) -> None:
    """Stop while the asked agent works: it is stopped here, then counted in the account
    the asking turn's cancelled ending writes."""
    BLOCK.clear()
    BLOCK["on"] = True
    orders = Agent(
        name="orders",
        model=ScriptedModel([_calls(40, 0.5, "lookup", order_id="2")]),
        tools=[lookup],
    )
    front = Agent(
        name="front-desk",
        model=ScriptedModel([_calls(1, 0.25, "orders", message="Order 2?")]),
        tools=[orders.as_tool()],
    )
    async with SessionRuntime(agent=front, config=_config(db)) as runtime:
        submission = await runtime.start("s1", "2?")
        for _ in range(1500):  # bounded: 30 s, until the specialist's tool runs
            if BLOCK.get("calls") == 1:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the specialist's tool never ran")
        assert await runtime.cancel(submission.turn_id) == "cancelled"
        finished, spent = await _account(runtime, submission.turn_id)
    BLOCK.clear()
    assert finished.status == "cancelled"
    assert finished.asked == AskedUsage(
        turns=1, model_calls=1, input_tokens=40, output_tokens=1, cost_usd=0.5
    )
    assert [s.status for s in spent] == ["cancelled"]


async def test_a_call_run_again_after_a_crash_counts_a_failed_asked_turn_once(
    db: tuple[str, str | None],
) -> None:
    """The asked turn fails after the takeover: the reconcile hook joins it (no answer),
    the call runs again and joins it again. Both reads of its account count as one."""
    BLOCK.clear()
    BLOCK["on"] = True
    first = _crashing(
        db, [_calls(40, 0.5, "lookup", order_id="5")], [_calls(1, 0.25, "orders", message="5?")]
    )
    await first.open()
    submission = await first.start("s1", "5?")
    for _ in range(1500):  # bounded: 30 s, until the specialist's tool runs
        if BLOCK.get("calls") == 1:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the specialist's tool never ran")
    await first.close()
    BLOCK["on"] = False
    second = _crashing(
        db, [ModelStep.fail(RuntimeError("down"))], [_text("Orders is down.", 2, 0.25)]
    )
    async with second:
        await _ended(second, submission.turn_id)
        finished, spent = await _account(second, submission.turn_id)
        events = [e async for e in second.events(submission.turn_id)]
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert doubt.resolution == "rerun"
    assert [e for e in events if isinstance(e, ToolFailedEvent)]
    assert finished.asked == AskedUsage(
        turns=1, model_calls=2, input_tokens=40, output_tokens=1, cost_usd=0.5
    )
    assert [s.status for s in spent] == ["failed"]


def test_asked_agents_without_a_price_are_not_printed_as_free() -> None:
    """Asked turns on models with no price add up to $0: the line leaves the cost out."""
    assert asked_line(AskedUsage(turns=1, model_calls=1)) == "+ asked agents: 1 turn, 1 model call"
    priced = AskedUsage(turns=2, model_calls=3, cost_usd=0.0042)
    assert asked_line(priced) == "+ asked agents: 2 turns, 3 model calls, $0.0042"
