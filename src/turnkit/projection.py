"""The projection: a turn's committed events folded into what a person sees.

One fold, used by `history`, the pending-decision routes and (ported line by line) the
chat page, so none of them re-derives state on its own. It is pure: the same events
always give the same view.

A turn's view holds its blocks in log order, its work segments (the turn's own message,
then one per guide message it consumed), the newest task list, the decision it waits
for (an approval or a question), its cost, and its status. `run.finished` is the turn's
boundary: only then is it settled, and only then does the session's queue move on.

A session's view (`project_session`) folds its turns in order and holds its queue: the
messages no turn has answered yet, that is turns waiting behind an open one and guide
messages the live turn has not taken. The queue drains only at a `run.finished` (or a
`done`), never when an answer arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import JsonValue

from turnkit.blocks import Block, TextBlock, UserBlock
from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    AskedPause,
    AskedUsage,
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
from turnkit.states import TERMINAL_STATES, TurnStatus

__all__ = (
    "PendingDecision",
    "QueuedInput",
    "SessionView",
    "TurnView",
    "WorkSegment",
    "decision_of",
    "project",
    "project_session",
)


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
    approver_role: str | None = None
    """The role that answers an approval over HTTP (None: the session's owner)."""
    answer: Literal["approve", "deny"] | None = None
    """How a person answered the approval (`approval.answered`); None while it is open,
    for a question, and in turns stored before the event existed."""
    note: str | None = None
    """What the person wrote with that answer."""
    asked: AskedPause | None = None
    """The agent asked as a tool whose request this is (the answer goes on to its turn)."""


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
    request_id: str | None = None
    """The idempotency key the turn's message was sent with."""
    blocks: tuple[Block, ...] = ()
    segments: tuple[WorkSegment, ...] = ()
    tasks: tuple[Task, ...] = ()
    citations: tuple[Citation, ...] = ()
    """What enrichment plugins cited for the turn's blocks (`message.citations`)."""
    entities: tuple[Entity, ...] = ()
    pending: PendingDecision | None = None
    """The decision the turn waits for now."""
    decisions: tuple[PendingDecision, ...] = ()
    """Every approval and question the turn asked, oldest first (answered or not)."""
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    asked: AskedUsage | None = None
    """What the agents the turn asked as tools spent, apart from its own cost and tokens."""
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

    @property
    def is_open(self) -> bool:
        """Neither settled nor ended: later turns of the session wait behind it."""
        return not self.settled and self.status not in TERMINAL_STATES


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedInput:
    """A message the session holds that no turn has answered yet.

    `delivery="queue"`: the message starts `turn_id` once every earlier turn is over.
    `delivery="guide"`: it joins the running `turn_id` before its next model request;
    one the turn never took comes back as a turn of its own after the turn's end.
    """

    turn_id: TurnId
    input_seq: int
    content: str
    delivery: Literal["queue", "guide"]
    request_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionView:
    """A session as a person sees it: its turns in order and its queue."""

    turns: tuple[TurnView, ...] = ()
    """Turns that started (or ended), oldest first; turns still queued are in `queue`."""
    queue: tuple[QueuedInput, ...] = ()

    @property
    def pending(self) -> tuple[PendingDecision, ...]:
        """The approvals and questions the session's turns wait for, oldest first."""
        return tuple(t.pending for t in self.turns if t.pending is not None)

    @property
    def live(self) -> TurnView | None:
        """The turn that has not ended yet, if any: the one Stop and guides address."""
        return next((t for t in self.turns if t.is_open), None)


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


def project_session(
    turns: Iterable[tuple[TurnId, Iterable[StreamEvent]]],
    guides: Iterable[QueuedInput] = (),
) -> SessionView:
    """Fold a session's turns (oldest first, each with its committed events) into its view.

    `guides` are the guide messages committed to the session's turns (consumed or not);
    the ones a turn has not taken yet, and that turn is still open, are queued.
    """
    by_turn: dict[TurnId, list[QueuedInput]] = {}
    for guide in guides:
        by_turn.setdefault(guide.turn_id, []).append(guide)
    started: list[TurnView] = []
    queue: list[QueuedInput] = []
    blocked = False  # an earlier turn is open: later ones wait (the queue drains at its end)
    for turn_id, events in turns:
        view = project(turn_id, events)
        if blocked and view.is_open:
            queue.extend(_as_queued(view))
            continue
        started.append(view)
        if view.is_open:
            blocked = True
            taken = {s.input_seq for s in view.segments}
            queue.extend(g for g in by_turn.get(turn_id, ()) if g.input_seq not in taken)
    return SessionView(turns=tuple(started), queue=tuple(sorted(queue, key=_sent_order)))


def _sent_order(item: QueuedInput) -> int:
    return item.input_seq


def _as_queued(view: TurnView) -> Sequence[QueuedInput]:
    """A turn waiting behind an open one: its message (once its `turn.started` is read)."""
    return [
        QueuedInput(
            turn_id=view.turn_id,
            input_seq=first.input_seq,
            content=first.content,
            delivery="queue",
            request_id=view.request_id,
        )
        for first in view.segments[:1]
    ]


def _apply(fold: _Fold, event: DurableEvent) -> None:  # noqa: C901 - one arm per event
    view = fold.view
    if view.pending is not None and event.seq > view.pending.seq:
        view = replace(view, pending=None, status="running")  # the turn went on
    view = replace(view, last_seq=event.seq)
    match event:
        case TurnStartedEvent(content=content, attachments=attachments):
            view = replace(view, request_id=event.request_id)
            fold.segments.append(WorkSegment(input_seq=event.input_seq or 1, content=content))
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
        case ApprovalRequestedEvent() | ClarificationRequestedEvent():
            view = _asks(view, decision_of(event))
        case ApprovalAnsweredEvent(request_id=request_id, decision=decision, note=note):
            answered = (
                replace(d, answer=decision, note=note) if d.request_id == request_id else d
                for d in view.decisions
            )
            view = replace(view, decisions=tuple(answered))
        case ErrorEvent(code=code, message=message):
            view = replace(view, error_code=code, error_message=message)
        case RunFinishedEvent():
            view = replace(
                view,
                settled=True,
                cost_usd=event.cost_usd,
                input_tokens=event.input_tokens,
                output_tokens=event.output_tokens,
                asked=event.asked,
            )
        case DoneEvent(status=status):
            view = replace(view, status=status, pending=None)
        case _:
            pass
    fold.view = view


def decision_of(event: ApprovalRequestedEvent | ClarificationRequestedEvent) -> PendingDecision:
    """The decision a pause event asks for, as the projection holds it."""
    if isinstance(event, ApprovalRequestedEvent):
        return PendingDecision(
            turn_id=event.turn_id,
            request_id=event.request_id,
            kind="approval",
            seq=event.seq,
            tool_call_id=event.tool_call_id,
            tool_name=event.tool_name,
            arguments=event.arguments,
            summary=event.summary,
            approver_role=event.approver_role,
            asked=event.asked,
        )
    return PendingDecision(
        turn_id=event.turn_id,
        request_id=event.request_id,
        kind="clarification",
        seq=event.seq,
        tool_call_id=event.tool_call_id,
        question=event.question,
        choices=event.choices,
        asked=event.asked,
    )


def _asks(view: TurnView, decision: PendingDecision) -> TurnView:
    status: TurnStatus = "awaiting_approval" if decision.kind == "approval" else "awaiting_input"
    return replace(view, status=status, pending=decision, decisions=(*view.decisions, decision))
