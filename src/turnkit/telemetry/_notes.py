"""`TurnNotes`: what the driver and the stages keep about a turn while it runs.

The turn's `Recorder` carries them (`rec.notes`) but never reads them per event: the
transcript and its history, the tool results seen, the pause waited on, the guide messages
presented, and the counts the turn's ending summarizes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from turnkit.audit import AskedTurnPayload
from turnkit.blocks import ToolResultBlock
from turnkit.context._known import KnownHistory
from turnkit.context.prefix import PreviousRequest
from turnkit.context.transcript import TranscriptMessage
from turnkit.ids import StageId, TurnId
from turnkit.pauses import PauseRequest

__all__ = ("ShownAnswer", "TurnNotes")


@dataclass(frozen=True, slots=True, kw_only=True)
class ShownAnswer:
    """An answer a call streamed to the person in full, before its block is kept."""

    stage_id: StageId
    block_id: str
    generation_id: str
    text: str


@dataclass(slots=True, eq=False, kw_only=True)
class TurnNotes:
    """One attempt's notes about its turn, beside the events it records."""

    transcript: list[TranscriptMessage] = field(default_factory=list[TranscriptMessage])
    """The model-facing transcript as of the last finished stage (kept at the end)."""
    history: list[TranscriptMessage] = field(default_factory=list[TranscriptMessage])
    """The transcript earlier turns left, which the turn's own messages follow (never
    changed in place: graph checkpoints leave it out and rejoin it)."""
    base_len: int = 0
    """How many of `transcript`'s messages earlier turns had already stored."""
    known: KnownHistory | None = None
    """`history` after its system message, with what requests derive from it kept."""
    history_replaced: bool = False
    """Compaction or picture release rewrote history this turn (stored whole)."""
    last_request: PreviousRequest | None = None
    """The turn's last reasoning request (the next turn's first is checked against it)."""
    stored_request: tuple[PreviousRequest, PreviousRequest] | None = None
    """The last request as the graph state stored it (`compact`), and as it was."""
    request_text: str = ""
    """The text of the message that opened the turn."""
    bound: bool = False
    """A stage of this attempt took the transcript from the graph's state."""
    reasoning: list[str] = field(default_factory=list[str])
    """Raw reasoning of this attempt's calls: only the thinking summary reads it."""
    results: dict[str, ToolResultBlock] = field(default_factory=dict[str, ToolResultBlock])
    """The turn's tool results seen by this attempt, by call id, in call order."""
    call_arguments: dict[str, dict[str, JsonValue]] = field(
        default_factory=dict[str, dict[str, JsonValue]]
    )
    """The arguments of the tool calls this attempt dispatched, by call id."""
    plugin_tracebacks: set[tuple[str, str]] = field(default_factory=set[tuple[str, str]])
    """(plugin, hook) pairs whose failure this attempt logged with its traceback: a hook
    that fails again (on every event, say) is logged in one line."""
    failed_answers: int = 0
    """Answers this attempt committed that failed the agent's `output_type` check."""
    full_results: dict[str, str] = field(default_factory=dict[str, str])
    """Whole tool results of this turn by tool call id (read by `read_tool_result`)."""
    result_messages: dict[str, TranscriptMessage] = field(
        default_factory=dict[str, TranscriptMessage]
    )
    """The tool messages of this attempt's results by call id: an ending mid-batch keeps
    those that came in (the rest get failed results)."""
    tool_calls: int = 0
    tool_timings: list[tuple[str, float]] = field(default_factory=list[tuple[str, float]])
    context_messages: int = 0
    context_tokens: int = 0
    """Input plus output tokens of the turn's latest call on its own model (tool-loop or
    synthesize): the size of its context. Summary, naming and compaction calls leave it."""
    answer_block_id: str = "answer"
    """The block id of the turn's answer (set by synthesize), for enrichment events."""
    shown_answer: ShownAnswer | None = None
    """The answer the turn's latest answering call streamed in full. Until its
    `message.complete` is staged (synthesize), an ending that cuts the turn (a Stop)
    keeps its text as an interrupted block, as it keeps a call cut mid-stream."""
    answer_kept: bool = False
    """Synthesize is keeping the turn's answer block (an earlier attempt's committed one is
    in the journal): a Stop after it leaves the answer as it is, with no note after it."""
    answer_filtered: bool = False
    """The provider's content filter cut the turn's answer after some text (set by
    synthesize; an attempt that took over after it reads it from the log)."""
    running: list[str] = field(default_factory=list[str])
    """What the turn waits on now, beside the model (`tool 'search'`, a plugin's hook): the
    idle window's error names it when the turn goes quiet there."""
    open_jobs: dict[str, str] = field(default_factory=dict[str, str])
    """job_id -> tool_call_id of jobs dispatched in this attempt and not completed yet: an
    ending that cuts their call short (cancelled, timed out, failed) completes them."""
    pending_pause: PauseRequest | None = None
    """Set while a stage waits on a person; the driver then settles the pause."""
    answered_before: bool = False
    """An earlier attempt already resumed with the person's last answer, so a call they
    approved may have run before that attempt died (set by the driver)."""
    background: set[asyncio.Task[Any]] = field(default_factory=set[asyncio.Task[Any]])
    """Work running beside the turn (the thinking summary); cancelled when it ends."""
    input_seqs: tuple[int, ...] = ()
    """The inputs this turn's requests present (set by the driver)."""
    guide_watermark: int = 0
    """Guide messages up to this input seq were presented to the model."""
    newest_guide_seq: int = 0
    """The newest guide the Store reported at the last commit."""
    requeued: int = 0
    """Guide messages the ending commit re-queued as turns of their own."""
    stopped_asked: tuple[TurnId, ...] = ()
    """The asked agents' turns the ending commit stopped (see `CommitResult`)."""
    asked_spent: dict[str, AskedTurnPayload] = field(default_factory=dict[str, AskedTurnPayload])
    """What each agent the turn asked as a tool spent, by its turn id, as recorded when its
    call ended (read back from the audit by a later attempt: each counts once)."""

    @contextmanager
    def waiting_on(self, what: str) -> Iterator[None]:
        """Name `what` in `running` while it runs, and after, if a deadline cancelled it."""
        self.running.append(what)
        try:
            yield
        except asyncio.CancelledError:
            raise  # kept: the idle window's or the ceiling's error names it
        except BaseException:
            self.running.remove(what)
            raise
        self.running.remove(what)

    @property
    def consumed_input_seq(self) -> int:
        """The highest input seq this turn has presented to the model."""
        return max(self.guide_watermark, *self.input_seqs, 0)
