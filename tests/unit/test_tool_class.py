"""A ToolClass answers a reconcile (a call in doubt) through its members' hooks."""

from __future__ import annotations

from pydantic import JsonValue

from turnkit import ToolClass, ToolContext, tool
from turnkit.ids import SessionId, ToolCallId, TurnId
from turnkit.tools import NOT_APPLIED

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
