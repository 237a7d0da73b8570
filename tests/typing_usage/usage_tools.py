"""Tools as a user writes them: kept in lists, passed to agents, unit-tested through `fn`.

Type-checked (never run) by tests/test_typed_api.py with `mypy --strict`; a
`# type: ignore[...]` line is a call the public types must refuse (an unused ignore fails).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import assert_type

from pydantic import BaseModel, JsonValue

from turnkit import Agent, ToolClass, ToolContext, tool
from turnkit.models import ToolSpec
from turnkit.pauses import ApprovalContext
from turnkit.tools import NOT_APPLIED, FunctionTool, Tool


class Order(BaseModel):
    sku: str
    qty: int = 1


@dataclass
class Deps:
    shop: str


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
async def place(order: Order, ctx: ToolContext[Deps]) -> dict[str, str]:
    """Place an order."""
    assert_type(ctx.deps, Deps)
    return {"shop": ctx.deps.shop, "sku": order.sku}


def applied_at_once(key: str, arguments: dict[str, JsonValue]) -> object:
    return NOT_APPLIED  # a plain `def` hook answers at once


async def applied_later(key: str, arguments: Mapping[str, JsonValue]) -> object:
    return NOT_APPLIED


def over_ten(name: str, arguments: Mapping[str, JsonValue]) -> bool:
    return arguments.get("cents", 0) != 0


def ask_the_boss(name: str, arguments: Mapping[str, JsonValue], ctx: ApprovalContext) -> bool:
    return True


@tool(name="pay", approval=over_ten, reconcile=applied_at_once, timeout_s=5)
def pay(to: str, cents: int) -> str:
    """Pay someone."""
    return f"{cents} to {to}"


@tool(approval=ask_the_boss, reconcile=applied_later)
async def refund(cents: int) -> None:
    """Refund."""


@tool(fallbacks=[pay])
async def pay_fast(to: str, cents: int) -> str:
    """Pay another way when this fails."""
    return to


# `fn` is the function, to unit-test it without a turn (docs/guides/testing.md).
assert add.fn(1, 2) == 3


async def unit_test(ctx: ToolContext[Deps]) -> None:
    assert await place.fn(Order(sku="a"), ctx) == {"sku": "a"}


assert_type(pay_fast, ToolClass)
assert_type(add.spec(), ToolSpec)
assert_type(add.name, str)
assert_type(add, FunctionTool)
tools: list[Tool] = [add, place, pay, refund, pay_fast]
# Tools of different signatures kept in a list with no annotation (a module's TOOLS).
TOOLS = [add, place, pay, refund]
Agent(model="openai/gpt-4o-mini", tools=TOOLS)
EITHER = add if tools else pay
Agent(model="openai/gpt-4o-mini", tools=[EITHER])
agent = Agent(model="openai/gpt-4o-mini", tools=[add, place, pay, refund, pay_fast])
