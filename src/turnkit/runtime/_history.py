from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from turnkit.blocks import Block, TextBlock
from turnkit.events import Citation, Entity, Task
from turnkit.ids import TurnId
from turnkit.projection import (
    PendingDecision,
    QueuedInput,
    SessionView,
    TurnView,
    project,
    project_session,
)
from turnkit.states import PAUSED_STATES, TERMINAL_STATES, TurnStatus
from turnkit.store import Store, TurnRecord, readable_events

__all__ = ("TurnHistory", "session_view", "turn_history", "turn_view")


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
        error_code: Why a turn that failed or timed out ended (None otherwise).
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
    error_code: str | None = None

    @property
    def answer(self) -> str | None:
        """The answer text, if the turn wrote one."""
        for block in reversed(self.blocks):
            if isinstance(block, TextBlock) and block.is_answer:
                return block.text
        return None


async def turn_view(store: Store, record: TurnRecord) -> TurnView:
    """A turn's projection, as its stored status has it (see `_as_stored`)."""
    view = project(record.turn_id, await readable_events(store.read_events(record.turn_id)))
    return _as_stored(view, record.status)


async def turn_history(store: Store, turn: TurnRecord) -> TurnHistory:
    """A turn's committed blocks."""
    view = await turn_view(store, turn)
    return TurnHistory(
        turn_id=turn.turn_id,
        status=turn.status,
        blocks=view.blocks,
        pending=view.pending,
        tasks=view.tasks,
        citations=view.citations,
        entities=view.entities,
        cost_usd=view.cost_usd,
        input_tokens=view.input_tokens,
        output_tokens=view.output_tokens,
        error_code=turn.error_code,
    )


async def session_view(store: Store, records: Sequence[TurnRecord]) -> SessionView:
    """The projection of a session's turns (oldest first) and the guides open turns hold."""
    turns = []
    guides: list[QueuedInput] = []
    for record in records:
        turns.append((record.turn_id, await readable_events(store.read_events(record.turn_id))))
        if record.status not in TERMINAL_STATES:
            held = await store.guided_inputs(record.turn_id, after_input_seq=0)
            guides += [
                QueuedInput(
                    turn_id=record.turn_id,
                    input_seq=seq,
                    content=content,
                    delivery="guide",
                    request_id=request_id,
                )
                for seq, content, request_id in held
            ]
    view = project_session(turns, guides)
    status = {r.turn_id: r.status for r in records}
    return replace(view, turns=tuple(_as_stored(t, status[t.turn_id]) for t in view.turns))


def _as_stored(view: TurnView, status: TurnStatus) -> TurnView:
    """An answered pause waits for nothing, though the log shows nothing after it yet."""
    if view.pending is None or status in PAUSED_STATES:
        return view
    return replace(view, pending=None, status=status)
