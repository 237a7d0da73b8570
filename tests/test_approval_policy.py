"""An approval policy judges the call the tool would run, and a policy that fails asks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import follow_to_done
from turnkit import Agent, Approve, Deny, Principal, RuntimeConfig, SessionRuntime, tool
from turnkit.events import ApprovalRequestedEvent, DoneEvent, ToolFailedEvent
from turnkit.pauses import ApprovalContext
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

REFUNDS: list[tuple[str, int]] = []
SEEN: list[dict[str, Any]] = []


def over_fifty(name: str, args: Mapping[str, Any]) -> bool:
    SEEN.append(dict(args))
    return bool(args["amount"] > 50)


@tool(approval=over_fifty)
async def refund(order_id: str, amount: int) -> str:
    """Refund part of an order (a person approves more than 50)."""
    REFUNDS.append((order_id, amount))
    return f"refunded {amount} on {order_id}"


@pytest.fixture(autouse=True)
def _reset() -> None:
    REFUNDS.clear()
    SEEN.clear()
    FLAKY["calls"] = 0


async def _turn(tmp_path: Path, *steps: ModelStep) -> list[Any]:
    model = ScriptedModel(list(steps))
    agent = Agent(model=model, tools=[refund], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'policy.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        return await collect_events(runtime.execute_message("s1", "refund A1"))


async def test_the_policy_sees_the_arguments_the_tool_would_run_with(tmp_path: Path) -> None:
    """A number written as text is the number the tool gets: a policy on the raw JSON
    would see "80", compare nothing, and let an 80 refund through unasked."""
    events = await _turn(tmp_path, ModelStep.tool_call_reply(call("refund", order_id="A1",
                                                                  amount="80")))  # fmt: skip
    assert SEEN == [{"order_id": "A1", "amount": 80}]
    assert isinstance(events[-1], ApprovalRequestedEvent)
    assert REFUNDS == []


async def test_a_call_the_tool_would_refuse_is_not_asked_about(tmp_path: Path) -> None:
    """Arguments the tool refuses never reach the policy: the model reads why and retries."""
    events = await _turn(
        tmp_path,
        ModelStep.tool_call_reply(call("refund", order_id="A1")),  # no amount
        ModelStep.tool_call_reply(call("refund", order_id="A1", amount=20)),
        ModelStep.text_reply("Refunded 20."),
    )
    failed = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert [e.code for e in failed] == ["tool-arguments-invalid"]
    assert SEEN == [{"order_id": "A1", "amount": 20}]
    assert REFUNDS == [("A1", 20)]
    assert events[-1].type == "done"


def _broken(name: str, args: Mapping[str, Any]) -> bool:
    raise KeyError("limit")


@tool(approval=_broken)
async def wire(to: str) -> str:
    """Wire money."""
    REFUNDS.append((to, 0))
    return "wired"


async def test_a_policy_that_raises_asks_a_person(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Failing closed: the call waits for a person instead of failing the whole turn."""
    model = ScriptedModel([ModelStep.tool_call_reply(call("wire", to="Bob"))])
    agent = Agent(model=model, tools=[wire], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'raises.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "wire Bob"))
        status = (await runtime.turn(events[0].turn_id)).status
    assert isinstance(events[-1], ApprovalRequestedEvent)
    assert status == "awaiting_approval"
    assert REFUNDS == []
    assert "the approval policy of 'wire' raised KeyError" in caplog.text


FLAKY = {"calls": 0}


def _flaky(name: str, args: Mapping[str, Any]) -> bool:
    FLAKY["calls"] += 1
    if FLAKY["calls"] == 1:
        raise TimeoutError("the limits service is down")  # fails closed: asks
    return False  # back up on resume: it would not ask


@tool(approval=_flaky)
async def pay(to: str) -> str:
    """Pay someone."""
    REFUNDS.append((to, 1))
    return "paid"


async def test_a_denial_stands_when_the_policy_answers_otherwise_on_resume(
    tmp_path: Path,
) -> None:
    """The node runs again on resume: the person's answer, not the policy, decides."""
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("pay", to="Bob")), ModelStep.text_reply("Not paid.")]
    )
    agent = Agent(model=model, tools=[pay], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'flaky.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "pay Bob")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await runtime.resume(asked.turn_id, asked.request_id, Deny(note="no"))
        rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
    assert REFUNDS == []
    assert [e.code for e in rest if isinstance(e, ToolFailedEvent)] == ["tool-denied"]


@tool(approval="always", approver_role="supervisor")
async def manual_refund(order_id: str) -> str:
    """Refund by hand: a supervisor approves."""
    return "refunded by hand"


@tool(fallbacks=[manual_refund])
async def quick_refund(order_id: str) -> str:
    """Refund through the processor (by hand when it is down)."""
    raise RuntimeError("the processor is down")


async def test_a_tool_class_asks_for_the_role_of_any_member_that_may_run(
    tmp_path: Path,
) -> None:
    """The owner may not approve a call whose fallback only a supervisor may approve."""
    model = ScriptedModel([ModelStep.tool_call_reply(call("quick_refund", order_id="A1"))])
    agent = Agent(model=model, tools=[quick_refund], approval="always",
                  skip_stages=frozenset({"anchor-plan"}))  # fmt: skip
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'class.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "refund A1")))[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    assert asked.approver_role == "supervisor"


async def test_always_does_not_ask_about_a_call_the_tool_refuses(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("manual_refund")),  # no order_id
            ModelStep.text_reply("I need the order."),
        ]
    )
    agent = Agent(model=model, tools=[manual_refund], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'refused.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "refund"))
    assert not [e for e in events if isinstance(e, ApprovalRequestedEvent)]
    assert [e.code for e in events if isinstance(e, ToolFailedEvent)] == ["tool-arguments-invalid"]


def _unless_a_supervisor_asks(name: str, args: Mapping[str, Any], ctx: ApprovalContext) -> bool:
    SEEN.append({"caller": ctx.caller.id if ctx.caller else None, "session": ctx.session_id,
                 "deps": ctx.deps})  # fmt: skip
    return not (ctx.caller is not None and "supervisor" in ctx.caller.roles)


@tool(approval=_unless_a_supervisor_asks)
async def waive_fee(order_id: str) -> str:
    """Waive an order's fee (a customer's request needs a supervisor's approval)."""
    REFUNDS.append((order_id, 0))
    return "waived"


async def test_a_policy_may_read_who_asks_and_the_turns_deps(tmp_path: Path) -> None:
    """As the Agents SDK's `needs_approval(ctx, ...)`: a supervisor's own request runs."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("waive_fee", order_id="A1")),
            ModelStep.text_reply("Waived."),
            ModelStep.tool_call_reply(call("waive_fee", order_id="A2")),
        ]
    )
    agent = Agent(model=model, tools=[waive_fee], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'context.db'}")
    sam = Principal(id="sam", roles=frozenset({"supervisor"}))
    async with SessionRuntime(agent=agent, config=config, deps=lambda caller: "shop-db") as runtime:
        own = await collect_events(runtime.execute_message("s1", "waive A1", principal=sam))
        asked = await collect_events(runtime.execute_message("s2", "waive A2", principal="ada"))
    assert isinstance(own[-1], DoneEvent)
    assert own[-1].status == "succeeded"
    assert isinstance(asked[-1], ApprovalRequestedEvent)
    assert REFUNDS == [("A1", 0)]
    assert SEEN == [
        {"caller": "sam", "session": "s1", "deps": "shop-db"},
        {"caller": "ada", "session": "s2", "deps": "shop-db"},
    ]


def test_a_policy_of_another_shape_is_refused_where_it_is_given() -> None:
    from turnkit.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="name, arguments"):
        tool(approval=lambda: True)(waive_fee.fn)


RAN: list[str] = []


def _only_for_workers(name: str, args: Mapping[str, Any], ctx: ApprovalContext) -> bool:
    return ctx.deps == "worker-deps"  # asks only where the deps say so


@tool(approval=_only_for_workers)
async def archive(order_id: str) -> str:
    """Archive an order."""
    RAN.append(f"archive {order_id}")
    return "archived"


@tool(approval="always")
async def delete_order(order_id: str) -> str:
    """Delete an order (a person approves)."""
    RAN.append(f"delete {order_id}")
    return "deleted"


async def test_a_call_that_did_not_ask_does_not_take_a_later_calls_answer(
    tmp_path: Path,
) -> None:
    """LangGraph hands answers to a node's interrupts in order: a call before the pause
    whose policy would ask on resume (other deps) must not take the answer meant for the
    call that asked, nor leave that one waiting on a request answered already."""
    RAN.clear()
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("archive", order_id="A1", tool_call_id="c1"),
                call("delete_order", order_id="A2", tool_call_id="c2"),
            ),
            ModelStep.text_reply("Archived A1, deleted A2."),
        ]
    )
    agent = Agent(
        model=model, tools=[archive, delete_order], skip_stages=frozenset({"anchor-plan"})
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'order.db'}")
    async with SessionRuntime(agent=agent, config=config, deps=lambda caller: "api-deps") as rt:
        asked = (await collect_events(rt.execute_message("s1", "tidy up")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert asked.tool_name == "delete_order"
        await rt.resume(asked.turn_id, asked.request_id, Approve(), deps="worker-deps")
        rest = await follow_to_done(rt, asked.turn_id, asked.seq)
        status = (await rt.turn(asked.turn_id)).status
    assert status == "succeeded"
    assert sorted(RAN) == ["archive A1", "delete A2"]
    assert not [e for e in rest if isinstance(e, ApprovalRequestedEvent)]


@tool(approval="always")
async def pay_v2(order_id: str) -> str:
    """Pay through the new processor (a person approves)."""
    RAN.append(f"v2 {order_id}")
    return "paid by v2"


async def test_a_member_of_a_nested_tool_class_is_asked_about(tmp_path: Path) -> None:
    from turnkit.tools import ToolClass

    async def pay_v1(order_id: str) -> str:
        """Pay through the old processor (it is down)."""
        raise RuntimeError("down")

    inner = ToolClass("pay_new", [pay_v2])
    outer = tool(fallbacks=[inner])(pay_v1)
    RAN.clear()
    model = ScriptedModel([ModelStep.tool_call_reply(call("pay_v1", order_id="A1"))])
    agent = Agent(model=model, tools=[outer], skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'nested.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "pay A1"))
    assert isinstance(events[-1], ApprovalRequestedEvent)
    assert RAN == []


def test_policies_of_every_shape_python_allows_are_taken_or_refused_clearly() -> None:
    from dataclasses import dataclass

    from turnkit.errors import ConfigurationError
    from turnkit.tools import ToolClass

    @dataclass
    class Over:  # a dataclass instance is unhashable: taken all the same
        limit: int

        def __call__(self, name: str, args: Mapping[str, Any]) -> bool:
            return bool(args["amount"] > self.limit)

    def with_default(name: str, args: Mapping[str, Any], limit: int = 100) -> bool:
        return bool(args["amount"] > limit)  # two arguments: the default stays

    def needs_keyword(name: str, args: Mapping[str, Any], *, ctx: Any) -> bool:
        return True

    for policy in (Over(50), with_default):
        tool(approval=policy)(refund.fn)
    with pytest.raises(ConfigurationError, match="name, arguments"):
        tool(approval=needs_keyword)(refund.fn)

    @tool(approval="always", approver_role="clerk")
    async def by_hand(order_id: str) -> str:
        """Refund by hand."""
        return "done"

    @tool(approval="always", approver_role="finance")
    async def by_wire(order_id: str) -> str:
        """Refund by wire."""
        return "done"

    with pytest.raises(ConfigurationError, match="different approver roles"):
        ToolClass("refund_any", [by_hand, by_wire])
