"""The Vercel AI SDK UI message stream (v1) over turnkit turns.

```python
app = FastAPI()
app.include_router(create_ai_sdk_router(runtime))  # POST /api/chat, GET /api/chat/{id}/stream
install_problem_handlers(app)
```

A chat (`id`) is a turnkit session and each assistant message is one turn: its id is the
turn id. `UIMessageStreamTranslator` turns a turn's events into the SDK's chunks; the
routes feed it from `SessionRuntime.reader()`, answer tool approvals through the SDK's own
approval parts, and rebuild a running turn's message for `resumeStream`.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Annotated, Any, Final, Literal, assert_never, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

try:
    from fastapi import APIRouter, Depends, Path, Response
    from sse_starlette import EventSourceResponse
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        'the AI SDK route needs the "fastapi" extra: pip install "turnkit[fastapi]"'
    ) from exc

from turnkit.blocks import ImagePart, TextPart
from turnkit.errors import (
    ConfigurationError,
    InvalidInputError,
    PauseAnsweredError,
    SessionNotFoundError,
    TurnkitError,
)
from turnkit.events import (
    ApprovalRequestedEvent,
    BudgetPausedEvent,
    CheckpointCreatedEvent,
    ClarificationRequestedEvent,
    CompactionCompletedEvent,
    CompactionStartedEvent,
    DoneEvent,
    DurableEvent,
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
    decode_event,
)
from turnkit.ids import SessionId, TurnId, derive_id
from turnkit.pauses import CLARIFY_TOOL, Answer, Approve, Deny, Resolution
from turnkit.projection import PendingDecision
from turnkit.runtime import SessionRuntime
from turnkit.runtime.deps import NO_DEPS
from turnkit.runtime.reader import KEEPALIVE, set_once_sent
from turnkit.store import TurnRecord

__all__ = (
    "STREAM_HEADERS",
    "ChatRequest",
    "UIMessage",
    "UIMessageStreamTranslator",
    "create_ai_sdk_router",
)

log = logging.getLogger("turnkit.protocols")

Chunk = dict[str, JsonValue]
"""One UI message stream chunk, as the SDK's `uiMessageChunkSchema` reads it."""
Principal = str | None
AuthDependency = Callable[..., Principal | Awaitable[Principal]]

STREAM_HEADERS: Final[Mapping[str, str]] = {
    "x-vercel-ai-ui-message-stream": "v1",
    "Cache-Control": "no-store",
    "x-accel-buffering": "no",  # nginx: pass chunks on as they come
}
TURN_ID_HEADER: Final = "X-Turn-Id"
_NO_PING_S: Final = 10**9
_DONE_LINE: Final = b"data: [DONE]\n\n"
_KEEPALIVE_LINE: Final = b": keep-alive\n"
_PAUSED: Final = frozenset({"awaiting_approval", "awaiting_input"})
_FINISH_REASONS: Final[Mapping[str, str]] = {
    "succeeded": "stop",
    "failed": "error",
    "timed_out": "error",
    "cancelled": "other",
    "awaiting_approval": "tool-calls",
    "awaiting_input": "tool-calls",
}


# ── request bodies ─────────────────────────────────────────────────────────────────────


class UIMessage(BaseModel):
    """One `UIMessage` of the SDK's request: `parts` are kept as the client sent them."""

    model_config = ConfigDict(extra="ignore")  # the SDK adds fields over versions
    id: str = Field(max_length=256)
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, JsonValue]] = Field(max_length=10_000)


