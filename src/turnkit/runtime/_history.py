from __future__ import annotations

from dataclasses import dataclass

from turnkit.blocks import Block, TextBlock
from turnkit.events import Citation, Entity, Task
from turnkit.ids import TurnId
from turnkit.projection import PendingDecision
from turnkit.states import TurnStatus

__all__ = ("TurnHistory",)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnHistory:
    """One committed turn: its status, its blocks in order, and what it waits for.

    Attributes:
        pending: The approval or question a paused turn waits for.
        tasks: The turn's newest task list.
        citations: The sources enrichment plugins cited for the answer.
        entities: The entities they found in it.
        cost_usd: The turn's cost once it has finished (0 before).
        input_tokens: Tokens its model calls sent, once it has finished.
        output_tokens: Tokens they wrote, once it has finished.
    """

    turn_id: TurnId
    status: TurnStatus
    blocks: tuple[Block, ...]
    pending: PendingDecision | None = None
    tasks: tuple[Task, ...] = ()
    citations: tuple[Citation, ...] = ()
    entities: tuple[Entity, ...] = ()
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def answer(self) -> str | None:
        """The answer text, if the turn wrote one."""
        for block in reversed(self.blocks):
            if isinstance(block, TextBlock) and block.is_answer:
                return block.text
        return None
