"""A small OpenAI-compatible chat-completions server for tests, on 127.0.0.1.

Each model name has a FIFO script of replies; every request body is recorded. The
server runs uvicorn in a background thread with its own event loop, so it serves
both sync and async tests and never shares a loop with the code under test.

```python
def test_hello(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.text("hello world", chunks=5)])
    client = LiteLLMClient("openai/fake-model", api_base=openai_server.base_url, api_key="sk")
    ...
    assert openai_server.requests[0]["model"] == "fake-model"
```

The script key is the `model` field of the request body, as the provider sees it:
litellm strips the `openai/` prefix, so `openai/fake-model` is scripted as `fake-model`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ("FakeOpenAIServer", "Reply", "openai_server")

_STARTUP_TIMEOUT_S = 10.0
_SHUTDOWN_TIMEOUT_S = 10.0
_STALL_LIMIT_S = 30.0
"""A stalled stream gives up after this long even if the client never disconnects."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def _split(text: str, pieces: int) -> list[str]:
    """Split `text` into at most `pieces` non-empty consecutive parts (in order)."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), pieces)
    parts: list[str] = []
    start = 0
    for i in range(pieces):
        end = start + size + (1 if i < extra else 0)
        parts.append(text[start:end])
        start = end
    return parts


@dataclass(frozen=True, slots=True)
class _Call:
    """One tool call of a scripted reply: its id, name and JSON arguments."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """One scripted answer. Build it with `Reply.text`, `Reply.tool_call` or `Reply.error`."""

    kind: Literal["text", "tool_call", "error"]
    content: str = ""
    reasoning: str = ""
    chunks: int = 3
    calls: tuple[_Call, ...] = ()
    status: int = 200
    message: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int = 0
    stall: bool = False
    retry_after: str | None = None
    model: str | None = None
    """The model the chunks name (default: the one asked for)."""
    refusal: str = ""
    """Words the model declined with, streamed as `refusal` deltas (content stays null)."""

    @classmethod
    def text(
        cls,
        text: str,
        *,
        chunks: int = 3,
        reasoning: str = "",
        finish_reason: str = "stop",
        prompt_tokens: int = 11,
        completion_tokens: int = 7,
        cached_tokens: int = 0,
        stall: bool = False,
        model: str | None = None,
    ) -> Reply:
        """Assistant text, streamed in `chunks` content deltas.

        Args:
            text: The whole answer.
            chunks: How many content deltas the text is split into.
            reasoning: Sent first as `reasoning_content` deltas (same split), if given.
            finish_reason: The OpenAI finish reason of the last chunk (`stop`, `length`...).
            prompt_tokens: Usage reported in the final usage chunk.
            completion_tokens: Usage reported in the final usage chunk.
            cached_tokens: Reported as `prompt_tokens_details.cached_tokens`.
            stall: Stream the first content delta, then hold the connection open until the
                client disconnects (bounded); `FakeOpenAIServer.disconnects` counts these.
            model: The model the chunks say answered (a dated snapshot of the one asked
                for, say); default: the one asked for.
        """
        return cls(
            kind="text",
            content=text,
            chunks=chunks,
            reasoning=reasoning,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            stall=stall,
            model=model,
        )

    @classmethod
    def refused(cls, words: str, *, chunks: int = 3, finish_reason: str = "stop") -> Reply:
        """A refusal as OpenAI sends one (structured outputs): `refusal` deltas, no content.

        The first delta opens the message with `content` null and an empty `refusal`; the
        words follow in `chunks` deltas; the finish reason is `stop`, as OpenAI's is.
        """
        return cls(kind="text", refusal=words, chunks=chunks, finish_reason=finish_reason)

    @classmethod
    def tool_call(
        cls,
        name: str,
        arguments: dict[str, object],
        *,
        call_id: str = "call_1",
        chunks: int = 4,
        prompt_tokens: int = 11,
        completion_tokens: int = 7,
    ) -> Reply:
        """One tool call; its JSON arguments are streamed across `chunks` deltas."""
        return cls.tool_calls(
            [(name, arguments)],
            call_ids=[call_id],
            chunks=chunks,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    @classmethod
    def tool_calls(
        cls,
        calls: Iterable[tuple[str, dict[str, object]]],
        *,
        call_ids: Iterable[str] | None = None,
        chunks: int = 4,
        unindexed: bool = False,
        prompt_tokens: int = 11,
        completion_tokens: int = 7,
    ) -> Reply:
        """Several tool calls in one reply, as a model asks for parallel calls.

        Each call's JSON arguments are split into `chunks` deltas, and the deltas of the
        calls interleave (call 0's first piece, call 1's first piece, ...), each delta
        naming its call by `index` only, as OpenAI streams them. With `unindexed`, each
        call comes whole in a chunk of its own with no `index` at all, as some
        OpenAI-compatible servers send them. Ids default to `call_1`, `call_2`, ...
        """
        pairs = list(calls)
        ids = list(call_ids) if call_ids is not None else []
        ids += [f"call_{n}" for n in range(len(ids) + 1, len(pairs) + 1)]
        if not pairs or len(ids) != len(pairs):
            raise ValueError("Reply.tool_calls needs one id per call and at least one call")
        return cls(
            kind="tool_call",
            calls=tuple(
                _Call(call_id, name, json.dumps(arguments))
                for call_id, (name, arguments) in zip(ids, pairs, strict=True)
            ),
            chunks=0 if unindexed else chunks,
            finish_reason="tool_calls",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    @classmethod
    def error(
        cls, status: int, message: str | None = None, *, retry_after: str | None = None
    ) -> Reply:
        """An HTTP error with an OpenAI-shaped JSON error body (and `Retry-After`, if given)."""
        return cls(
            kind="error",
            status=status,
            message=message or f"scripted error {status}",
            retry_after=retry_after,
        )


@dataclass(slots=True)
class _Completion:
    """Ids shared by every chunk of one response."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-fake{time.monotonic_ns()}")
    created: int = field(default_factory=lambda: int(time.monotonic()))

    def chunk(
        self,
        delta: dict[str, object] | None,
        finish_reason: str | None = None,
        *,
        usage: dict[str, object] | None = None,
        with_usage_key: bool = False,
    ) -> bytes:
        body: dict[str, object] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_fake",
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if with_usage_key:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n".encode()