class ChatRequest(BaseModel):
    """The body `DefaultChatTransport.sendMessages` posts (extra `body` fields are ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    id: str = Field(min_length=1, max_length=128, description="The chat id: a session id.")
    messages: list[UIMessage] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    message_id: str | None = Field(default=None, alias="messageId")


# ── events → chunks ────────────────────────────────────────────────────────────────────


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

    def __init__(self, *, message_id: str, metadata: Mapping[str, JsonValue] | None = None):
        self.message_id = message_id
        self.metadata: dict[str, JsonValue] = {"turnId": message_id, **(metadata or {})}
        self.status: str | None = None
        """The turn's terminal status (`done`), or the pause it stopped at."""
        self.error_code: str | None = None
        self._step: Literal["closed", "open", "closing"] = "closed"
        self._texts: dict[str, str] = {}
        self._stages: dict[str, str] = {}
        self._reasoning: dict[str, str] = {}
        self._ended: set[str] = set()
        self._ended_reasoning: set[str] = set()
        self._tools: set[str] = set()
        self._usage: dict[str, JsonValue] | None = None

    def start(self) -> list[Chunk]:
        """The `start` chunk: the message id (the turn id) and its metadata."""
        return [{"type": "start", "messageId": self.message_id, "messageMetadata": self.metadata}]

    def finish(self) -> list[Chunk]:
        """Close what is open and end the message with `finish` (usage in its metadata)."""
        out = self._close_step()
        if self.status == "cancelled":
            out.append({"type": "abort", "reason": "cancelled"})
        metadata: dict[str, JsonValue] = {"turnId": self.message_id}
        if self.status is not None:
            metadata["status"] = self.status
        if self.error_code is not None:
            metadata["errorCode"] = self.error_code
        if self._usage is not None:
            metadata["usage"] = self._usage
        chunk: Chunk = {"type": "finish", "messageMetadata": metadata}
        reason = _FINISH_REASONS.get(self.status or "")
        if reason is not None:
            chunk["finishReason"] = reason
        return [*out, chunk]

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
            case MessageCompleteEvent():
                return self._text_end(event.block.block_id, event.block.text)
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
            case ToolCompletedEvent():
                return [
                    {
                        "type": "tool-output-available",
                        "toolCallId": event.tool_call_id,
                        "output": event.result.output,
                    }
                ]
            case ToolFailedEvent():
                if event.code == "tool-denied":
                    return [{"type": "tool-output-denied", "toolCallId": event.tool_call_id}]
                error = event.result.error or event.code
                return [
                    {
                        "type": "tool-output-error",
                        "toolCallId": event.tool_call_id,
                        "errorText": error,
                    }
                ]
            case ApprovalRequestedEvent():
                self.status = "awaiting_approval"
                request: Chunk = {
                    "type": "tool-approval-request",
                    "approvalId": event.request_id,
                    "toolCallId": event.tool_call_id,
                }
                return [request, self._data(event)]
            case ClarificationRequestedEvent():
                self.status = "awaiting_input"
                return [self._data(event)]
            case MessageCitationsEvent():
                return [*self._sources(event), self._data(event)]
            case UsageEvent() | RunFinishedEvent():
                self._usage = {
                    "modelCalls": event.model_calls,
                    "inputTokens": event.input_tokens,
                    "outputTokens": event.output_tokens,
                    "cachedTokens": event.cached_tokens,
                    "costUsd": event.cost_usd,
                }
                return [self._data(event)]
            case ProviderCascadeEvent():
                return [*self._abandon(event.stage_id), self._data(event)]
            case ErrorEvent():
                self.error_code = event.code
                return [{"type": "error", "errorText": f"{event.message} ({event.code})"}]
            case DoneEvent():
                self.status, self.error_code = event.status, event.error_code or self.error_code
                return []  # `finish` carries it
            case TasksUpdatedEvent():
                return [self._data(event, part_id="tasks")]  # the newest list replaces the last
            case JobProgressEvent():
                return [self._data(event, part_id=event.job_id, transient=True)]
            case CompactionStartedEvent() | PluginSignalEvent():
                return [self._data(event, transient=True)]
            case (
                InputGuidedEvent()
                | MessageEntitiesEvent()
                | JobDispatchedEvent()
                | JobCompletedEvent()
                | GuardrailEvent()
                | CompactionCompletedEvent()
                | CheckpointCreatedEvent()
                | TurnRecoveringEvent()
                | ToolInDoubtEvent()
                | PluginEmittedEvent()
                | SessionRenamedEvent()
                | BudgetPausedEvent()  # the stream stays open: the turn resumes by itself
            ):
                return [self._data(event)]
            case _:
                assert_never(event)

    # steps ─────────────────────────────────────────────────────────────────────────────

    def _open_step(self, block_id: str | None = None) -> list[Chunk]:
        """Open a step for new content (a block of an open call stays in its step)."""
        if block_id is not None and (block_id in self._texts or block_id in self._reasoning):
            return []
        if self._step == "open":
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
        for block_id in [b for b in self._texts if self._stages.get(b) == stage_id]:
            del self._texts[block_id]
            self._ended.add(block_id)
            out.append({"type": "text-end", "id": block_id})
        return [*out, *self._block_ended()]

    def _block_ended(self) -> list[Chunk]:
        if self._step == "closing" and not self._texts and not self._reasoning:
            return self._close_step()
        return []

    # text and reasoning ────────────────────────────────────────────────────────────────

    def _text(self, block_id: str, text: str) -> list[Chunk]:
        if block_id in self._ended or not text:
            return []
        out: list[Chunk] = []
        if block_id not in self._texts:
            out += self._open_step(block_id)
            out.append({"type": "text-start", "id": block_id})
            self._texts[block_id] = ""
        self._texts[block_id] += text
        out.append({"type": "text-delta", "id": block_id, "delta": text})
        return out

    def _text_snapshot(self, block_id: str, text: str) -> list[Chunk]:
        so_far = self._texts.get(block_id, "")
        if not text.startswith(so_far):
            return []  # a part cannot be rewritten: keep what the client has
        return self._text(block_id, text[len(so_far) :])

    def _text_end(self, block_id: str, text: str) -> list[Chunk]:
        if block_id in self._ended:
            return []
        so_far = self._texts.get(block_id, "")
        out = self._text(block_id, text[len(so_far) :] if text.startswith(so_far) else "")
        if block_id not in self._texts:
            self._ended.add(block_id)  # empty: nothing to show
            return out
        del self._texts[block_id]
        self._ended.add(block_id)
        return [*out, {"type": "text-end", "id": block_id}, *self._block_ended()]

    def _reason(self, block_id: str, text: str) -> list[Chunk]:
        if block_id in self._ended_reasoning or not text:
            return []
        out: list[Chunk] = []
        if block_id not in self._reasoning:
            out += self._open_step(block_id)
            out.append({"type": "reasoning-start", "id": block_id})
            self._reasoning[block_id] = ""
        self._reasoning[block_id] += text
        out.append({"type": "reasoning-delta", "id": block_id, "delta": text})
        return out

    def _reason_end(self, block_id: str, text: str) -> list[Chunk]:
        if block_id in self._ended_reasoning:
            return []
        so_far = self._reasoning.get(block_id, "")
        out = self._reason(block_id, text[len(so_far) :] if text.startswith(so_far) else "")
        self._ended_reasoning.add(block_id)
        if self._reasoning.pop(block_id, None) is None:
            return out
        return [*out, {"type": "reasoning-end", "id": block_id}, *self._block_ended()]

    # tools, sources, data ──────────────────────────────────────────────────────────────

    def _tool_input_start(self, tool_call_id: str, tool_name: str) -> list[Chunk]:
        if tool_call_id in self._tools:
            return []
        self._tools.add(tool_call_id)
        start: Chunk = {
            "type": "tool-input-start",
            "toolCallId": tool_call_id,
            "toolName": tool_name,
        }
        return [*self._open_step(), start]

    def _tool_started(self, event: ToolStartedEvent) -> list[Chunk]:
        block = event.block
        out = self._tool_input_start(block.tool_call_id, block.tool_name)
        chunk: Chunk = {
            "type": "tool-input-available",
            "toolCallId": block.tool_call_id,
            "toolName": block.tool_name,
            "input": dict(block.arguments),
        }
        if event.arguments_error is not None:
            chunk = {**chunk, "type": "tool-input-error", "errorText": event.arguments_error}
        return [*out, chunk]

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


