"""The body of an AG-UI response: turnkit frames in, AG-UI SSE frames out, each within a bound.

`stream_run` writes the run's opening, then the AG-UI events of each batch the reader hands
over (a batch's frames in one write), a comment line for each keep-alive, and stops at the
run's end. `Bound` keeps a frame within the size limit; `BufferView` is the runtime's
replay buffer as the reader sees it, counting its views so the translator knows when
deltas were lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final

from turnkit.ids import TurnId
from turnkit.protocols._agui_translate import AgUi, Translator
from turnkit.protocols._pieces import pieces
from turnkit.replay import BufferEntry, ReplayBuffer
from turnkit.runtime.reader import KEEPALIVE, Frame
from turnkit.store import Store

__all__ = ("Bound", "BufferView", "stream_run")

log = logging.getLogger("turnkit.protocols")


async def stream_run(
    translator: Translator,
    opening: list[AgUi],
    batches: AsyncGenerator[object, None],
    view: BufferView,
    bound: Bound,
) -> AsyncIterator[bytes]:
    """The response's body: the opening, then each batch's AG-UI frames, up to the run's end."""
    async with contextlib.aclosing(batches):  # closing the reader leaves the turn running
        for out in opening:
            yield bound.frame(out, None)
        while not translator.finished:  # a pause ends the run (the reader would wait)
            item = await anext(batches, None)
            if item is None:
                break
            if item is KEEPALIVE:
                yield b": keep-alive\n"  # a comment line: no client dispatches an event
                continue
            assert isinstance(item, list)
            if written := _translated(translator, item, view, bound):
                yield written  # the frames ready together, in one write
        for out in translator.abandon():
            yield bound.frame(out, None)


def _translated(
    translator: Translator, frames: list[Frame], view: BufferView, bound: Bound
) -> bytes:
    """The AG-UI frames of a batch of turnkit frames (up to the end of the run)."""
    written: list[bytes] = []
    for item in frames:
        translator.notice(view.views, view.seq)
        outs = translator.feed(item.data)
        for index, out in enumerate(outs):
            written.append(bound.frame(out, item.seq if index == len(outs) - 1 else None))
        if translator.finished:
            break
    return b"".join(written)


def _data(event: AgUi) -> bytes:
    """An AG-UI event as one line of JSON (`json.dumps` escapes every line break)."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def _frame(data: bytes, seq: int | None) -> bytes:
    """One AG-UI frame; the last frame of a durable turnkit event carries its seq as id.

    Lines end with a bare LF, never CRLF: @ag-ui/client splits frames on two LFs only.
    """
    if seq is None:
        return b"data: %s\n\n" % data
    return b"id: %d\ndata: %s\n\n" % (seq, data)


_STRUCTURAL: Final = frozenset(
    {
        "RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "STEP_STARTED", "STEP_FINISHED",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_END", "TOOL_CALL_START", "TOOL_CALL_END",
        "REASONING_START", "REASONING_END", "REASONING_MESSAGE_START", "REASONING_MESSAGE_END",
    }
)  # fmt: skip
"""Events a client's state machine needs: sent whatever their size."""
_SPLITTABLE: Final = frozenset({"TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"})
"""Events whose `delta` may go out as several events: the client appends them all."""


@dataclass(frozen=True, slots=True)
class Bound:
    """How far one frame may grow; a larger one goes out as `turnkit.frame_dropped`."""

    max_bytes: int
    turn_id: str

    def frame(self, event: AgUi, seq: int | None) -> bytes:
        data = _data(event)
        size = len(data)
        kind = event.get("type")
        if size <= self.max_bytes or kind in _STRUCTURAL:
            return _frame(data, seq)
        delta = event.get("delta")
        if kind in _SPLITTABLE and isinstance(delta, str):
            # Text goes out as several contents, the id on the last (a replayed block comes
            # as one content with its whole text).
            cut = pieces(delta, self.max_bytes - len(_data({**event, "delta": ""})))
            return b"".join(
                _frame(_data({**event, "delta": piece}), seq if n == len(cut) else None)
                for n, piece in enumerate(cut, 1)
            )
        # Losing one frame costs less than losing a turn that has run for minutes; the
        # stand-in keeps the frame's id, so a resume goes on after it.
        log.warning(
            "dropped an oversized AG-UI frame of turn %s (%s, %d bytes > %d)",
            self.turn_id, kind, size, self.max_bytes,
        )  # fmt: skip
        if kind == "TOOL_CALL_RESULT":  # the call keeps its result message, not the content
            too_large = f"[a result of {size} bytes, too large to stream]"
            metadata: AgUi = {"turnkit": {"droppedBytes": size}}
            return _frame(_data({**event, "content": too_large, "metadata": metadata}), seq)
        dropped: AgUi = {"type": kind, "bytes": size}
        if seq is not None:
            dropped["seq"] = seq  # the turnkit event it stood for
        stand_in: AgUi = {
            "type": "CUSTOM",
            "timestamp": event.get("timestamp"),
            "name": "turnkit.frame_dropped",
            "value": dropped,
        }
        return _frame(_data(stand_in), seq)


class BufferView:
    """The runtime's `ReplayBuffer` as one reader uses it, counting the views it takes.

    The reader takes the buffer's tail before it reads the Store; what was written before
    reaches it as `message.snapshot`. A later tail (after a buffer outage) comes without
    snapshots: deltas before it were lost. `seq` is the turn's last event right after that
    later tail; a block whose first delta comes after a newer durable event is whole here.
    """

    def __init__(self, inner: ReplayBuffer, store: Store) -> None:
        self.inner, self.store = inner, store
        self.views = 0
        self.seq = sys.maxsize

    async def tail(self, turn_id: TurnId) -> str:
        self.views += 1
        self.seq = sys.maxsize  # trust no delta until the seq is known
        position = await self.inner.tail(turn_id)
        if self.views > 1 and (record := await self.store.get_turn(turn_id)) is not None:
            self.seq = record.last_seq
        return position

    async def read(
        self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500
    ) -> list[BufferEntry]:
        return await self.inner.read(turn_id, after=after, wait_s=wait_s, limit=limit)

    async def publish(
        self, turn_id: TurnId, entries: Sequence[tuple[int | None, bytes, bool]]
    ) -> None:
        await self.inner.publish(turn_id, entries)

    async def release(self, turn_id: TurnId) -> None:
        await self.inner.release(turn_id)

    async def ping(self) -> None:
        await self.inner.ping()

    async def drop(self, turn_id: TurnId) -> None:
        await self.inner.drop(turn_id)

    async def close(self) -> None:
        pass  # the runtime owns the buffer
