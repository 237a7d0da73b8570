"""Tools with a fallback, on a model family whose first rung is rate-limited.

Shows: `@tool` (schema from the signature), `@tool(fallbacks=[...])` pivoting when a tool
raises, `ModelFamily` walking to its second rung on a 429, and the audit rows each step
leaves (`fallbackStep`, `toolFallbackStep`, `synthesisQuality`, ...).

Run:  .venv/bin/python examples/02_tools_and_cascade.py   (offline, scripted models)
"""

import asyncio
import os
import tempfile

from turnkit import Agent, ModelFamily, ProviderError, RuntimeConfig, SessionRuntime, tool
from turnkit.testing import ModelStep, ScriptedModel, call


@tool
async def cached_price(symbol: str) -> float:
    """Price from the local cache."""
    return {"ACME": 12.5}[symbol]


@tool(fallbacks=[cached_price])
async def live_price(symbol: str) -> float:
    """Live price of a stock symbol.

    Args:
        symbol: Ticker, e.g. "ACME".
    """
    raise ConnectionError("market data feed is down")


# Each model call starts at the family's first rung; this one is rate-limited every time.
primary = ScriptedModel(
    [ModelStep.fail(ProviderError("rate limited", status_code=429))] * 2, name="big"
)
backup = ScriptedModel(
    [
        ModelStep.tool_call_reply(call("live_price", symbol="ACME")),
        # A call that names no tool has finished: its text is the answer (no extra call).
        ModelStep.text_reply("ACME is at $12.50 (from the cache: the live feed is down)."),
    ],
    name="small",
)


async def main() -> None:
    db = os.path.join(tempfile.mkdtemp(), "tools.db")
    agent = Agent(model=ModelFamily("demo-family", [primary, backup]), tools=[live_price])
    async with SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as rt:
        turn_id = ""
        async for event in rt.execute_message("prices", "What does ACME trade at?"):
            turn_id = event.turn_id
            if event.type in ("provider.cascade", "tool.completed", "error", "done"):
                print(event.type, event.model_dump(exclude={"session_id", "turn_id", "ts"}))
        for row in await rt.audit(turn_id):
            model = row.call.model if row.call else "-"
            print(
                f"audit #{row.identity.seq_within_turn} {row.identity.stage_id:10} {model:6}",
                row.payloads.kinds(),
            )
        print("answer:", (await rt.history("prices"))[0].answer)


if __name__ == "__main__":
    asyncio.run(main())
