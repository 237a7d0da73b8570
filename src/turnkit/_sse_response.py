"""`SseResponse`: an SSE stream's bytes on the wire, with one helper task per stream.

sse-starlette's `EventSourceResponse` runs each stream in a task group of four tasks (the
stream, a ping, a shutdown listener, a disconnect listener) and puts every send under a
cancel scope of its own. Our streams (the harness's, the AI SDK's and AG-UI's) frame their
own bytes and send their own keep-alives, so this response keeps only what they need: the
stream runs in the request's own task, one task per stream listens for the client's
disconnect, and one task per event loop waits for the server's exit signal (sse-starlette's
own, so `turnkit serve` drains exactly as before) and stops every live stream. A stream
the exit stops sends its farewell, if it has one, then a clean end of body.

The farewell is for clients that take a stream that simply ends for a finished answer
(the AI SDK's, AG-UI's): their streams end with a last frame saying the server is shutting
down (an `error` part, a `RUN_ERROR`), so their clients know to resume; the turn runs on
elsewhere. A harness stream's is a comment and a `retry` field: a browser's `EventSource`
reconnects by itself and resumes with `Last-Event-ID`, and a client reading the body itself
can tell the stream was cut.

Shared by `turnkit.http` and `turnkit.protocols`, which import nothing of each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Final

from sse_starlette import EventSourceResponse
from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ("FAREWELL_TIMEOUT_S", "Farewell", "SseResponse")

Farewell = Callable[[bytes | None], Iterable[bytes]]
"""A stream's last chunks when the server exits, given the last chunk it sent (None: none).

A stream whose end already went out says nothing more (an empty iterable)."""

FAREWELL_TIMEOUT_S: Final = 1.0
"""How long a stream the server's exit stopped may take to send its farewell and its end."""

_EXIT: Final = "the server is shutting down"
_END: Final = {"type": "http.response.body", "body": b"", "more_body": False}


class _Stream:
    """One live stream: its task, and why it was stopped (None: it was not)."""

    __slots__ = ("is_armed", "reason", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.is_armed = True
        """False once the stream is ending by itself: nothing cancels it any more."""
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        if self.is_armed:
            self.is_armed, self.reason = False, reason
            self.task.cancel(f"turnkit: SSE stream stopped ({reason})")


class _Exits:
    """The live streams of one event loop, ended together when the server begins to exit."""

    def __init__(self) -> None:
        self.streams: set[_Stream] = set()
        self.watcher: asyncio.Task[None] | None = None

    def add(self, stream: _Stream) -> None:
        self.streams.add(stream)
        if self.watcher is None or self.watcher.done():
            self.watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        # sse-starlette's listener (a static method in every release we support): it
        # returns once uvicorn was told to exit, at once if it already was.
        await EventSourceResponse._listen_for_exit_signal()  # pyright: ignore[reportPrivateUsage]
        for stream in list(self.streams):
            stream.stop(_EXIT)


_EXITS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Exits] = weakref.WeakKeyDictionary()


def _exits() -> _Exits:
    loop = asyncio.get_running_loop()
    found = _EXITS.get(loop)
    if found is None:
        found = _EXITS[loop] = _Exits()
    return found


async def _listen(receive: Receive, stream: _Stream) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    stream.stop("the client disconnected")


class SseResponse(Response):
    """`text/event-stream` from bytes already framed; no ping, no per-send timer.

    Headers as sse-starlette builds them from `headers`: `Cache-Control: no-store` unless
    given, `Connection: keep-alive` and `X-Accel-Buffering: no`. `farewell`: what the
    stream sends when the server's exit stops it, before its end of body.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        headers: Mapping[str, str],
        farewell: Farewell | None = None,
    ) -> None:
        self.body_iterator = body
        self.farewell = farewell
        self.status_code = 200
        self.background = None
        raw = MutableHeaders()
        raw.update(headers)
        raw.setdefault("Cache-Control", "no-store")
        raw["Connection"] = "keep-alive"
        raw["X-Accel-Buffering"] = "no"
        self.init_headers(raw)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the head, then each chunk as it comes, then the end of the body."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        if scope.get("method") == "HEAD":  # no stream for HEAD: it would never end
            await send(_END)
            await _close(self.body_iterator)
            return
        task = asyncio.current_task()
        assert task is not None
        stream, exits = _Stream(task), _exits()
        listener = asyncio.create_task(_listen(receive, stream))
        exits.add(stream)
        chunk: bytes | None = None  # the last chunk sent
        sending = False  # stopped inside a send: the transport's state is unknown
        try:
            async for chunk in self.body_iterator:
                sending = True
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sending = False
            stream.is_armed = False
            await send(_END)
        except asyncio.CancelledError:
            if stream.reason is None or task.uncancel() > 0:
                raise  # not ours: whoever cancelled the request goes on with it
        finally:
            stream.is_armed = False
            exits.streams.discard(stream)
            listener.cancel()
            await _close(self.body_iterator)
        if stream.reason == _EXIT and not sending:
            await self._end(send, chunk)

    async def _end(self, send: Send, last: bytes | None) -> None:
        """The farewell after `last`, then a clean end of body (not a truncated one).

        Within `FAREWELL_TIMEOUT_S`: a client that does not read holds up no shutdown.
        """
        with contextlib.suppress(OSError, TimeoutError):  # the peer is gone, or stuck
            async with asyncio.timeout(FAREWELL_TIMEOUT_S):
                for chunk in () if self.farewell is None else self.farewell(last):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send(_END)


async def _close(body: AsyncIterator[bytes]) -> None:
    close = getattr(body, "aclose", None)
    if close is not None:
        await close()
