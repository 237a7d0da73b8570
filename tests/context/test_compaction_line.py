"""The 85% line is checked exactly whenever a request could be near it, whatever its script."""

from __future__ import annotations

from dataclasses import dataclass

from tests.conftest import RuntimeFactory
from turnkit import Agent
from turnkit.events import CompactionCompletedEvent
from turnkit.models import ModelRequest, text_of
from turnkit.testing import ModelStep, ScriptedModel, collect_events


@dataclass
class _ByteCounting(ScriptedModel):
    """A model whose tokenizer gives a token per UTF-8 byte (`𓀀` is four, as for gpt-4o)."""

    def count_tokens(self, request: ModelRequest) -> int:
        return sum(len(text_of(m.content).encode()) + 4 for m in request.messages)


async def test_text_of_several_tokens_a_character_is_counted_and_compacted(
    runtime_factory: RuntimeFactory,
) -> None:
    window = 10_000
    model = _ByteCounting([ModelStep.text_reply("ok")], repeat_last=True, context_window=window)
    utility = ScriptedModel([ModelStep.text_reply("A summary.")], repeat_last=True)
    agent = Agent(model=model, utility_model=utility, skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent)
    compacted = []
    for _ in range(3):  # 1,200 characters, 4,800 tokens a message
        events = await collect_events(runtime.execute_message("s1", "𓀀" * 1_200))
        compacted.append(any(isinstance(e, CompactionCompletedEvent) for e in events))
    assert compacted == [False, True, True]
    assert all(model.count_tokens(c) < 0.85 * window for c in model.calls)
