"""SSE framing: `id: <seq>` for durable events only; an oversized frame is dropped."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from turnkit.runtime.reader import KEEPALIVE, Frame

__all__ = ("frames_to_sse",)

log = logging.getLogger("turnkit.http")


def _comment(text: str) -> bytes:
    """A comment line with no blank line after it, so no client dispatches an event.

    (A blank line ends an event; some clients, httpx-sse among them, then dispatch an event
    with empty data carrying the last id, which a JSON-parsing consumer chokes on.)
    """
    return f": {text}\n".encode()


async def frames_to_sse(
    frames: AsyncIterator[object], *, max_frame_bytes: int, turn_id: str
) -> AsyncIterator[ServerSentEvent | bytes]:
    """SSE events for a reader's frames (keep-alives become comment lines)."""
    async for item in frames:
        if item is KEEPALIVE:
            yield _comment("keep-alive")
            continue
        assert isinstance(item, Frame)
        if len(item.data) > max_frame_bytes:
            # Losing one frame costs less than losing a turn that has run for minutes.
            log.warning(
                "dropped an oversized frame of turn %s (seq %s, %d bytes > %d)",
                turn_id, item.seq, len(item.data), max_frame_bytes,
            )  # fmt: skip
            yield _comment(f"dropped oversized frame seq={item.seq} bytes={len(item.data)}")
            continue
        yield ServerSentEvent(
            data=item.data.decode(), id=str(item.seq) if item.seq is not None else None
        )
