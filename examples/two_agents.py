"""One host, two agents, a per-message override, and a tool that knows who is calling.

Shows: `SessionRuntime(agents=[...])` hosting two bundles by name, a message picking one
(`agent="billing"`) with its own model and a per-message settings override, the turn
pinned to that agent's name and version, and a tool reading the principal and the app's
dependencies from `ToolContext[Deps]` (built by the runtime's `deps` factory, never stored).

Run:  .venv/bin/python examples/two_agents.py   (offline, scripted models)
"""

import asyncio
import os
import tempfile
from dataclasses import dataclass

from turnkit import (
    Agent,
    DepsScope,
    ModelSettings,
    RuntimeConfig,
    SessionRuntime,
    ToolContext,
    tool,
)
from turnkit.events import MessageCompleteEvent
from turnkit.testing import ModelStep, ScriptedModel, call


@dataclass(frozen=True)
class Deps:
    """What the app hands its tools; rebuilt for every turn, wherever it runs."""

    invoices: dict[str, list[int]]


def build_deps(scope: DepsScope) -> Deps:
    # A real app would take a pool from its own state and scope queries to the principal.
    return Deps(invoices={"ada": [120, 80], "grace": [40]})


@tool
async def open_invoices(ctx: ToolContext[Deps]) -> dict[str, object]:
    """The caller's open invoices."""
    mine = ctx.deps.invoices.get(ctx.principal or "", [])
    return {"customer": ctx.principal, "open": mine, "total_eur": sum(mine)}


general = Agent(
    name="general",
    instructions="You are a friendly general assistant.",
    model=ScriptedModel([ModelStep.text_reply("Hello! Ask me anything.")], name="general-model"),
)
billing = Agent(
    name="billing",
    instructions="You answer billing questions using the invoice tool.",
    model=ScriptedModel(
        [
            ModelStep.tool_call_reply(call("open_invoices")),
            ModelStep.text_reply("You have two open invoices, 200 EUR in total."),
        ],
        name="billing-model",
    ),
    tools=[open_invoices],
    settings=ModelSettings(temperature=0.1),
)


async def main() -> None:
    db = os.path.join(tempfile.mkdtemp(), "two_agents.db")
    async with SessionRuntime(
        agents=[general, billing],  # the first is the default
        deps=build_deps,
        config=RuntimeConfig(database_url=f"sqlite:///{db}"),
    ) as runtime:
        for text, agent in (("hi", None), ("what do I owe?", "billing")):
            async for event in runtime.execute_message(
                "ada-chat",
                text,
                agent=agent,
                principal="ada",
                settings=ModelSettings(seed=7) if agent else None,  # this message only
            ):
                if event.type == "tool.completed":
                    print(f"  tool -> {event.result.output}")
                if isinstance(event, MessageCompleteEvent) and event.block.is_answer:
                    record = await runtime.turn(event.turn_id)
                    print(f"[{record.agent} v{record.pinned['agent_version']}] {event.block.text}")
        sent = billing.model.calls[0].settings  # type: ignore[union-attr]
        print("billing call settings:", sent.model_dump(exclude_none=True) if sent else None)


if __name__ == "__main__":
    asyncio.run(main())
