"""The quickstart app on a real uvicorn, a paced model, and a switch that drops streams.

`serve_page` builds `turnkit.quickstart.create_app` around a runtime on a temporary SQLite
file and serves it on a free 127.0.0.1 port (uvicorn in its own thread), so the browser
talks to exactly what `turnkit serve` runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import WrappedModel
from tests.support.server import serve
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.models import ModelChunk, ModelRequest, TextDelta
from turnkit.quickstart import create_app
from turnkit.testing import ScriptedModel

Message = MutableMapping[str, Any]


@dataclass
class PacedModel(WrappedModel):
    """Plays a ScriptedModel, pacing and holding the text of one call.

    ScriptedModel streams its pieces at once; a page test needs text that is still being
    written when it reloads, reconnects or presses Stop. Call `paced_call` (0-based) waits
    `delay_s` before each text piece and, after `hold_after` pieces, until `release()` (at
    most 30 s).
    """

    inner: ScriptedModel
    paced_call: int = 0
    delay_s: float = 0.0
    hold_after: int | None = None
    gate: threading.Event = field(default_factory=threading.Event)
    _calls: int = 0

    def release(self) -> None:
        self.gate.set()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        index, self._calls = self._calls, self._calls + 1
        pieces = 0
        async for chunk in self.inner.stream(request):
            if index == self.paced_call and isinstance(chunk, TextDelta):
                if pieces == self.hold_after:
                    for _ in range(1500):  # the gate is a thread's: poll it, 30 s at most
                        if self.gate.is_set():
                            break
                        await asyncio.sleep(0.02)
                pieces += 1
                await asyncio.sleep(self.delay_s)
            yield chunk


class StreamSwitch:
    """ASGI middleware: records each stream request's `Last-Event-ID` and drops open streams.

    `drop()` tells every stream open at that moment that its client went away, as a
    dropped connection would; the browser's EventSource then reconnects by itself.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.generation = 0
        self.requests: list[tuple[str, str | None]] = []
        """(query string, Last-Event-ID header or None) of each stream request."""

    def drop(self) -> None:
        self.generation += 1

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/stream"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        last = headers.get(b"last-event-id")
        self.requests.append(
            (scope["query_string"].decode(), last.decode() if last is not None else None)
        )
        born = self.generation

        async def watched() -> Message:
            pending = asyncio.ensure_future(receive())
            while not pending.done():
                if self.generation != born:
                    pending.cancel()
                    return {"type": "http.disconnect"}
                await asyncio.wait({pending}, timeout=0.05)
            message: Message = pending.result()
            return message

        await self.app(scope, watched, send)

    def resumed_with_cursor(self) -> list[str]:
        """The `Last-Event-ID`s the browser sent when it reconnected."""
        return [last for _, last in self.requests if last is not None]


@dataclass
class PageApp:
    url: str
    runtime: SessionRuntime
    switch: StreamSwitch


@contextmanager
def serve_page(
    tmp_path: Path, agent: Agent, *, keepalive_s: float = 10.0, **config: Any
) -> Iterator[PageApp]:
    """Serve the quickstart app (page and routes) for `agent`; yields its base URL.

    `config` adds `RuntimeConfig` fields (the database is `page.db` in `tmp_path`).
    """
    runtime = SessionRuntime(
        agent=agent,
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'page.db'}", **config),
    )
    switch = StreamSwitch(create_app(runtime, keepalive_s=keepalive_s))
    with serve(switch) as url:
        yield PageApp(url=url, runtime=runtime, switch=switch)
