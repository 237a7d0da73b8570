"""An answer in a typed shape: asked for as JSON, checked, and asked for again when wrong.

Shows: `Agent(output_type=...)` sending the answer's JSON schema with the answering call,
an answer that does not validate kept as narration while the model is told what was
wrong, the `outputCheck` audit rows, and the answer read back as the typed object.

Run:  .venv/bin/python examples/structured_answer.py
Offline by default (a scripted model whose first answer misses a field); set
TURNKIT_MODEL=openai/gpt-4o-mini (and its API key) to use a real model through litellm.
"""

import asyncio
import os
import tempfile
from typing import Literal

from pydantic import BaseModel, Field

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.events import MessageCompleteEvent
from turnkit.testing import ModelStep, ScriptedModel


class Triage(BaseModel):
    """How a support ticket is routed."""

    team: Literal["billing", "shipping", "technical"]
    urgent: bool
    summary: str = Field(max_length=80)


def model() -> str | ScriptedModel:
    real = os.environ.get("TURNKIT_MODEL")
    return real or ScriptedModel(
        [
            ModelStep.text_reply('{"team": "billing", "summary": "Charged twice for May"}'),
            ModelStep.text_reply(
                '{"team": "billing", "urgent": true, "summary": "Charged twice for May"}'
            ),
        ]
    )


async def main() -> None:
    db = os.path.join(tempfile.mkdtemp(), "triage.db")
    agent = Agent(
        instructions="Route the customer's ticket. Reply with the JSON object only.",
        model=model(),
        output_type=Triage,
    )
    async with SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}")
    ) as rt:
        message = "I was charged twice for my May invoice and rent is due tomorrow!"
        async for event in rt.execute_message("ticket-1", message):
            if isinstance(event, MessageCompleteEvent):
                kind = "answer" if event.block.is_answer else "narration"
                print(f"{kind}: {event.block.text}")
        [turn] = await rt.history("ticket-1")
        for row in await rt.audit(turn.turn_id):
            check = row.payloads.output_check
            if check is not None:
                print(f"outputCheck attempt {check.attempt}: valid={check.valid}", *check.problems)
        triage = Triage.model_validate_json(turn.answer or "")
        print(f"routed to {triage.team}, urgent={triage.urgent}: {triage.summary}")


if __name__ == "__main__":
    asyncio.run(main())
