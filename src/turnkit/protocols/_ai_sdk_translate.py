"""Turnkit events → AI SDK UI message stream chunks: the translator of one assistant message.

A message is one turn. `UIMessageStreamTranslator` opens it with `start`, turns each event
into its chunks (text and reasoning parts inside steps, tool parts, sources, and a
`data-turnkit-*` part for the rest) and closes it with `finish`, whose metadata carries the
turn's status, error code and usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal, assert_never

from pydantic import JsonValue

from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    BudgetPausedEvent,
    CheckpointCreatedEvent,
    ClarificationRequestedEvent,
    CompactionCompletedEvent,
    CompactionStartedEvent,
    DoneEvent,
    ErrorEvent,
    GuardrailEvent,
    HeartbeatEvent,
    InputGuidedEvent,
    JobCompletedEvent,
    JobDispatchedEvent,
    JobProgressEvent,
    MessageCitationsEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    MessageEntitiesEvent,
    MessageSnapshotEvent,
    PluginEmittedEvent,
    PluginSignalEvent,
    ProviderCascadeEvent,
    RunFinishedEvent,
    SessionRenamedEvent,
    StepEndEvent,
    StepStartEvent,
    StreamEvent,
    TasksUpdatedEvent,
    ThinkingCompleteEvent,
    ThinkingDeltaEvent,
    ToolCompletedEvent,
    ToolDeltaEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
    TurnStartedEvent,
    UsageEvent,
)
from turnkit.pauses import call_request_id
from turnkit.protocols._asked import asked_usage

__all__ = ("Chunk", "UIMessageStreamTranslator")

Chunk = dict[str, JsonValue]
"""One UI message stream chunk, as the SDK's `uiMessageChunkSchema` reads it."""

_STOPPED: Final = "the turn was stopped before this call finished"
_UNFINISHED: Final = "the turn ended before this call finished"
_NOT_WRITTEN: Final = "the model failed before it finished writing this call: it never ran"

_FINISH_REASONS: Final[Mapping[str, str]] = {
    "succeeded": "stop",
    "failed": "error",
    "timed_out": "error",
    "cancelled": "other",
    "awaiting_approval": "tool-calls",
    "awaiting_input": "tool-calls",
}
_FINISH_BY_CODE: Final[Mapping[str, str]] = {
    "content-filtered": "content-filter",
    "agent_output_limit_exceeded": "length",
}
"""Failures the SDK has a finish reason of their own for."""


def _event_json(event: StreamEvent) -> JsonValue:
    dumped: JsonValue = event.model_dump(mode="json")
    return dumped


