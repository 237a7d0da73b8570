"""An agent whose first model breaks mid-answer and whose second answers (`--agent`)."""

from __future__ import annotations

from turnkit import Agent
from turnkit.errors import ProviderError
from turnkit.models.family import ModelFamily
from turnkit.testing import ModelStep, ScriptedModel

broken = ProviderError("overloaded", status_code=503, is_retriable=True)
agent = Agent(
    model=ModelFamily(
        "f",
        [
            ScriptedModel([ModelStep.cut("Partial text before ", broken)], name="first"),
            ScriptedModel([ModelStep.text_reply("Hello from the second rung.")], name="second"),
        ],
    ),
    skip_stages=frozenset({"anchor-plan"}),
)
