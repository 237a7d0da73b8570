from __future__ import annotations

from dataclasses import dataclass

from turnkit.blocks import Block, TextBlock, UserBlock
from turnkit.events import (
    MessageCompleteEvent,
    StreamEvent,
    ThinkingCompleteEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
    TurnStartedEvent,
)
from turnkit.ids import TurnId
from turnkit.states import TurnStatus

__all__ = ("TurnHistory", "blocks_of")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnHistory:
    """One committed turn: its status and its blocks in order."""

    turn_id: TurnId
    status: TurnStatus
    blocks: tuple[Block, ...]

    @property
    def answer(self) -> str | None:
        """The answer text, if the turn wrote one."""
        for block in reversed(self.blocks):
            if isinstance(block, TextBlock) and block.is_answer:
                return block.text
        return None


def blocks_of(events: list[StreamEvent]) -> tuple[Block, ...]:
    """The typed blocks a turn's committed events describe, in log order."""
    blocks: list[Block] = []
    for event in events:
        match event:
            case TurnStartedEvent(content=content, attachments=attachments):
                blocks.append(UserBlock(text=content, attachments=attachments))
            case ThinkingCompleteEvent(block=block):
                blocks.append(block)
            case MessageCompleteEvent(block=block):
                blocks.append(block)
            case ToolStartedEvent(block=block):
                blocks.append(block)
            case ToolCompletedEvent(result=result) | ToolFailedEvent(result=result):
                blocks.append(result)
            case _:
                pass
    return tuple(blocks)
