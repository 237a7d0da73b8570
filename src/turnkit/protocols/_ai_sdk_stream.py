"""The body of an AI SDK response: a turn's events in, UI message stream lines out.

`Replies.render` writes the message's `start`, then the chunks of each batch of events (a
batch's lines in one write), a comment line for each keep-alive, and ends with `finish` and
`[DONE]` at the turn's end or at a pause (its answer comes with the next POST). With
`rebuild` it first reads what the Store holds from the turn's start (for `resumeStream`).
`bounded` keeps one chunk's line within the size limit.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Final, cast

from turnkit.errors import TurnkitError
from turnkit.events import (
    ApprovalRequestedEvent,
    ClarificationRequestedEvent,
    DoneEvent,
    DurableEvent,
    HeartbeatEvent,
    StreamEvent,
    decode_event,
)
from turnkit.ids import TurnId
from turnkit.protocols._ai_sdk_translate import Chunk, UIMessageStreamTranslator
from turnkit.protocols._pieces import pieces
from turnkit.runtime import SessionRuntime
from turnkit.runtime.reader import KEEPALIVE
from turnkit.store import TurnRecord

__all__ = ("DONE_LINE", "PAUSED", "Replies", "bounded", "line")

log = logging.getLogger("turnkit.protocols")

PAUSED: Final = frozenset({"awaiting_approval", "awaiting_input"})
"""The statuses of a turn that waits for an answer."""
DONE_LINE: Final = b"data: [DONE]\n\n"
_KEEPALIVE_LINE: Final = b": keep-alive\n"


@dataclass(frozen=True, slots=True)
class Replies:
    """How a router's replies are read and written: its runtime, keep-alives and line bound."""

    runtime: SessionRuntime
    keepalive_s: float
    max_frame_bytes: int

    async def render(
        self,
        record: TurnRecord,
        after_seq: int,
        *,
        rebuild: bool = False,
        asked: Iterable[str] = (),
    ) -> AsyncIterator[bytes]:
        """The message of `record`'s turn: its events after `after_seq`, up to its end.

        `asked`: tool calls an earlier stream of the message asked the person to approve.
        """
        translator = UIMessageStreamTranslator(
            message_id=record.turn_id, metadata={"sessionId": record.session_id}, asked=asked
        )
        for chunk in translator.start():
            yield line(chunk)
        source = self._events(record.turn_id, after_seq, rebuild=rebuild)
        lines: list[bytes] = []  # a batch's lines, sent in one write
        try:
            async with contextlib.aclosing(source):
                async for batch in source:
                    if batch is None:
                        yield _KEEPALIVE_LINE
                        continue
                    over = await self._rendered(translator, record, batch, lines)
                    if lines:
                        yield b"".join(lines)
                        lines.clear()
                    if over:
                        break
        except TurnkitError as exc:
            log.warning("AI SDK stream of turn %s failed: %s", record.turn_id, exc)
            lines.append(line({"type": "error", "errorText": f"{exc} ({exc.code})"}))
            yield b"".join(lines)
        for chunk in translator.finish():
            yield line(chunk)
        yield DONE_LINE

    async def _events(
        self, turn_id: TurnId, after_seq: int, *, rebuild: bool
    ) -> AsyncGenerator[list[StreamEvent] | None, None]:
        """The turn's events after the cursor, a batch at a time (None: a keep-alive).

        `rebuild` first reads what the Store holds from the start, then follows after it:
        the reader sends the text so far of blocks still being written, then live.
        """
        if rebuild:
            async for event in self.runtime.events(turn_id):
                yield [event]
                if isinstance(event, DurableEvent):
                    after_seq = event.seq
        reader = self.runtime.reader(keepalive_s=self.keepalive_s)
        batches = cast(
            AsyncGenerator[object, None], reader.follow_batches(turn_id, after_seq=after_seq)
        )
        async with contextlib.aclosing(batches):  # a closed stream stops reading at once
            async for batch in batches:
                if batch is KEEPALIVE:
                    yield None
                elif isinstance(batch, list):
                    yield [decode_event(frame.data) for frame in batch]

    async def _rendered(
        self,
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
                bounded(chunk, self.max_frame_bytes, record.turn_id)
                for chunk in translator.translate(event)
            )
            if isinstance(event, DoneEvent):
                return True
            if isinstance(event, ApprovalRequestedEvent | ClarificationRequestedEvent):
                now = await self.runtime.turn(record.turn_id)
                if now.status in PAUSED and now.last_seq <= event.seq:
                    return True  # paused here: the answer comes with the next POST
        return False


# ── lines ─────────────────────────────────────────────────────────────────────────────


def line(chunk: Chunk) -> bytes:
    """One chunk as an SSE `data:` line."""
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


_SPLITTABLE: Final = frozenset({"text-delta", "reasoning-delta"})
"""Chunks whose `delta` may go out as several chunks: the client appends them all."""


def bounded(chunk: Chunk, max_bytes: int, turn_id: str) -> bytes:
    """`chunk`'s line, or a transient stand-in when it would pass `max_bytes`.

    A text or reasoning delta that would pass it goes out as several deltas instead (a
    replayed block comes as one delta with its whole text).
    """
    sent = line(chunk)
    kind = chunk.get("type")
    if len(sent) <= max_bytes or kind in _STRUCTURAL:
        return sent
    delta = chunk.get("delta")
    if kind in _SPLITTABLE and isinstance(delta, str):
        room = max_bytes - len(line({**chunk, "delta": ""}))
        return b"".join(line({**chunk, "delta": piece}) for piece in pieces(delta, room))
    # Losing one chunk costs less than losing a turn that has run for minutes.
    log.warning(
        "dropped an oversized AI SDK chunk of turn %s (%s, %d bytes > %d)",
        turn_id, kind, len(sent), max_bytes,
    )  # fmt: skip
    if kind == "tool-output-available":  # the tool part ends, saying why it has no output
        too_large = f"the result ({len(sent)} bytes) was too large to stream"
        return line(
            {"type": "tool-output-error", "toolCallId": chunk["toolCallId"], "errorText": too_large}
        )
    return line(
        {
            "type": "data-turnkit-frame-dropped",
            "data": {"type": kind, "bytes": len(sent)},
            "transient": True,
        }
    )