def _usage(reply: Reply) -> dict[str, object]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _tool_call_message(call: _Call) -> dict[str, object]:
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _tool_call_deltas(reply: Reply) -> Iterator[dict[str, object]]:
    """The deltas of a reply's tool calls, as `Reply.tool_calls` describes them."""
    if reply.chunks == 0:  # whole calls, no index
        for number, call in enumerate(reply.calls):
            head = {"role": "assistant", "content": None} if number == 0 else {}
            yield {**head, "tool_calls": [_tool_call_message(call)]}
        return
    for index, call in enumerate(reply.calls):
        opening: dict[str, object] = {
            "index": index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        head = {"role": "assistant", "content": None} if index == 0 else {}
        yield {**head, "tool_calls": [opening]}
    pieces = [_split(call.arguments, reply.chunks) for call in reply.calls]
    for round_ in range(max(len(parts) for parts in pieces)):
        for index, parts in enumerate(pieces):
            if round_ < len(parts):
                yield {"tool_calls": [{"index": index, "function": {"arguments": parts[round_]}}]}


class FakeOpenAIServer:
    """An OpenAI-compatible `POST /v1/chat/completions` on 127.0.0.1 and a free port.

    Use it as a context manager (or through the `openai_server` fixture); `script` the
    replies per model name, then read `requests` to see what the client sent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._disconnected = threading.Condition(self._lock)
        self._scripts: dict[str, deque[Reply]] = {}
        self._requests: list[dict[str, object]] = []
        self._headers: list[dict[str, str]] = []
        self._disconnects = 0
        self._port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    # ── scripting and inspection ────────────────────────────────────────────────────

    def script(self, model: str, replies: Iterable[Reply]) -> None:
        """Append replies to the FIFO script of `model` (the request body's `model`)."""
        with self._lock:
            self._scripts.setdefault(model, deque()).extend(replies)

    @property
    def requests(self) -> list[dict[str, object]]:
        """Every request body received so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def headers(self) -> list[dict[str, str]]:
        """Every request's headers (lower-case names), in arrival order (a copy)."""
        with self._lock:
            return list(self._headers)

    @property
    def disconnects(self) -> int:
        """How many stalled streams ended because the client went away."""
        with self._lock:
            return self._disconnects

    def wait_for_disconnects(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until `disconnects` reaches `count` (or `timeout` passes); True if reached.

        From async code run it in a thread: `await asyncio.to_thread(server.wait_for_disconnects)`.
        """
        with self._disconnected:
            return self._disconnected.wait_for(lambda: self._disconnects >= count, timeout)

    def pending(self, model: str) -> int:
        """How many scripted replies of `model` are not yet served."""
        with self._lock:
            return len(self._scripts.get(model, ()))

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, `http://127.0.0.1:PORT/v1`."""
        if not self._port:
            raise RuntimeError("FakeOpenAIServer is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    # ── lifecycle ───────────────────────────────────────────────────────────────────

    def start(self) -> None:
        """Bind a free port and serve in a background thread; returns once serving."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            ws="none",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=self._serve, args=(server, sock), name="fake-openai-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("FakeOpenAIServer did not start")
            time.sleep(0.005)

    @staticmethod
    def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    def stop(self) -> None:
        """Ask the server to exit and wait (bounded) for its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=_SHUTDOWN_TIMEOUT_S)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout=_SHUTDOWN_TIMEOUT_S)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ── the endpoint ────────────────────────────────────────────────────────────────

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        model = str(body.get("model", ""))
        with self._lock:
            self._requests.append(body)
            self._headers.append({k.lower(): v for k, v in request.headers.items()})
            queue = self._scripts.get(model)
            reply = queue.popleft() if queue else None
            scripted = sorted(m for m, q in self._scripts.items() if q)
        if reply is None:
            return _error_response(
                500,
                f"FakeOpenAIServer: no scripted reply left for model {model!r} "
                f"(models with replies left: {scripted}); script it with server.script()",
            )
        if reply.kind == "error":
            return _error_response(reply.status, reply.message, reply.retry_after)
        completion = _Completion(model=reply.model or model)
        if not body.get("stream"):
            return JSONResponse(self._whole(completion, reply))
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        return StreamingResponse(
            self._sse(completion, reply, include_usage=include_usage),
            media_type="text/event-stream",
        )

    @staticmethod
    def _whole(completion: _Completion, reply: Reply) -> dict[str, object]:
        message: dict[str, object] = {"role": "assistant", "content": reply.content or None}
        if reply.refusal:
            message["refusal"] = reply.refusal
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.kind == "tool_call":
            message["tool_calls"] = [_tool_call_message(call) for call in reply.calls]
        return {
            "id": completion.id,
            "object": "chat.completion",
            "created": completion.created,
            "model": completion.model,
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": _usage(reply),
        }

    async def _sse(
        self, completion: _Completion, reply: Reply, *, include_usage: bool
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, object] | None, finish: str | None = None) -> bytes:
            return completion.chunk(delta, finish, with_usage_key=include_usage)

        if reply.kind == "tool_call":
            for delta in _tool_call_deltas(reply):
                yield chunk(delta)
        elif reply.refusal:
            yield chunk({"role": "assistant", "content": None, "refusal": ""})
            for piece in _split(reply.refusal, reply.chunks):
                yield chunk({"refusal": piece})
        else:
            yield chunk({"role": "assistant", "content": ""})
            for piece in _split(reply.reasoning, reply.chunks):
                yield chunk({"reasoning_content": piece})
            for number, piece in enumerate(_split(reply.content, reply.chunks)):
                yield chunk({"content": piece})
                if reply.stall and number == 0:
                    await self._hold_until_disconnect()
                    return
        yield chunk({}, reply.finish_reason)
        if include_usage:
            yield completion.chunk(None, usage=_usage(reply), with_usage_key=True)
        yield b"data: [DONE]\n\n"

    async def _hold_until_disconnect(self) -> None:
        # Starlette cancels this generator when the client disconnects.
        try:
            await asyncio.sleep(_STALL_LIMIT_S)
        except asyncio.CancelledError:
            with self._disconnected:
                self._disconnects += 1
                self._disconnected.notify_all()
            raise


def _error_response(status: int, message: str, retry_after: str | None = None) -> JSONResponse:
    error_type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "param": None, "code": None}},
        status_code=status,
        headers={} if retry_after is None else {"Retry-After": retry_after},
    )


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """A started `FakeOpenAIServer`, stopped after the test."""
    with FakeOpenAIServer() as server:
        yield server
