"""A plugin, the FastAPI routes, the config and the testing helpers (type-checked only)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import ClassVar, assert_type

from fastapi import FastAPI, Header
from pydantic import JsonValue

from turnkit import Agent, Principal, RuntimeConfig, SessionRuntime, StreamEvent, tool
from turnkit.events import DurableStreamEvent, ToolCompletedEvent
from turnkit.http import create_health_router, create_turnkit_router, install_problem_handlers
from turnkit.models import ModelRequest
from turnkit.plugins import ModelCallView, Note, Plugin, PluginContext, ToolCall, Verdict
from turnkit.testing import ModelStep, ScriptedModel, TestModel, call, collect_events


class Guard(Plugin):
    name: ClassVar[str] = "guard"
    order: ClassVar[int] = 10

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str | Note] | None:
        return [Note("Be brief.", standing=True)]

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        assert_type(call.arguments, Mapping[str, JsonValue])
        return None if ctx.principal else "sign in first"

    async def on_event(self, ctx: PluginContext, event: DurableStreamEvent) -> None:
        if isinstance(event, ToolCompletedEvent):
            ctx.audit({"tool": event.tool_name, "seq": event.seq})
            await ctx.emit("seen", {"tool": event.tool_name})

    async def check_input(self, ctx: PluginContext, text: str) -> Verdict | None:
        if "password" in text:
            return Verdict(action="redact", kind="secret", replacement="[redacted]")
        return None


@tool
def refund(cents: int) -> str:
    """Refund."""
    return f"refunded {cents}"


@dataclass
class Deps:
    tenant: str


async def current_user(authorization: str = Header()) -> Principal:
    return Principal(id=authorization.removeprefix("Bearer "), roles=frozenset({"admin"}))


def header_user(x_user: str | None = Header(default=None)) -> str | None:
    return x_user


async def app_deps(x_tenant: str = Header()) -> Deps:
    return Deps(tenant=x_tenant)


def reply(request: ModelRequest) -> ModelStep:
    return ModelStep.text_reply(f"{len(request.messages)} messages")


model = ScriptedModel(
    [ModelStep.tool_call_reply(call("refund", cents=5)), ModelStep.respond(reply)]
)
config = RuntimeConfig(database_url="sqlite:///app.db", budgets="enforce")
runtime = SessionRuntime(agent=Agent(model=model, tools=[refund], plugins=[Guard()]), config=config)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with runtime:
        yield


app = FastAPI(lifespan=lifespan)
app.include_router(create_turnkit_router(runtime, auth=current_user, deps=app_deps))
app.include_router(create_turnkit_router(runtime, auth=header_user, prefix="/v2"))
app.include_router(create_health_router(runtime))
install_problem_handlers(app)


async def a_test() -> None:
    events = await collect_events(runtime.execute_message("s1", "refund"))
    assert_type(events, list[StreamEvent])
    assert_type(model.calls, list[ModelRequest])
    Agent(model=TestModel(answer="done"), tools=[refund])
