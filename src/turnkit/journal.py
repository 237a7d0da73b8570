"""`Journal`: what a turn's committed log already holds, so a retried attempt repeats nothing.

Built from the Store's events when an attempt starts. The Recorder skips events whose
dedupe key is already committed; stages reuse a committed model response (by its
`generation_id`) instead of calling the model again, and a committed tool result instead
of running the tool again. Ids are derived from the log, so every attempt derives the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from turnkit.blocks import ToolResultBlock
from turnkit.events import (
    ApprovalRequestedEvent,
    ClarificationRequestedEvent,
    DurableEvent,
    InputGuidedEvent,
    MessageCompleteEvent,
    StreamEvent,
    ThinkingCompleteEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
)

__all__ = ("CommittedCall", "CommittedGeneration", "CommittedGuide", "Journal", "dedupe_key")

_BY_FIELD = {
    "input.guided": "input_seq",
    "job.dispatched": "job_id",
    "job.completed": "job_id",
    "turn.recovering": "attempt",
    "tool.in_doubt": "tool_call_id",
    "approval.answered": "request_id",
}
"""Events that occur once per value of one field."""
_ONCE = frozenset({"turn.started", "usage", "checkpoint.created", "run.finished", "error", "done"})


def dedupe_key(event_type: str, fields: Mapping[str, Any]) -> str | None:
    """The identity of an event within its turn, or None if every occurrence is new."""
    match event_type:
        case "step.start" | "step.end":
            return f"{event_type}:{fields['step']}:{fields.get('iteration')}"
        case "tool.started":
            return f"tool.started:{fields['block'].tool_call_id}"
        case "tool.completed" | "tool.failed":
            return f"tool.result:{fields['tool_call_id']}"
        case "message.complete" | "thinking.complete":
            generation = fields.get("generation_id")
            return f"{event_type}:{generation}" if generation else None
        case "message.citations" | "message.entities":
            items = fields.get("citations") or fields.get("entities") or ()
            digest = hashlib.sha256(repr(tuple(items)).encode()).hexdigest()[:16]
            return f"{event_type}:{fields.get('block_id')}:{digest}"
        case "approval.requested" | "clarification.requested" | "budget.paused":
            return f"pause:{fields['request_id']}"
        case _ if event_type in _BY_FIELD:
            return f"{event_type}:{fields[_BY_FIELD[event_type]]}"
        case "guardrail":
            # Per call (a tool result's) and per guide (each message joining is checked).
            where = f"{fields.get('tool_call_id')}:{fields.get('input_seq')}:{fields['subject']}"
            return f"guardrail:{fields['checkpoint']}:{where}:{fields['kind']}:{fields['action']}"
        case "session.renamed":
            return f"session.renamed:{fields['source']}"
        case "tasks.updated":
            return f"tasks.updated:{fields.get('tool_call_id') or 'plan'}"
        case _ if event_type in _ONCE:
            return event_type
        case _:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedCall:
    """A tool call recorded by `tool.started`."""

    tool_call_id: str
    name: str
    arguments: dict[str, Any]
    arguments_error: str | None


@dataclass(slots=True, kw_only=True)
class CommittedGeneration:
    """A model response whose effects are already in the log."""

    text: str = ""
    block_id: str = ""
    is_answer: bool = False
    """Its text was committed as the turn's answer (not as narration)."""
    filtered: bool = False
    """The provider's content filter cut its text (`TextBlock.filtered`)."""
    thinking: str = ""
    calls: list[CommittedCall] = field(default_factory=list[CommittedCall])
    first_seq: int = 0
    """The seq of its first committed event: what was committed before, its request held."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedGuide:
    """A guide message a request presented, recorded by `input.guided`."""

    seq: int
    input_seq: int
    content: str


@dataclass(slots=True)
class Journal:
    """The committed log of one turn, indexed for an attempt that resumes it."""

    keys: set[str] = field(default_factory=set[str])
    generations: dict[str, CommittedGeneration] = field(
        default_factory=dict[str, CommittedGeneration]
    )
    results: dict[str, tuple[ToolResultBlock, str | None]] = field(
        default_factory=dict[str, tuple[ToolResultBlock, str | None]]
    )
    """tool_call_id → (result, error code or None)."""
    guides: list[CommittedGuide] = field(default_factory=list[CommittedGuide])
    """In the order they were presented."""
    answer_problems: dict[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])
    """generation_id → what its committed `outputCheck` found (from the audit rows)."""
    asked: dict[str, ApprovalRequestedEvent | ClarificationRequestedEvent] = field(
        default_factory=dict[str, ApprovalRequestedEvent | ClarificationRequestedEvent]
    )
    """request_id → a pause an agent asked as a tool handed to this turn."""

    @classmethod
    def of(cls, events: Iterable[StreamEvent]) -> Journal:
        """Index committed events."""
        journal = cls()
        for event in events:
            if not isinstance(event, DurableEvent):
                continue
            key = dedupe_key(event.type, dict(event))
            if key is not None:
                journal.keys.add(key)
            journal._index(event)
        return journal

    @property
    def answer_kept(self) -> bool:
        """Whether the log holds the turn's answer (whichever stage wrote it)."""
        return any(g.is_answer for g in self.generations.values())

    @property
    def answer_filtered(self) -> bool:
        """Whether the answer committed in the log is one the content filter cut."""
        return any(g.is_answer and g.filtered for g in self.generations.values())

    def _index(self, event: DurableEvent) -> None:
        match event:
            case MessageCompleteEvent(generation_id=str(gen), block=block):
                committed = self._generation(gen, event.seq)
                committed.text, committed.block_id = block.text, block.block_id
                committed.is_answer, committed.filtered = block.is_answer, block.filtered
            case ThinkingCompleteEvent(generation_id=str(gen), block=block):
                self._generation(gen, event.seq).thinking = block.summary
            case ToolStartedEvent(generation_id=str(gen), block=block):
                self._generation(gen, event.seq).calls.append(
                    CommittedCall(
                        tool_call_id=block.tool_call_id,
                        name=block.tool_name,
                        arguments=dict(block.arguments),
                        arguments_error=event.arguments_error,
                    )
                )
            case ToolCompletedEvent(tool_call_id=call_id, result=result):
                self.results[call_id] = (result, None)
            case ToolFailedEvent(tool_call_id=call_id, result=result, code=code):
                self.results[call_id] = (result, code)
            case ApprovalRequestedEvent() | ClarificationRequestedEvent() if event.asked:
                self.asked[event.request_id] = event
            case InputGuidedEvent(input_seq=input_seq, content=content):
                self.guides.append(
                    CommittedGuide(seq=event.seq, input_seq=input_seq, content=content)
                )
            case _:
                pass

    def _generation(self, generation_id: str, seq: int) -> CommittedGeneration:
        committed = self.generations.setdefault(generation_id, CommittedGeneration())
        if not committed.first_seq:
            committed.first_seq = seq
        return committed

    def generation(self, generation_id: str) -> CommittedGeneration | None:
        """A committed response, if this generation's effects reached the log."""
        return self.generations.get(generation_id)

    def guides_before(self, generation: CommittedGeneration) -> list[CommittedGuide]:
        """The guides committed before `generation`'s answer.

        What its request presented, with those of the turn's earlier requests.
        """
        return [g for g in self.guides if g.seq < generation.first_seq]