class UIMessageStreamTranslator:
    """turnkit events → UI message stream chunks, for one assistant message (one turn).

    Feed a turn's events in log order to `translate`; `start()` opens the message and
    `finish()` closes it (open blocks, the open step, then `finish`). A step
    (`start-step`/`finish-step`) is one model call: it opens with the call's first
    content and closes at the stage's `step.end`, or, when a text block of that call is
    still open there (the loop's answer completes in `synthesize`), once it completes.
    """

    def __init__(
        self,
        *,
        message_id: str,
        metadata: Mapping[str, JsonValue] | None = None,
        asked: Iterable[str] = (),
    ):
        """`asked`: tool calls whose approval an earlier stream of the message requested."""
        self.message_id = message_id
        self.metadata: dict[str, JsonValue] = {"turnId": message_id, **(metadata or {})}
        self.status: str | None = None
        """The turn's terminal status (`done`), or the pause it stopped at."""
        self.error_code: str | None = None
        self.filtered = False
        """The answer is one the provider's content filter cut after some text."""
        self._step: Literal["closed", "open", "closing"] = "closed"
        self._texts: dict[str, str] = {}
        self._blank: dict[str, str] = {}
        """Text blocks with white space only so far: no part yet (none if nothing follows)."""
        self._stages: dict[str, str] = {}
        self._reasoning: dict[str, str] = {}
        self._ended: set[str] = set()
        self._ended_reasoning: set[str] = set()
        self._tools: set[str] = set()
        self._running: dict[str, None] = {}
        """Tool calls whose part has its input and no output yet, in call order."""
        self._drafts: dict[str, str] = {}
        """Tool calls being written (`tool-input-start` sent, no input yet): their names."""
        self._approved: set[str] = set()
        """Asked calls whose own approval a person granted (their part may end in an error)."""
        self._again: dict[tuple[str, str], str] = {}
        """Open blocks a recovering attempt writes again ("text"/"reasoning", block id): its
        text so far; sent on only past what the client already has."""
        self._asked: set[str] = set(asked)
        """Tool calls with an approval request: only their denial is `tool-output-denied`."""
        self._requests: dict[str, str] = {}
        """Approval requests not answered yet (tool call → request id): sent at the pause."""
        self._handed_denied: set[str] = set()
        """Calls whose asked agent's last handed-over approval a person denied."""
        self._usage: dict[str, JsonValue] | None = None
        self._error: str | None = None
        """The failure's `error` text, until the turn's totals arrive to go before it."""

    def start(self) -> list[Chunk]:
        """The `start` chunk: the message id (the turn id) and its metadata."""
        return [{"type": "start", "messageId": self.message_id, "messageMetadata": self.metadata}]

    def finish(self) -> list[Chunk]:
        """Close what is open and end the message with `finish` (usage in its metadata)."""
        out = [*self._requested(), *self._failure(), *self._close_step()]
        if self.status == "cancelled":
            out = [*self._end_running(_STOPPED), *out, {"type": "abort"}]
        chunk: Chunk = {"type": "finish", "messageMetadata": self._ending()}
        reason = _FINISH_BY_CODE.get(self.error_code or "") or _FINISH_REASONS.get(
            self.status or ""
        )
        if self.filtered and self.status == "succeeded":
            reason = "content-filter"  # the answer is what the filter let through
        if reason is not None:
            chunk["finishReason"] = reason
        return [*out, chunk]

    def _ending(self) -> dict[str, JsonValue]:
        """The metadata the message ends with: status, error code and usage so far."""
        metadata: dict[str, JsonValue] = {"turnId": self.message_id}
        if self.status is not None:
            metadata["status"] = self.status
        if self.error_code is not None:
            metadata["errorCode"] = self.error_code
        if self._usage is not None:
            metadata["usage"] = self._usage
        return metadata

    def translate(self, event: StreamEvent) -> list[Chunk]:  # noqa: C901 - one case per event type
        """The chunks for one event (often none)."""
        match event:
            case TurnStartedEvent() | StepStartEvent() | HeartbeatEvent():
                return []  # `start` stands for the turn; steps open with their content
            case StepEndEvent():
                return self._end_step()
            case MessageDeltaEvent():
                self._stages.setdefault(event.block_id, event.stage_id)
                return self._text(event.block_id, event.text)
            case MessageSnapshotEvent():
                self._stages.setdefault(event.block_id, event.stage_id)
                return self._text_snapshot(event.block_id, event.text)
            case MessageCompleteEvent(block=block):
                self.filtered = self.filtered or (block.is_answer and block.filtered)
                return self._text_end(block.block_id, block.text, answer=block.is_answer)
            case ThinkingDeltaEvent():
                return self._reason(event.block_id, event.text)
            case ThinkingCompleteEvent():
                return self._reason_end(event.block.block_id, event.block.summary)
            case ToolDeltaEvent():
                if event.tool_name is None:
                    return []
                return self._tool_input_start(event.tool_call_id, event.tool_name)
            case ToolStartedEvent():
                return self._tool_started(event)
            case ToolCompletedEvent() | ToolFailedEvent():
                return [self._tool_output(event)]
            case ApprovalRequestedEvent() | ClarificationRequestedEvent():
                return self._paused(event)
            case MessageCitationsEvent():
                return [*self._sources(event), self._data(event)]
            case UsageEvent():
                return self._counted(event)
            case RunFinishedEvent():  # after a failure's `error`: its usage goes with it
                return [*self._counted(event), *self._failure()]
            case ProviderCascadeEvent():
                return [*self._abandon(event.stage_id), self._data(event)]
            case TurnRecoveringEvent():  # the new attempt writes its open blocks again
                self._again = {("text", b): "" for b in self._texts}
                self._blank.clear()  # not sent: written again from their start
                self._again.update({("reasoning", b): "" for b in self._reasoning})
                return [self._data(event)]
            case ErrorEvent():
                self.error_code = event.code
                self.status = "timed_out" if event.code == "deadline-exceeded" else "failed"
                self._error = f"{event.message} ({event.code})"
                return []  # sent with the turn's totals, which `run.finished` brings next
            case DoneEvent():
                failure = self._failure()  # an ending with no `run.finished` (a sweep's)
                self.status, self.error_code = event.status, event.error_code or self.error_code
                return failure  # `finish` carries the rest
            case TasksUpdatedEvent():
                return [self._data(event, part_id="tasks")]  # the newest list replaces the last
            case JobProgressEvent():
                return [self._data(event, part_id=event.job_id, transient=True)]
            case CompactionStartedEvent() | PluginSignalEvent():
                return [self._data(event, transient=True)]
            case (
                InputGuidedEvent() | MessageEntitiesEvent() | JobDispatchedEvent()
                | JobCompletedEvent() | GuardrailEvent() | CompactionCompletedEvent()
                | CheckpointCreatedEvent() | ToolInDoubtEvent()
                | PluginEmittedEvent() | SessionRenamedEvent()
                | BudgetPausedEvent()  # the stream stays open: the turn resumes by itself
            ):  # fmt: skip
                return [self._data(event)]
            case ApprovalAnsweredEvent():  # a denial is also `tool-output-denied`
                self._note_handed_answer(event)
                if self._requests.get(event.tool_call_id) == event.request_id:
                    del self._requests[event.tool_call_id]  # answered: the part never asks
                    if self.status == "awaiting_approval" and not self._requests:
                        self.status = None
                return [self._data(event)]
            case _:
                assert_never(event)

    # steps ─────────────────────────────────────────────────────────────────────────────

    def _open_step(self, block_id: str | None = None, *, summary: bool = False) -> list[Chunk]:
        """Open a step for new content (a block of an open call stays in its step).

        A thinking summary (`summary`) written while the answer's text waits for its
        `message.complete` joins that call's step, so the answer's part keeps its end.
        """
        if block_id is not None and (block_id in self._texts or block_id in self._reasoning):
            return []
        if self._step == "open":
            return []
        if self._step == "closing" and summary:
            self._step = "open"
            return []
        out = self._close_step()
        self._step = "open"
        return [*out, {"type": "start-step"}]

    def _close_step(self) -> list[Chunk]:
        out: list[Chunk] = [{"type": "text-end", "id": b} for b in self._texts]
        out += [{"type": "reasoning-end", "id": b} for b in self._reasoning]
        self._ended.update(self._texts)
        self._ended_reasoning.update(self._reasoning)
        self._texts.clear()
        self._reasoning.clear()
        if self._step != "closed":
            out.append({"type": "finish-step"})
            self._step = "closed"
        return out

    def _end_step(self) -> list[Chunk]:
        if self._step != "open":
            return []
        if self._texts or self._reasoning:
            self._step = "closing"  # the call's text completes in the next stage
            return []
        return self._close_step()

    def _abandon(self, stage_id: str) -> list[Chunk]:
        """End the text blocks of a call that failed over: the next rung writes new ones."""
        out: list[Chunk] = []
        for block_id in [b for b in self._blank if self._stages.get(b) == stage_id]:
            del self._blank[block_id]
        for block_id in [b for b in self._texts if self._stages.get(b) == stage_id]:
            del self._texts[block_id]
            self._again.pop(("text", block_id), None)
            self._ended.add(block_id)
            # Left on the part, for a client to leave out the text the next rung writes again.
            discarded: Chunk = {"turnkit": {"discarded": True}}
            out.append({"type": "text-end", "id": block_id, "providerMetadata": discarded})
        return [*out, *self._end_drafts(), *self._block_ended()]

    def _end_drafts(self) -> list[Chunk]:
        """End the parts of calls a model began and never finished writing (it failed)."""
        drafts, self._drafts = self._drafts, {}
        return [
            {
                "type": "tool-input-error",
                "toolCallId": call,
                "toolName": name,
                "input": {},
                "errorText": _NOT_WRITTEN,
            }
            for call, name in drafts.items()
        ]

    def _block_ended(self) -> list[Chunk]:
        if self._step == "closing" and not self._texts and not self._reasoning:
            return self._close_step()
        return []

    # text and reasoning ────────────────────────────────────────────────────────────────

    def _written_again(self, kind: str, block_id: str, text: str) -> str:
        """The part of a delta the client lacks, for a block a recovering attempt rewrites.

        Nothing while the new attempt catches up with what was sent, or when it writes
        something else (the block's `complete` keeps what the client has then).
        """
        so_far = (self._texts if kind == "text" else self._reasoning).get(block_id, "")
        again = self._again[kind, block_id] + text
        if len(again) <= len(so_far) or not again.startswith(so_far):
            self._again[kind, block_id] = again
            return ""
        del self._again[kind, block_id]
        return again[len(so_far) :]

    def _text(self, block_id: str, text: str) -> list[Chunk]:
        if ("text", block_id) in self._again:
            text = self._written_again("text", block_id, text)
        if block_id in self._ended or not text:
            return []
        out: list[Chunk] = []
        if block_id not in self._texts:
            text = self._blank.pop(block_id, "") + text
            if not text.strip():  # no part of white space alone
                self._blank[block_id] = text
                return []
            out += self._open_step(block_id)
            out.append({"type": "text-start", "id": block_id})
            self._texts[block_id] = ""
        self._texts[block_id] += text
        out.append({"type": "text-delta", "id": block_id, "delta": text})
        return out

    def _text_snapshot(self, block_id: str, text: str) -> list[Chunk]:
        self._blank.pop(block_id, None)  # the snapshot has it
        so_far = self._texts.get(block_id, "")
        if not text.startswith(so_far):
            return []  # a part cannot be rewritten: keep what the client has
        return self._text(block_id, text[len(so_far) :])

    def _text_end(self, block_id: str, text: str, *, answer: bool = False) -> list[Chunk]:
        self._again.pop(("text", block_id), None)
        if block_id in self._ended:
            return []
        self._blank.pop(block_id, None)  # the whole text has it
        so_far = self._texts.get(block_id, "")
        out = self._text(block_id, text[len(so_far) :] if text.startswith(so_far) else "")
        if block_id not in self._texts:
            self._blank.pop(block_id, None)
            self._ended.add(block_id)  # empty, or white space alone: nothing to show
            return out
        del self._texts[block_id]
        self._ended.add(block_id)
        end: Chunk = {"type": "text-end", "id": block_id}
        if answer:  # which part is the answer (the rest is narration, or a failed answer)
            end["providerMetadata"] = {"turnkit": {"answer": True}}
        return [*out, end, *self._block_ended()]

    def _reason(self, block_id: str, text: str) -> list[Chunk]:
        if ("reasoning", block_id) in self._again:
            text = self._written_again("reasoning", block_id, text)
        if block_id in self._ended_reasoning or not text:
            return []
        out: list[Chunk] = []
        if block_id not in self._reasoning:
            out += self._open_step(block_id, summary=True)
            out.append({"type": "reasoning-start", "id": block_id})
            self._reasoning[block_id] = ""
        self._reasoning[block_id] += text
        out.append({"type": "reasoning-delta", "id": block_id, "delta": text})
        return out

    def _reason_end(self, block_id: str, text: str) -> list[Chunk]:
        self._again.pop(("reasoning", block_id), None)
        if block_id in self._ended_reasoning:
            return []
        so_far = self._reasoning.get(block_id, "")
        out = self._reason(block_id, text[len(so_far) :] if text.startswith(so_far) else "")
        self._ended_reasoning.add(block_id)
        if self._reasoning.pop(block_id, None) is None:
            return out
        return [*out, {"type": "reasoning-end", "id": block_id}, *self._block_ended()]

    # tools ─────────────────────────────────────────────────────────────────────────────

    def _tool_input_start(self, tool_call_id: str, tool_name: str) -> list[Chunk]:
        if tool_call_id in self._tools:
            return []
        self._tools.add(tool_call_id)
        self._drafts[tool_call_id] = tool_name
        start: Chunk = {
            "type": "tool-input-start",
            "toolCallId": tool_call_id,
            "toolName": tool_name,
        }
        return [*self._open_step(), start]

    def _tool_started(self, event: ToolStartedEvent) -> list[Chunk]:
        block = event.block
        out = self._tool_input_start(block.tool_call_id, block.tool_name)
        self._drafts.pop(block.tool_call_id, None)
        chunk: Chunk = {
            "type": "tool-input-available",
            "toolCallId": block.tool_call_id,
            "toolName": block.tool_name,
            "input": dict(block.arguments),
        }
        if event.arguments_error is not None:
            chunk = {**chunk, "type": "tool-input-error", "errorText": event.arguments_error}
        else:
            self._running[block.tool_call_id] = None
        return [*out, chunk]

    def _tool_output(self, event: ToolCompletedEvent | ToolFailedEvent) -> Chunk:
        """The end of a tool part: its output, its denial, or its error."""
        self._running.pop(event.tool_call_id, None)
        if isinstance(event, ToolCompletedEvent):
            if event.tool_call_id in self._handed_denied and event.tool_call_id in self._asked:
                # The person denied what the agent this call asked wanted to do: the SDK's
                # part of a denied approval ends denied (the agent's answer reached the model).
                return {"type": "tool-output-denied", "toolCallId": event.tool_call_id}
            return {
                "type": "tool-output-available",
                "toolCallId": event.tool_call_id,
                "output": event.result.output,
            }
        if event.code == "tool-denied" and event.tool_call_id in self._asked:
            return {"type": "tool-output-denied", "toolCallId": event.tool_call_id}
        # Any other denial (a plugin's) had no approval, which the SDK's denied part needs.
        error = event.result.error or event.code
        return {"type": "tool-output-error", "toolCallId": event.tool_call_id, "errorText": error}

    # pauses, usage, sources, data ──────────────────────────────────────────────────────

    def _paused(self, event: ApprovalRequestedEvent | ClarificationRequestedEvent) -> list[Chunk]:
        """A pause: an approval is the SDK's own request part; a question is data."""
        if isinstance(event, ClarificationRequestedEvent):
            self.status = "awaiting_input"
            return [self._data(event)]
        self.status = "awaiting_approval"
        self._requests[event.tool_call_id] = event.request_id
        return [self._data(event)]

    def _requested(self) -> list[Chunk]:
        """The `tool-approval-request` of each request the turn still waits for.

        Sent only once the stream ends at the pause: a request answered meanwhile (a
        rebuilt message replays its answer) would leave its part asking for an answer
        already given, and the SDK's answered parts carry the person's decision, which
        no chunk can set.
        """
        requests, self._requests = self._requests, {}
        if self.status != "awaiting_approval":
            return []  # the turn ended first: its call's part ends as unfinished
        self._asked.update(requests)
        return [
            {"type": "tool-approval-request", "approvalId": request_id, "toolCallId": call}
            for call, request_id in requests.items()
        ]

    def _note_handed_answer(self, event: ApprovalAnsweredEvent) -> None:
        """Keep whether a request an asked agent handed over on this call was last denied.

        A call's own approval has the request id derived from the turn and the call alone.
        """
        if event.request_id == call_request_id(event.turn_id, event.tool_call_id):
            if event.decision == "approve":
                self._approved.add(event.tool_call_id)
            return
        if event.decision == "deny":
            self._handed_denied.add(event.tool_call_id)
        else:
            self._handed_denied.discard(event.tool_call_id)

    def _failure(self) -> list[Chunk]:
        """The failure's `error`, once, after the metadata `finish` would carry.

        The SDK stops reading at `error`: status, error code and usage so far go first.
        """
        if self._error is None:
            return []
        text, self._error = self._error, None
        ending: Chunk = {"type": "message-metadata", "messageMetadata": self._ending()}
        # Its open text and reasoning parts end here: nothing after `error` reaches them.
        closed = [*self._end_running(_UNFINISHED), *self._close_step()]
        return [*closed, ending, {"type": "error", "errorText": text}]

    def _end_running(self, why: str) -> list[Chunk]:
        """End the parts of calls that will never have a result (the turn ended first).

        Without this a stopped or failed turn's message keeps them `input-available` (or
        `approval-requested`), which a page draws as still running (or still to answer).
        """
        running, self._running = self._running, {}
        # A call still waiting for its approval keeps its request: the SDK's error part
        # needs a granted approval (and its denied part a denial nobody gave).
        unanswered = self._asked - self._approved
        ended: list[Chunk] = [
            {"type": "tool-output-error", "toolCallId": call, "errorText": why}
            for call in running
            if call not in unanswered
        ]
        return [*self._end_drafts(), *ended]

    def _counted(self, event: UsageEvent | RunFinishedEvent) -> list[Chunk]:
        """The turn's totals so far: kept for `finish`, and sent as data."""
        self._usage = {
            "modelCalls": event.model_calls,
            "inputTokens": event.input_tokens,
            "outputTokens": event.output_tokens,
            "cachedTokens": event.cached_tokens,
            "costUsd": event.cost_usd,
        }
        if event.asked is not None:  # what the agents it asked as tools spent, apart
            self._usage["asked"] = asked_usage(event.asked)
        return [self._data(event)]

    def _sources(self, event: MessageCitationsEvent) -> list[Chunk]:
        out: list[Chunk] = []
        for index, citation in enumerate(event.citations):
            if citation.url is None:
                continue
            source: Chunk = {
                "type": "source-url",
                "sourceId": f"{event.block_id}:{index}",
                "url": citation.url,
            }
            if citation.title is not None:
                source["title"] = citation.title
            out.append(source)
        return out

    def _data(
        self, event: StreamEvent, *, part_id: str | None = None, transient: bool = False
    ) -> Chunk:
        chunk: Chunk = {"type": f"data-turnkit-{event.type}", "data": _event_json(event)}
        if part_id is not None:
            chunk["id"] = part_id
        if transient:
            chunk["transient"] = True
        return chunk
