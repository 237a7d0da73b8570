"""SSE framing: `id: <seq>` for durable events only; an oversized frame is dropped."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Final

from turnkit.errors import StoreUnavailableError, TurnNotFoundError
from turnkit.runtime.reader import KEEPALIVE, Frame

__all__ = ("frames_to_sse", "shutdown_farewell")

log = logging.getLogger("turnkit.http")


def _comment(text: str) -> bytes:
    """A comment line with no blank line after it, so no client dispatches an event.

    (A blank line ends an event; some clients, httpx-sse among them, then dispatch an event
    with empty data carrying the last id, which a JSON-parsing consumer chokes on.)
    """
    return f": {text}\n".encode()


_WRITE_BYTES: Final = 64 * 1024
"""A batch is written in pieces of about this size (a replay of large frames)."""
_LINE_BREAK: Final = re.compile(rb"\r\n|\r|\n")


def _event(frame: Frame) -> bytes:
    """One SSE event: an `id` line for a durable event, then its data line(s)."""
    data = frame.data
    if b"\n" in data or b"\r" in data:  # never in compact JSON; kept correct all the same
        data = b"\ndata: ".join(_LINE_BREAK.split(data))
    if frame.seq is None:
        return b"data: " + data + b"\n\n"
    return b"id: %d\ndata: %s\n\n" % (frame.seq, data)


_OUTAGE_RETRY_MS: Final = 2000
"""How soon a client reconnects after its stream ended for a database outage."""


def shutdown_farewell(last: bytes | None) -> tuple[bytes, ...]:
    """What a stream the server's exit stops says last, unless its `done` went out.

    A comment and a `retry` field, as for a database outage: an `EventSource` reconnects
    anyway, and a client reading the body itself can tell the stream was cut, not ended.
    """
    if last is not None and _ends_with_done(last):
        return ()
    return (
        _comment("the server is shutting down; the turn goes on: reconnect with Last-Event-ID"),
        b"retry: %d\n" % _OUTAGE_RETRY_MS,
    )


def _ends_with_done(chunk: bytes) -> bool:
    """Whether the last event in `chunk` is a `done` (its own `type`, not a payload's)."""
    at = chunk.rfind(b"\ndata: ")
    line = chunk[at + 7 :] if at >= 0 else chunk.removeprefix(b"data: ")
    try:
        event = json.loads(line.split(b"\n", 1)[0])
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") == "done"


async def frames_to_sse(
    batches: AsyncIterator[object], *, max_frame_bytes: int, turn_id: str
) -> AsyncIterator[bytes]:
    """SSE bytes for a reader's frame batches, one write per batch (keep-alives: comments).

    A database outage that stops the reader ends the stream cleanly: a comment saying so
    and a `retry` field, so the client reconnects with `Last-Event-ID` once the database
    is back (the turn goes on meanwhile) instead of seeing its connection cut. So does a
    turn deleted with its session while it is followed: a comment, and no `retry` (there
    is nothing to reconnect to).
    """
    try:
        async for chunk in _sse(batches, max_frame_bytes=max_frame_bytes, turn_id=turn_id):
            yield chunk
    except TurnNotFoundError:  # its session was deleted while the stream followed it
        log.info("the stream of turn %s ended: its session was deleted", turn_id)
        yield _comment("the turn is gone: its session was deleted")
    except StoreUnavailableError as exc:
        log.warning("the stream of turn %s ended: %s", turn_id, exc.message)
        yield _comment("the database is unavailable: reconnect with Last-Event-ID")
        yield b"retry: %d\n" % _OUTAGE_RETRY_MS  # a field, no event: nothing is dispatched


async def _sse(
    batches: AsyncIterator[object], *, max_frame_bytes: int, turn_id: str
) -> AsyncIterator[bytes]:
    async for batch in batches:
        if batch is KEEPALIVE:
            yield _comment("keep-alive")
            continue
        assert isinstance(batch, list)
        parts: list[bytes] = []
        size = 0
        for frame in batch:
            assert isinstance(frame, Frame)
            if len(frame.data) > max_frame_bytes:
                # Losing one frame costs less than losing a turn that has run for minutes.
                log.warning(
                    "dropped an oversized frame of turn %s (seq %s, %d bytes > %d)",
                    turn_id, frame.seq, len(frame.data), max_frame_bytes,
                )  # fmt: skip
                parts.append(
                    _comment(f"dropped oversized frame seq={frame.seq} bytes={len(frame.data)}")
                )
                continue
            parts.append(_event(frame))
            size += len(parts[-1])
            if size >= _WRITE_BYTES:
                yield b"".join(parts)
                parts, size = [], 0
        if parts:
            yield b"".join(parts)
