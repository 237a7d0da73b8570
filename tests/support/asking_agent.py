"""Agents whose one turn pauses at once: for an approval, or with a question (`--agent`)."""

from __future__ import annotations

from turnkit import Agent, tool
from turnkit.testing import ModelStep, ScriptedModel, call


@tool(approval="always")
async def delete_file(path: str) -> str:
    """Delete a file (it asks first)."""
    return f"deleted {path}"


approving = Agent(
    model=ScriptedModel([ModelStep.tool_call_reply(call("delete_file", path="/tmp/x.txt"))]),
    tools=[delete_file],
    skip_stages=frozenset({"anchor-plan"}),
)

asking = Agent(
    model=ScriptedModel([
        ModelStep.tool_call_reply(call("ask_user", question="Which unit?", choices=["EUR", "USD"]))
    ]),
    clarifications=True,
    skip_stages=frozenset({"anchor-plan"}),
)  # fmt: skip
