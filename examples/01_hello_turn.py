"""Run one turn and print its events, then read the committed history back.

Shows: `SessionRuntime.execute_message` streaming typed events, durable `seq` numbers, and
`runtime.history()` returning the committed blocks.

Run:  .venv/bin/python examples/01_hello_turn.py
Offline by default (a scripted model); set TURNKIT_MODEL=openai/gpt-4o-mini (and its API
key) to use a real model through litellm.
"""

import asyncio
import os
import tempfile

from turnkit import Agent, DurableEvent, RuntimeConfig, SessionRuntime
from turnkit.testing import ModelStep, ScriptedModel


def model() -> str | ScriptedModel:
    real = os.environ.get("TURNKIT_MODEL")
    return real or ScriptedModel([ModelStep.text_reply("Hello! I am a scripted model.")])


async def main() -> None:
    db = os.path.join(tempfile.mkdtemp(), "hello.db")
    agent = Agent(instructions="Answer in one sentence.", model=model())
    async with SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as rt:
        async for event in rt.execute_message("hello-session", "Say hello."):
            seq = f"#{event.seq}" if isinstance(event, DurableEvent) else "  "
            print(f"{seq:>4} {event.stage_id:12} {event.type}")
        [turn] = await rt.history("hello-session")
        print("answer:", turn.answer)


if __name__ == "__main__":
    asyncio.run(main())
