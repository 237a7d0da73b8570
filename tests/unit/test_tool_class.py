"""A ToolClass answers a reconcile (a call in doubt) through its members' hooks."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from pydantic import JsonValue

from turnkit import Agent, ConfigurationError, ToolClass, ToolContext, tool
from turnkit.ids import SessionId, ToolCallId, TurnId
from turnkit.models import ToolSpec
from turnkit.testing import ScriptedModel
from turnkit.tools import NOT_APPLIED, ToolArgumentsError
from turnkit.tools._protocol import ReconcileMisfitError

APPLIED: dict[str, JsonValue] = {}


async def _by_key(key: str, arguments: dict[str, JsonValue]) -> JsonValue:
    return APPLIED.get(key, NOT_APPLIED)


@tool
async def primary(order: str) -> str:
    """Place an order."""
    raise RuntimeError("down")


@tool(reconcile=_by_key)
async def backup(order: str) -> str:
    """Place an order elsewhere."""
    return f"placed {order}"


def _ctx(key: str) -> ToolContext:
    return ToolContext(
        session_id=SessionId("s1"),
        turn_id=TurnId("t1"),
        tool_call_id=ToolCallId("c1"),
        idempotency_key=key,
    )


async def test_a_member_that_took_effect_answers_for_the_class() -> None:
    orders = ToolClass("place_order", [primary, backup])
    APPLIED["idem_done"] = "placed 42"
    assert await orders.reconcile({"order": "42"}, _ctx("idem_done")) == (True, "placed 42")
    assert await orders.reconcile({"order": "43"}, _ctx("idem_new")) == (False, None)
    assert await ToolClass("x", [primary]).reconcile({}, _ctx("idem_done")) == (False, None)


@tool
async def other_schema(item_id: int) -> str:
    """Place an order by item number."""
    return f"placed #{item_id}"


async def test_a_fallback_that_refuses_the_arguments_leaves_the_real_failure_standing() -> None:
    orders = ToolClass("place_order", [primary, other_schema])
    # The first member ran and failed; the fallback's schema differs: "down" is what happened.
    with pytest.raises(RuntimeError, match="down"):
        await orders.invoke({"order": "42"}, _ctx("idem_a"))
    # Arguments the first member refuses are the model's to fix, and no member runs.
    with pytest.raises(ToolArgumentsError, match="order"):
        await ToolClass("place_order", [backup, other_schema]).invoke({}, _ctx("idem_b"))


class _HandWritten:
    """A tool written by hand, with its own approval policy spelled wrong."""

    name = "wire"
    approval = "Always"

    def spec(self) -> ToolSpec:
        return ToolSpec(name="wire", description="Send money.", parameters={"type": "object"})

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        return "sent"


def test_a_hand_written_tools_own_policy_is_refused_where_the_agent_is_made() -> None:
    """As `@tool(approval="Always")` is: not at the first call, where it only logs."""
    with pytest.raises(ConfigurationError, match="'Always' of the tool 'wire'"):
        Agent(model=ScriptedModel([]), tools=[_HandWritten()])
    with pytest.raises(ConfigurationError, match="'Always' of the tool 'wire'"):
        Agent(model=ScriptedModel([]), tools=[ToolClass("pay", [_HandWritten()])])


class _MisshapedHook:
    """A hand-written member whose reconcile answers a receipt instead of (applied, result)."""

    name = "place_by_hand"

    def spec(self) -> ToolSpec:
        return backup.spec()

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        return "placed"

    async def reconcile(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> object:
        return {"receipt": "R-1", "state": "unknown"}


async def test_a_misshaped_answer_does_not_hide_a_member_that_knows_it_ran() -> None:
    orders = ToolClass("place_order", [_MisshapedHook(), backup])
    APPLIED["idem_b"] = "placed 7 (backup)"
    assert await orders.reconcile({"order": "7"}, _ctx("idem_b")) == (True, "placed 7 (backup)")
    with pytest.raises(ReconcileMisfitError, match="returned dict"):  # nobody knows: it fails
        await orders.reconcile({"order": "8"}, _ctx("idem_none"))
