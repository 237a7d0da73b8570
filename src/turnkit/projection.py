"""The projection: a turn's committed events folded into what a person sees.

One fold, used by `history`, the pending-decision routes and (ported line by line) the
chat page, so none of them re-derives state on its own. It is pure: the same events
always give the same view.

A turn's view holds its blocks in log order, its work segments (the turn's own message,
then one per guide message it consumed), the newest task list, the decision it waits
for (an approval or a question), its cost, and its status. `run.finished` is the turn's
boundary: only then is it settled, and only then does the session's queue move on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import JsonValue

from turnkit.blocks import Block, TextBlock, UserBlock
from turnkit.events import (
    ApprovalRequestedEvent,
    Citation,
    ClarificationRequestedEvent,
    DoneEvent,
    DurableEvent,
    Entity,
    ErrorEvent,
    InputGuidedEvent,
    MessageCitationsEvent,
    MessageCompleteEvent,
    MessageEntitiesEvent,
    RunFinishedEvent,
    StreamEvent,
    Task,
    TasksUpdatedEvent,
    ThinkingCompleteEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
    TurnStartedEvent,
)
from turnkit.ids import TurnId
from turnkit.states import TurnStatus

__all__ = ("PendingDecision", "TurnView", "WorkSegment", "project")


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingDecision:
    """What a paused turn waits for: an approval of a tool call, or an answer."""

    turn_id: TurnId
    request_id: str
    kind: Literal["approval", "clarification"]
    seq: int
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: dict[str, JsonValue] | None = None
    summary: str | None = None
    question: str | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkSegment:
    """The work done about one message: the turn's own, or a guide message it consumed."""

    input_seq: int
    content: str
    blocks: tuple[Block, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnView:
    """One turn as a person sees it."""

    turn_id: TurnId
    status: TurnStatus = "running"
    blocks: tuple[Block, ...] = ()
    segments: tuple[WorkSegment, ...] = ()
    tasks: tuple[Task, ...] = ()
    citations: tuple[Citation, ...] = ()
    """What enrichment plugins cited for the turn's blocks (`message.citations`)."""
    entities: tuple[Entity, ...] = ()
    pending: PendingDecision | None = None
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    error_code: str | None = None
    error_message: str | None = None
    settled: bool = False
    """`run.finished` arrived: the turn's account is final (its `done` follows)."""
    last_seq: int = 0

    @property
    def answer(self) -> str | None:
        """The answer text, if the turn wrote one."""
        for block in reversed(self.blocks):
            if isinstance(block, TextBlock) and block.is_answer:
                return block.text
        return None


@dataclass(slots=True)
class _Fold:
    view: TurnView
    blocks: list[Block] = field(default_factory=list[Block])
    segments: list[WorkSegment] = field(default_factory=list[WorkSegment])

    def add(self, block: Block) -> None:
        self.blocks.append(block)
        if self.segments:
            last = self.segments[-1]
            self.segments[-1] = replace(last, blocks=(*last.blocks, block))


def project(turn_id: TurnId, events: Iterable[StreamEvent]) -> TurnView:
    """Fold a turn's events (committed ones; ephemeral ones are ignored) into its view."""
    fold = _Fold(TurnView(turn_id=turn_id))
    for event in events:
        if isinstance(event, DurableEvent):
            _apply(fold, event)
    return replace(fold.view, blocks=tuple(fold.blocks), segments=tuple(fold.segments))


def _apply(fold: _Fold, event: DurableEvent) -> None:  # noqa: C901 - one arm per event
    view = fold.view
    if view.pending is not None and event.seq > view.pending.seq:
        view = replace(view, pending=None, status="running")  # the turn went on
    view = replace(view, last_seq=event.seq)
    match event:
        case TurnStartedEvent(content=content, attachments=attachments):
            fold.segments.append(WorkSegment(input_seq=1, content=content))
            fold.add(UserBlock(text=content, attachments=attachments))
        case InputGuidedEvent(content=content, input_seq=input_seq):
            fold.segments.append(WorkSegment(input_seq=input_seq, content=content))
            fold.add(UserBlock(text=content))
        case ThinkingCompleteEvent(block=block) | MessageCompleteEvent(block=block):
            fold.add(block)
        case ToolStartedEvent(block=block):
            fold.add(block)
        case ToolCompletedEvent(result=result) | ToolFailedEvent(result=result):
            fold.add(result)
        case TasksUpdatedEvent(tasks=tasks):
            view = replace(view, tasks=tasks)
        case MessageCitationsEvent(citations=citations):
            view = replace(view, citations=(*view.citations, *citations))
        case MessageEntitiesEvent(entities=entities):
            view = replace(view, entities=(*view.entities, *entities))
        case ApprovalRequestedEvent():
            view = replace(
                view,
                status="awaiting_approval",
                pending=PendingDecision(
                    turn_id=view.turn_id,
                    request_id=event.request_id,
                    kind="approval",
                    seq=event.seq,
                    tool_call_id=event.tool_call_id,
                    tool_name=event.tool_name,
                    arguments=event.arguments,
                    summary=event.summary,
                ),
            )
        case ClarificationRequestedEvent():
            view = replace(
                view,
                status="awaiting_input",
                pending=PendingDecision(
                    turn_id=view.turn_id,
                    request_id=event.request_id,
                    kind="clarification",
                    seq=event.seq,
                    question=event.question,
                    choices=event.choices,
                ),
            )
        case ErrorEvent(code=code, message=message):
            view = replace(view, error_code=code, error_message=message)
        case RunFinishedEvent():
            view = replace(
                view,
                settled=True,
                cost_usd=event.cost_usd,
                input_tokens=event.input_tokens,
                output_tokens=event.output_tokens,
            )
        case DoneEvent(status=status):
            view = replace(view, status=status, pending=None)
        case _:
            pass
    fold.view = view