# ── the routes ─────────────────────────────────────────────────────────────────────────


async def _anonymous() -> Principal:
    return None


async def _no_deps() -> Any:
    return NO_DEPS


def _line(chunk: Chunk) -> bytes:
    return (
        b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    )


_STRUCTURAL: Final = frozenset(
    {
        "start", "finish", "start-step", "finish-step", "text-start", "text-end",
        "reasoning-start", "reasoning-end", "tool-input-start", "tool-input-available",
        "tool-approval-request", "error",
    }
)  # fmt: skip
"""Chunks a client's state machine needs: sent whatever their size."""


def _bounded(chunk: Chunk, max_bytes: int, turn_id: str) -> bytes:
    """`chunk`'s line, or a transient stand-in when it would pass `max_bytes`."""
    line = _line(chunk)
    kind = chunk.get("type")
    if len(line) <= max_bytes or kind in _STRUCTURAL:
        return line
    # Losing one chunk costs less than losing a turn that has run for minutes.
    log.warning(
        "dropped an oversized AI SDK chunk of turn %s (%s, %d bytes > %d)",
        turn_id, kind, len(line), max_bytes,
    )  # fmt: skip
    if kind == "tool-output-available":  # the tool part ends, saying why it has no output
        too_large = f"the result ({len(line)} bytes) was too large to stream"
        return _line(
            {"type": "tool-output-error", "toolCallId": chunk["toolCallId"], "errorText": too_large}
        )
    return _line(
        {
            "type": "data-turnkit-frame-dropped",
            "data": {"type": kind, "bytes": len(line)},
            "transient": True,
        }
    )


