"""`SseResponse`: head, chunks, end; a client that leaves or a server that exits stops it.

A stream with a farewell says it when the server exits, and only then."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from sse_starlette.sse import AppStatus
from starlette.types import Message

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit._sse_response import FAREWELL_TIMEOUT_S, SseResponse
from turnkit.models import ModelChunk, ModelRequest, TextDelta
from turnkit.quickstart import create_app

END: Message = {"type": "http.response.body", "body": b"", "more_body": False}


class _Body:
    """Chunks, then a wait that only cancellation ends; records whether it was closed."""

    def __init__(self, chunks: list[bytes], *, then_wait: bool) -> None:
        self.chunks, self.then_wait = chunks, then_wait
        self.closed = asyncio.Event()

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for chunk in self.chunks:
                yield chunk
            if self.then_wait:
                await asyncio.Event().wait()
        finally:
            self.closed.set()


class _HangingModel:
    """Streams one word, then waits for ever (a turn the server's exit finds running)."""

    model = "hanging"
    provider = "test"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("word ")
        await asyncio.Event().wait()


class _Client:
    """The ASGI side of one connection: what was sent, and a disconnect on demand."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.gone = asyncio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


def _scope(method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "method": method, "headers": []}


async def _serve(
    body: _Body, client: _Client, method: str = "POST", *, farewell: bool = False
) -> asyncio.Task[None]:
    response = SseResponse(body(), headers={"X-Turn-Id": "t1"}, farewell=_bye if farewell else None)
    return asyncio.create_task(response(_scope(method), client.receive, client.send))


def _bye(last: bytes | None) -> Iterable[bytes]:
    if last == b"data: end\n\n":  # its end went out already
        return ()
    return [b"data: bye after " + (last or b"nothing").strip() + b"\n\n", b"data: [DONE]\n\n"]


@contextlib.asynccontextmanager
async def _server_exiting() -> AsyncIterator[None]:
    AppStatus.should_exit = True  # what uvicorn's exit signal sets (sse-starlette's flag)
    try:
        yield
    finally:
        AppStatus.should_exit = False


def _bodies(client: _Client) -> list[bytes]:
    return [m["body"] for m in client.sent if m["type"] == "http.response.body"]


async def test_head_then_each_chunk_then_the_end() -> None:
    body, client = _Body([b"id: 1\ndata: {}\n\n", b": keep-alive\n"], then_wait=False), _Client()
    await asyncio.wait_for(await _serve(body, client), 5)
    start, *rest = client.sent
    assert start["status"] == 200
    assert dict(start["headers"]) == {
        b"cache-control": b"no-store",
        b"x-turn-id": b"t1",
        b"connection": b"keep-alive",
        b"x-accel-buffering": b"no",
        b"content-type": b"text/event-stream; charset=utf-8",
    }
    assert rest == [
        {"type": "http.response.body", "body": b"id: 1\ndata: {}\n\n", "more_body": True},
        {"type": "http.response.body", "body": b": keep-alive\n", "more_body": True},
        END,
    ]
    assert body.closed.is_set()


async def test_a_client_that_leaves_stops_the_stream_and_closes_its_reader() -> None:
    body, client = _Body([b"data: 1\n\n"], then_wait=True), _Client()
    task = await _serve(body, client)
    while len(client.sent) < 2:
        await asyncio.sleep(0)
    client.gone.set()
    await asyncio.wait_for(task, 5)  # returns: the disconnect is not an error
    assert body.closed.is_set()
    assert client.sent[-1]["more_body"] is True  # nothing more was sent to a closed socket


async def test_the_server_exiting_ends_the_stream_cleanly_so_the_client_resumes() -> None:
    body, client = _Body([b"data: 1\n\n"], then_wait=True), _Client()
    task = await _serve(body, client)
    while len(client.sent) < 2:
        await asyncio.sleep(0)
    AppStatus.should_exit = True  # what uvicorn's exit signal sets (sse-starlette's flag)
    try:
        await asyncio.wait_for(task, 5)
    finally:
        AppStatus.should_exit = False
    assert body.closed.is_set()
    assert client.sent[-1] == END  # a clean end of body, not a truncated one


async def test_the_server_exiting_sends_the_farewell_after_the_last_chunk_then_the_end() -> None:
    body, client = _Body([b"data: 1\n\n", b"data: 2\n\n"], then_wait=True), _Client()
    task = await _serve(body, client, farewell=True)
    while len(client.sent) < 3:
        await asyncio.sleep(0)
    async with _server_exiting():
        await asyncio.wait_for(task, 5)
    assert body.closed.is_set()
    assert not task.cancelled()
    assert _bodies(client) == [
        b"data: 1\n\n",
        b"data: 2\n\n",
        b"data: bye after data: 2\n\n",
        b"data: [DONE]\n\n",
        b"",
    ]
    assert client.sent[-1] == END


async def test_a_stream_stopped_before_its_first_chunk_says_its_farewell_too() -> None:
    body, client = _Body([], then_wait=True), _Client()
    task = await _serve(body, client, farewell=True)
    await asyncio.sleep(0.01)
    async with _server_exiting():
        await asyncio.wait_for(task, 5)
    assert _bodies(client) == [b"data: bye after nothing\n\n", b"data: [DONE]\n\n", b""]


async def test_a_stream_whose_end_went_out_says_nothing_more() -> None:
    body, client = _Body([b"data: end\n\n"], then_wait=True), _Client()  # then closes up
    task = await _serve(body, client, farewell=True)
    while len(client.sent) < 2:
        await asyncio.sleep(0)
    async with _server_exiting():
        await asyncio.wait_for(task, 5)
    assert _bodies(client) == [b"data: end\n\n", b""]


async def test_a_stream_that_ended_or_lost_its_client_says_no_farewell() -> None:
    ended, client = _Body([b"data: 1\n\n"], then_wait=False), _Client()
    await asyncio.wait_for(await _serve(ended, client, farewell=True), 5)
    assert _bodies(client) == [b"data: 1\n\n", b""]
    left, gone = _Body([b"data: 1\n\n"], then_wait=True), _Client()
    task = await _serve(left, gone, farewell=True)
    while len(gone.sent) < 2:
        await asyncio.sleep(0)
    gone.gone.set()
    await asyncio.wait_for(task, 5)
    async with _server_exiting():
        await asyncio.sleep(0.6)  # the exit watcher polls every 0.5 s
    assert _bodies(gone) == [b"data: 1\n\n"]


async def test_a_farewell_to_a_client_that_does_not_read_holds_up_no_shutdown() -> None:
    body, client = _Body([b"data: 1\n\n"], then_wait=True), _Client()
    stuck = asyncio.Event()

    async def send(message: Message) -> None:
        if client.sent and message["body"] != b"data: 1\n\n":
            await stuck.wait()  # the peer's window is full: this send never returns
        client.sent.append(message)

    response = SseResponse(body(), headers={}, farewell=_bye)
    task = asyncio.create_task(response(_scope(), client.receive, send))
    while len(client.sent) < 2:
        await asyncio.sleep(0)
    async with _server_exiting():
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(task, 5)
    assert asyncio.get_running_loop().time() - started < FAREWELL_TIMEOUT_S + 1.0
    assert _bodies(client) == [b"data: 1\n\n"]  # no end after a send cut short


async def test_a_cancelled_request_stays_cancelled() -> None:
    body, client = _Body([], then_wait=True), _Client()
    task = await _serve(body, client)
    await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert body.closed.is_set()


async def test_head_sends_no_stream() -> None:
    body, client = _Body([b"data: 1\n\n"], then_wait=True), _Client()
    await asyncio.wait_for(await _serve(body, client, "HEAD"), 5)
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
    assert client.sent[-1] == END


async def test_sigterm_ends_open_streams_and_the_server_exits(tmp_path: Path) -> None:
    """A stream waiting on a turn that hangs ends with a clean end of body on SIGTERM."""
    runtime = SessionRuntime(
        agent=Agent(model=_HangingModel()),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'exit.db'}"),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(runtime), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/api/harness/sessions/s/execute"
    types: list[str] = []
    lines: list[str] = []
    try:
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("POST", url, json={"content": "go"}) as response,
        ):
            async for line in response.aiter_lines():
                lines.append(line)
                if line.startswith("data: "):
                    types.append(json.loads(line.removeprefix("data: "))["type"])
                    if types[-1] == "message.delta":
                        server.handle_exit(signal.SIGTERM, None)  # as uvicorn's handler does
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive()
    finally:
        AppStatus.should_exit = False
        server.should_exit = True
        sock.close()
    assert types[0] == "turn.started"
    assert "done" not in types  # the turn goes on elsewhere; the client resumes from its id
    # Said as a database outage is: a client reading the body itself knows to resume.
    assert lines[-2:] == [
        ": the server is shutting down; the turn goes on: reconnect with Last-Event-ID",
        "retry: 2000",
    ]


def test_the_harness_farewell_is_skipped_only_after_the_turns_own_done() -> None:
    from datetime import UTC, datetime

    from turnkit.events import DoneEvent, PluginEmittedEvent, encode_event
    from turnkit.http.sse import shutdown_farewell

    common = {"session_id": "s", "turn_id": "t", "stage_id": "post-turn", "seq": 7,
              "ts": datetime.now(UTC)}  # fmt: skip
    emitted = PluginEmittedEvent(**common, plugin="p", name="plugin.p.x", data={"type": "done"})
    done = DoneEvent(**{**common, "seq": 8}, status="succeeded")
    frame = b"id: %d\ndata: %s\n\n"
    cut = frame % (7, encode_event(emitted))  # a payload that says "done" is not the end
    assert shutdown_farewell(cut)[-1] == b"retry: 2000\n"
    assert shutdown_farewell(cut + frame % (8, encode_event(done))) == ()
    assert shutdown_farewell(b": keep-alive\n")[-1] == b"retry: 2000\n"
    assert shutdown_farewell(None)[-1] == b"retry: 2000\n"
