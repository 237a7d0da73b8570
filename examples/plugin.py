"""A plugin written from scratch, next to the shipped citations plugin.

Shows: subclassing `turnkit.plugins.Plugin`, `before_model_request` appending a note,
`before_tool_call` denying a call with a reason the model reads, `after_tool_call` writing
a namespaced audit payload and emitting `plugin.house-rules.tool-used`, `check_answer`
redacting a word before a chunk goes out (and `answer_hold` holding back the part of it
that has streamed so far), and `Citations` linking the answer to the
tool result it came from.

Run:  .venv/bin/python examples/plugin.py   (offline, scripted models)
"""

import asyncio
import os
import tempfile
from collections.abc import Sequence
from typing import ClassVar

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.blocks import ToolResultBlock
from turnkit.events import GuardrailEvent, PluginEmittedEvent
from turnkit.plugins import ModelCallView, Plugin, PluginContext, ToolCall, Verdict
from turnkit.plugins.citations import Citations
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool
async def stock_price(symbol: str) -> dict[str, str]:
    """The last price of a stock."""
    return {"symbol": symbol, "price": "12.50", "url": f"https://quotes.example/{symbol}"}


@tool
async def place_order(symbol: str, shares: int) -> str:
    """Buy shares."""
    return f"bought {shares} {symbol}"


HOUSE_STYLE = "Quote prices with their currency. Never give investment advice."


class HouseRules(Plugin):
    """Notes, a tool policy, an audit payload, an event and a guardrail in one plugin."""

    name: ClassVar[str] = "house-rules"

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        """A house-style note, once: appended, never rewritten, and kept after."""
        if ("system", HOUSE_STYLE) in call.messages:
            return None
        return [HOUSE_STYLE]

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        """Only traders may place orders."""
        if call.name == "place_order" and ctx.principal != "trader":
            return "only traders may place orders"
        return None

    async def after_tool_call(
        self, ctx: PluginContext, call: ToolCall, result: ToolResultBlock
    ) -> None:
        """Audit and announce every tool used."""
        ctx.audit({"tool": call.name, "ok": not result.is_error})
        await ctx.emit("tool-used", {"tool": call.name})

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        """No promises in answers."""
        if "guaranteed" in text:
            return Verdict(
                action="redact", kind="promise", replacement=text.replace("guaranteed", "[—]")
            )
        return None

    def answer_hold(self, text: str) -> int:
        """Hold back a word that may still grow into `guaranteed` ("guara")."""
        word = text[len(text.rstrip("abcdefghijklmnopqrstuvwxyz")) :]
        return len(word) if "guaranteed".startswith(word) else 0


async def main() -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("stock_price", symbol="ACME"), call("place_order", symbol="ACME", shares=5)
            ),
            ModelStep.text_reply(
                "ACME trades at 12.50 USD, no gains guaranteed. I could not place the order."
            ),
        ]
    )
    agent = Agent(
        model=model, tools=[stock_price, place_order], plugins=[HouseRules(), Citations()]
    )
    db = os.path.join(tempfile.mkdtemp(), "plugin.db")
    async with SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as runtime:
        events = await collect_events(
            runtime.execute_message("s1", "Price of ACME? Buy 5.", principal="viewer")
        )
        streamed = "".join(e.text for e in events if e.type == "message.delta")
        print("streamed:", streamed)  # "[—]" from the first chunk that shows it
        for event in events:
            if event.type == "tool.failed":
                print("denied:", event.result.error)
            if isinstance(event, PluginEmittedEvent):
                print("plugin event:", event.name, event.data)
            if isinstance(event, GuardrailEvent):
                print("guardrail:", event.kind, event.action)
        rows = await runtime.audit(events[0].turn_id)
        print("audit:", [r.plugin_payloads for r in rows if r.plugin_payloads])
        [turn] = await runtime.history("s1")
        print("answer:", turn.answer)
        for cited in turn.citations:
            print("cited:", cited.title, cited.url)
    print("note sent:", "Never give investment advice." in str(model.calls[0].messages))


if __name__ == "__main__":
    asyncio.run(main())