def _content(message: UIMessage) -> str | list[TextPart | ImagePart]:
    """The turn's content: the message's text parts, and its pictures (`file` parts)."""
    texts: list[str] = []
    pictures: list[ImagePart] = []
    for part in message.parts:
        kind, text = part.get("type"), part.get("text")
        if kind == "text" and isinstance(text, str):
            texts.append(text)
        elif kind == "file":
            url, media_type = part.get("url"), part.get("mediaType")
            if not (isinstance(url, str) and isinstance(media_type, str)):
                raise InvalidInputError("a `file` part needs a `url` and a `mediaType`")
            if not media_type.startswith("image/"):
                raise InvalidInputError(
                    f"only pictures can be attached, not {media_type!r}", media_type=media_type
                )
            pictures.append(ImagePart(url=url, media_type=media_type))
    text = "\n".join(texts)
    if not pictures:
        return text
    return [TextPart(text=text), *pictures]


def _pending_answer(
    record: TurnRecord, pause: PendingDecision, message: UIMessage
) -> tuple[str, Resolution]:
    """The answer the assistant message carries to the turn's open pause."""
    tools = [p for p in message.parts if str(p.get("type", "")).startswith(("tool-", "dynamic-"))]
    if pause.kind == "approval":
        for part in tools:
            approval = part.get("approval")
            if part.get("state") != "approval-responded" or not isinstance(approval, dict):
                continue
            if approval.get("id") != pause.request_id:
                continue
            reason = approval.get("reason")
            note = reason if isinstance(reason, str) else None
            decision = Approve(note=note) if approval.get("approved") is True else Deny(note=note)
            return pause.request_id, decision
        raise InvalidInputError(
            f"the turn waits for approval {pause.request_id!r}: answer it with "
            "addToolApprovalResponse before sending",
            request_id=pause.request_id,
        )
    for part in tools:
        call_id = part.get("toolCallId")
        if part.get("state") != "output-available" or not isinstance(call_id, str):
            continue
        if derive_id("req", record.turn_id, call_id) != pause.request_id:
            continue
        output = part.get("output")
        if isinstance(output, dict) and isinstance(output.get("answer"), str):
            output = output["answer"]
        return pause.request_id, Answer(
            text=output if isinstance(output, str) else json.dumps(output)
        )
    raise InvalidInputError(
        f"the turn waits for an answer to its question: send it with addToolOutput for "
        f"the `{CLARIFY_TOOL}` call",
        request_id=pause.request_id,
    )


def create_ai_sdk_router(  # noqa: C901 - one closure per route keeps the routes readable
    runtime: SessionRuntime,
    *,
    auth: AuthDependency = _anonymous,
    prefix: str = "/api/chat",
    keepalive_s: float = 10.0,
    deps: Callable[..., Any] | None = None,
    max_frame_bytes: int = 1_000_000,
) -> APIRouter:
    """The AI SDK chat routes for `runtime`: `POST {prefix}`, `GET {prefix}/{chat_id}/stream`.

    `auth` is a FastAPI dependency returning the caller's principal (or None); a chat of
    another principal answers like one that does not exist. `deps` builds the app's
    dependencies for the turns a request starts or resumes (`ToolContext.deps`).
    Install `turnkit.http.install_problem_handlers` on the app for problem bodies. A chunk
    whose line would pass `max_frame_bytes` is sent as a transient
    `data-turnkit-frame-dropped` part instead (its `type` and size); a tool's output as a
    `tool-output-error` saying so; chunks that open or close a message, step, text or tool
    input go out whatever their size. The stream carries on.
    """
    if max_frame_bytes < 1:
        raise ConfigurationError("max_frame_bytes must be at least 1")
    router = APIRouter(prefix=prefix, tags=["ai-sdk"])
    Caller = Annotated[Principal, Depends(auth)]
    RequestDeps = Annotated[Any, Depends(deps or _no_deps)]

    async def visible(session_id: str, principal: Principal) -> list[TurnRecord] | None:
        """The chat's turns, oldest first; None when it is not the caller's (or absent)."""
        record = await runtime.store.get_session(SessionId(session_id))
        if record is None or (record.principal is not None and record.principal != principal):
            return None
        return await runtime.store.list_turns(SessionId(session_id))

    async def answer(
        turns: list[TurnRecord], message: UIMessage, message_id: str | None, request_deps: Any
    ) -> tuple[TurnId, int]:
        """Resume the paused turn the assistant message stands for; (turn, cursor)."""
        ids = {message.id, message_id}
        record = next((t for t in reversed(turns) if t.turn_id in ids), None)
        if record is None and turns:
            record = turns[-1]
        if record is None:
            raise InvalidInputError("the chat has no turn for this assistant message")
        if record.status not in _PAUSED:
            raise PauseAnsweredError(
                f"turn {record.turn_id!r} is {record.status}, not waiting for an answer",
                turn_id=record.turn_id,
            )
        pause = (await runtime.turn_view(record.turn_id)).pending
        if pause is None:
            raise PauseAnsweredError(f"turn {record.turn_id!r} is not waiting for an answer")
        try:
            request_id, resolution = _pending_answer(record, pause, message)
        except ValidationError as exc:  # an empty answer, a reason past 4,000 characters
            raise InvalidInputError(f"the answer does not fit: {exc.errors()[0]['msg']}") from exc
        await runtime.resume(record.turn_id, request_id, resolution, deps=request_deps)
        return record.turn_id, record.last_seq

    async def events(
        turn_id: TurnId, after_seq: int, *, rebuild: bool
    ) -> AsyncGenerator[list[StreamEvent] | None, None]:
        """The turn's events after the cursor, a batch at a time (None: a keep-alive).

        `rebuild` first reads what the Store holds from the start, then follows after it:
        the reader sends the text so far of blocks still being written, then live.
        """
        if rebuild:
            async for event in runtime.events(turn_id):
                yield [event]
                if isinstance(event, DurableEvent):
                    after_seq = event.seq
        reader = runtime.reader(keepalive_s=keepalive_s)
        batches = cast(
            AsyncGenerator[object, None], reader.follow_batches(turn_id, after_seq=after_seq)
        )
        async with contextlib.aclosing(batches):  # a closed stream stops reading at once
            async for batch in batches:
                if batch is KEEPALIVE:
                    yield None
                elif isinstance(batch, list):
                    yield [decode_event(frame.data) for frame in batch]

    async def rendered(
        translator: UIMessageStreamTranslator,
        record: TurnRecord,
        events: list[StreamEvent],
        lines: list[bytes],
    ) -> bool:
        """Add the lines of `events` to `lines`; True once the stream is over."""
        for event in events:
            if isinstance(event, HeartbeatEvent):
                lines.append(_KEEPALIVE_LINE)
                continue
            lines.extend(
                _bounded(chunk, max_frame_bytes, record.turn_id)
                for chunk in translator.translate(event)
            )
            if isinstance(event, DoneEvent):
                return True
            if isinstance(event, ApprovalRequestedEvent | ClarificationRequestedEvent):
                now = await runtime.turn(record.turn_id)
                if now.status in _PAUSED and now.last_seq <= event.seq:
                    return True  # paused here: the answer comes with the next POST
        return False

    async def render(
        record: TurnRecord, after_seq: int, *, rebuild: bool = False
    ) -> AsyncIterator[bytes]:
        translator = UIMessageStreamTranslator(
            message_id=record.turn_id, metadata={"sessionId": record.session_id}
        )
        for chunk in translator.start():
            yield _line(chunk)
        source = events(record.turn_id, after_seq, rebuild=rebuild)
        lines: list[bytes] = []  # a batch's lines, sent in one write
        try:
            async with contextlib.aclosing(source):
                async for batch in source:
                    if batch is None:
                        yield _KEEPALIVE_LINE
                        continue
                    over = await rendered(translator, record, batch, lines)
                    if lines:
                        yield b"".join(lines)
                        lines.clear()
                    if over:
                        break
        except TurnkitError as exc:
            log.warning("AI SDK stream of turn %s failed: %s", record.turn_id, exc)
            lines.append(_line({"type": "error", "errorText": f"{exc} ({exc.code})"}))
            yield b"".join(lines)
        for chunk in translator.finish():
            yield _line(chunk)
        yield _DONE_LINE

    def respond(body: AsyncIterator[bytes], turn_id: str) -> EventSourceResponse:
        return EventSourceResponse(
            body,
            headers={**STREAM_HEADERS, TURN_ID_HEADER: turn_id},
            ping=_NO_PING_S,  # keep-alives are our own comment lines (see turnkit.http)
            sep="\n",
        )

    @router.post(
        "",
        response_class=EventSourceResponse,
        summary="Send a chat message (or answer a pause) and stream the reply (AI SDK)",
    )
    async def chat(body: ChatRequest, principal: Caller, request_deps: RequestDeps) -> Response:
        turns = await visible(body.id, principal)
        if turns is None and await runtime.store.get_session(SessionId(body.id)) is not None:
            raise SessionNotFoundError(f"no session {body.id!r}", session_id=body.id)
        turns = turns or []
        last = body.messages[-1]
        if last.role == "assistant":
            turn_id, after = await answer(turns, last, body.message_id, request_deps)
            return respond(render(await runtime.turn(turn_id), after), turn_id)
        if last.role != "user":
            raise InvalidInputError("the last message must be the user's (or answer a pause)")
        if turns and turns[-1].status in _PAUSED:
            raise InvalidInputError(
                f"turn {turns[-1].turn_id!r} is {turns[-1].status}: answer it first "
                "(addToolApprovalResponse, or addToolOutput for a question)",
                turn_id=turns[-1].turn_id,
            )
        try:
            content = _content(last)
        except ValidationError as exc:
            raise InvalidInputError(f"a picture does not fit: {exc.errors()[0]['msg']}") from exc
        fresh = body.trigger == "submit-message" and body.message_id is None
        sent = asyncio.Event()  # the turn's first step waits for the stream's opening
        submission = await runtime.start(
            body.id,
            content,
            request_id=last.id if fresh and 0 < len(last.id) <= 128 else None,
            principal=principal,
            deps=request_deps,
            hold_until=sent,
        )
        reply = render(await runtime.turn(submission.turn_id), 0)
        return respond(set_once_sent(reply, sent), submission.turn_id)

    @router.get(
        "/{chat_id}/stream",
        response_class=EventSourceResponse,
        summary="Resume the chat's running reply: the message so far, then live (AI SDK)",
        responses={204: {"description": "No reply is being written."}},
    )
    async def resume(chat_id: Annotated[str, Path(max_length=128)], principal: Caller) -> Response:
        turns = await visible(chat_id, principal)
        if not turns or turns[-1].status != "running":
            return Response(status_code=204)
        record = turns[-1]
        return respond(render(record, 0, rebuild=True), record.turn_id)

    return router
