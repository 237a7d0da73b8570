"""The direct transport: one OpenAI-compatible chat-completions stream over pooled httpx.

`LiteLLMClient` sends a call here when litellm resolves its model to the `openai` provider
(the rule is in its docstring). litellm has already resolved the model and mapped the
parameters into the request body, and it prices the call afterwards; this module only
posts the body and turns the SSE `data:` lines into turnkit chunks, at a small fraction of
litellm's cost per chunk. It never imports litellm.

Connections are pooled per endpoint (scheme, host and port) and per event loop, since an
`httpx.AsyncClient` belongs to the loop that opened its connections. A loop's clients are
closed when the loop shuts down its async generators, as `asyncio.run` does.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import httpx

from turnkit.models import ModelChunk, TextDelta, ThinkingDelta, ToolCallDelta

__all__ = (
    "ChatCall",
    "ChatStreamError",
    "StreamState",
    "broken_stream",
    "stream_chat",
    "tool_call_piece",
)

_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""The openai SDK's limits: a thousand concurrent streams to one endpoint do not queue."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatCall:
    """One prepared call: where it goes and the exact bytes it sends."""

    url: str
    """`{api_base}/chat/completions`."""
    endpoint: str
    """The connection pool's key: scheme, host and port of `url`."""
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes
    timeout: float
    """Seconds for connecting and between reads."""


@dataclass(slots=True)
class StreamState:
    """What the stream said besides its deltas, read once it has ended."""

    finish_reason: str | None = None
    saw_tool_call: bool = False
    usage: dict[str, object] | None = None
    model: str | None = None
    """The `model` the provider's chunks name (the model that answered)."""
    refusal: str | None = None
    """OpenAI's `refusal` words, joined; None when no delta had the field as a string."""
    saw_output: bool = False
    """Some delta had text or thinking that is not blank."""
    words_dropped: bool = False
    """The stream came through litellm's handler, which drops each delta holding only a
    refusal's words."""

    def note(self, content: object, refusal: object, thinking: object = None) -> None:
        """Keep what a delta's `content`, `refusal` and thinking say of a refusal."""
        if any(isinstance(said, str) and said.strip() for said in (content, thinking)):
            self.saw_output = True
        if isinstance(refusal, str):
            self.refusal = (self.refusal or "") + refusal

    def refused(self) -> bool:
        """Whether the model declined: `refusal` words, or an empty `refusal` and nothing else.

        Through litellm's handler (`words_dropped`), an empty `refusal` counts when the
        model wrote no text, no thinking and no call: that opening is all the handler leaves
        of a refusal. Elsewhere the words arrive, and an empty `refusal` alone is an empty
        reply (asked again): some servers send one on every delta, as they do beside text.
        """
        if self.refusal is None:
            return False
        if self.refusal:
            return True
        return self.words_dropped and not (self.saw_output or self.saw_tool_call)


Origin = Literal["status", "event", "stream"]
"""Where a `ChatStreamError` came from: an error status the server sent, an error the
server sent inside a 200 response, or a 200 response turnkit could not read as a whole
chat-completion stream (cut off, not JSON, not a stream at all)."""

_EXCERPT = 120
"""Characters of an unreadable body quoted in the error."""
_BOM = b"\xef\xbb\xbf"
"""A UTF-8 byte order mark: some servers open the body with one."""


class ChatStreamError(Exception):
    """The server answered an error status, sent an error inside the stream, or broke it.

    `status_code` is the status sent when `origin` is `status`; otherwise it is 500, as
    litellm's path reports these, though the server sent no such status.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None,
        code: str | None = None,
        origin: Origin = "status",
        retry_after: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code
        """The error body's `code`, e.g. `context_length_exceeded`."""
        self.origin: Origin = origin
        self.retry_after = retry_after
        """The response's `Retry-After` header, as sent."""

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_error,
            (self.message, self.status_code, self.code, self.origin, self.retry_after),
        )


def _rebuild_error(
    message: str,
    status_code: int | None,
    code: str | None,
    origin: Origin,
    retry_after: str | None = None,
) -> ChatStreamError:
    return ChatStreamError(
        message, status_code=status_code, code=code, origin=origin, retry_after=retry_after
    )


def broken_stream(message: str) -> ChatStreamError:
    """A 200 response that is not a whole chat-completion stream: retriable, as a 500."""
    return ChatStreamError(message, status_code=500, origin="stream")


def _excerpt(raw: bytes | str) -> str:
    """The start of an unreadable body, quoted, for an error message."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    return repr(text[:_EXCERPT] + ("..." if len(text) > _EXCERPT else ""))


# ── the pool ─────────────────────────────────────────────────────────────────────────


@dataclass(slots=True, eq=False)
class _LoopPool:
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)
    keeper: AsyncGenerator[None, None] | None = None


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPool] = (
    weakref.WeakKeyDictionary()
)


async def _close_at_shutdown(
    pool: _LoopPool, loop: asyncio.AbstractEventLoop
) -> AsyncGenerator[None, None]:
    # Started once per loop and left suspended: the loop closes it in
    # `shutdown_asyncgens()` (asyncio.run, asyncio.Runner), and the clients with it.
    try:
        yield
    finally:
        # The pool goes with its loop: this generator refers to the loop (its finalizer),
        # so the pool, kept by the loop's key, would keep the loop alive for good.
        if _POOLS.get(loop) is pool:
            del _POOLS[loop]
        clients = list(pool.clients.values())
        pool.clients.clear()
        for client in clients:
            await client.aclose()


async def _client(endpoint: str) -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _LoopPool()
        pool.keeper = _close_at_shutdown(pool, loop)
        await pool.keeper.__anext__()  # runs to its first `yield`: it never suspends
    client = pool.clients.get(endpoint)
    if client is None or client.is_closed:
        # Redirects are followed as the openai SDK (litellm's path) follows them; httpx
        # drops the key on a redirect to another origin.
        client = pool.clients[endpoint] = httpx.AsyncClient(limits=_LIMITS, follow_redirects=True)
    return client


# ── the stream ───────────────────────────────────────────────────────────────────────


async def stream_chat(call: ChatCall, state: StreamState) -> AsyncGenerator[ModelChunk, None]:
    """Post `call` and yield its text, thinking and tool-call deltas in order.

    `state` holds the finish reason and usage once the stream has ended. The HTTP
    response is closed on the way out, also when the consumer stops early or is
    cancelled, which aborts the request.

    A 200 response is complete once it sent `[DONE]` or a finish reason; one that ends
    with neither was cut off, and one that is not an event stream or a JSON answer is
    not a chat completion at all: both raise `ChatStreamError` (origin `stream`).

    Raises:
        ChatStreamError: An error status, an error event inside the stream, or a stream
            that is cut off, not JSON, or not a chat-completion stream.
        httpx.HTTPError: The transport failed (refused, timed out, cut off).
    """
    client = await _client(call.endpoint)
    request = client.build_request(
        "POST", call.url, content=call.body, headers=call.headers, timeout=call.timeout
    )
    response = await client.send(request, stream=True)
    try:
        if response.status_code >= 300:
            await response.aread()
            raise _status_error(response)
        content_type = response.headers.get("content-type", "")
        reads = response.aiter_bytes()
        head = b""
        if content_type.startswith("application/json"):
            answer, head = await _whole_answer(reads)
            if answer is not None:  # a server that ignores `stream`: one whole answer
                for piece in _pieces(_as_chunk(_parsed(answer)), state):
                    yield piece
                return
        events = _Events()
        # After `[DONE]` the body is still read to its end (`feed` then returns nothing),
        # so that the connection goes back to the pool instead of being closed.
        async for raw in _after(head, reads):
            events.note_start(raw)
            for payload in events.feed(raw):
                for piece in _pieces(_parsed(payload), state):
                    yield piece
        for payload in events.end():
            for piece in _pieces(_parsed(payload), state):
                yield piece
        if not events.done and state.finish_reason is None:
            raise _unfinished(events, content_type)
    finally:
        await response.aclose()


async def _whole_answer(reads: AsyncIterator[bytes]) -> tuple[bytes | None, bytes]:
    """A JSON-labelled body: `(answer, b"")`, or `(None, bytes read)` for an event stream.

    Some servers label their event stream `application/json` (the openai SDK, on litellm's
    path, reads it as a stream all the same).
    """
    head = b""
    async for raw in reads:
        head += raw
        if head.strip():
            break
    if head.lstrip().startswith((b"data:", b":", b"event:", b"id:")):
        return None, head
    return head + b"".join([raw async for raw in reads]), b""


async def _after(head: bytes, reads: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The bytes already read, then the rest."""
    if head:
        yield head
    async for raw in reads:
        yield raw


def _parsed(payload: bytes) -> object:
    try:
        return json.loads(payload)
    except ValueError:
        raise broken_stream(
            f"the provider sent a stream event that is not JSON: {_excerpt(payload)}"
        ) from None


def _unfinished(events: _Events, content_type: str) -> ChatStreamError:
    """A 200 body that ended with neither `[DONE]` nor a finish reason."""
    if events.seen:
        return broken_stream(
            "the stream ended without a finish_reason or [DONE]: the answer was cut off"
        )
    return broken_stream(
        f"the response is not a chat-completion stream (content-type "
        f"{content_type or 'none'!r}, body {_excerpt(events.start)}): check that api_base "
        "is the address of an OpenAI-compatible server"
    )


class _Events:
    """Server-sent events: each event's `data` lines, joined, up to `[DONE]`.

    Other fields (`event:`, `id:`, `retry:`) and `:` comments (keep-alives) carry
    nothing turnkit needs.
    """

    __slots__ = ("_began", "_data", "_rest", "done", "seen", "start")

    def __init__(self) -> None:
        self._began = False
        self._rest = b""
        self._data: list[bytes] = []
        self.done = False
        self.seen = False
        """Whether any `data` line arrived."""
        self.start = b""
        """The body's first bytes, quoted when it turns out not to be a stream."""

    def note_start(self, raw: bytes) -> None:
        """Keep the body's first bytes (cheap: a no-op once enough are kept)."""
        if len(self.start) < _EXCERPT:
            self.start += raw[:_EXCERPT]

    def feed(self, raw: bytes) -> list[bytes]:
        """The payloads of the events `raw` completes (none once `[DONE]` was seen)."""
        if self.done:
            return []
        if not self._began:
            self._began = True
            raw = raw.removeprefix(_BOM)  # a byte order mark opening the body is no part of it
        buffer = self._rest + raw if self._rest else raw
        held = b""
        if b"\r" in buffer:  # CRLF or a lone CR ends a line too
            if buffer.endswith(b"\r"):  # maybe half of a CRLF: decided by the next read
                buffer, held = buffer[:-1], b"\r"
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._rest = lines.pop() + held
        payloads: list[bytes] = []
        for line in lines:
            if line.startswith(b"data:"):
                self.seen = True
                self._data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line and self._data:  # a blank line ends an event
                data, self._data = self._data, []
                payload = data[0] if len(data) == 1 else b"\n".join(data)
                if payload.startswith(b"[DONE]"):
                    self.done = True
                    break
                payloads.append(payload)
        return payloads

    def end(self) -> list[bytes]:
        """The last event, when the body ended without the blank line that closes it."""
        return self.feed(b"\n\n") if self._rest or self._data else []


def _note_model(event: dict[str, object], state: StreamState) -> None:
    """The model the chunk says answered (a dated snapshot of the one asked for, say)."""
    model = event.get("model")
    if isinstance(model, str) and model:
        state.model = model


def _pieces(event: object, state: StreamState) -> list[ModelChunk]:
    """One `chat.completion.chunk` as turnkit chunks (its first choice only)."""
    if not isinstance(event, dict):
        return []
    error = event.get("error")
    if error:
        raise _stream_error(error)
    usage = event.get("usage")
    if isinstance(usage, dict):
        state.usage = usage
    _note_model(event, state)
    choices = event.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        return []
    choice = choices[0]
    reason = choice.get("finish_reason")
    if reason:
        if reason == "abort":
            raise ChatStreamError(
                "the upstream generation was aborted", status_code=500, origin="event"
            )
        state.finish_reason = str(reason)
    delta = choice.get("delta")
    if not delta or not isinstance(delta, dict):
        return []
    return _delta_pieces(delta, state)


def _delta_pieces(delta: dict[str, object], state: StreamState) -> list[ModelChunk]:
    """A choice's delta: thinking, text, tool-call pieces.

    A refusal's words (`refusal`) are no text of the answer: `state` keeps them apart.
    """
    out: list[ModelChunk] = []
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if reasoning and isinstance(reasoning, str):
        out.append(ThinkingDelta(reasoning))
    content = delta.get("content")
    state.note(content, delta.get("refusal"), reasoning)
    if content and isinstance(content, str):
        out.append(TextDelta(content))
    calls = delta.get("tool_calls")
    if calls and isinstance(calls, list):
        pieces = _tool_call_pieces(calls)
        if pieces:
            state.saw_tool_call = True
            out += pieces
    return out


def _as_chunk(answer: object) -> object:
    """A whole `chat.completion` as one chunk whose delta is its message."""
    if not isinstance(answer, dict) or answer.get("error"):
        return answer
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ChatStreamError(f"not a chat completion: {str(answer)[:300]}", status_code=200)
    choice = choices[0]
    delta = {**choice, "delta": choice.get("message")}
    return {"choices": [delta], "usage": answer.get("usage"), "model": answer.get("model")}


def _tool_call_pieces(calls: list[object]) -> list[ModelChunk]:
    out: list[ModelChunk] = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        index = call.get("index")
        call_id = call.get("id")
        function = call.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, dict | list):  # some servers send the object itself
            arguments = json.dumps(arguments)  # as litellm's path passes it on
        piece = tool_call_piece(index, position, call_id, name, arguments)
        if piece is not None:
            out.append(piece)
    return out


def tool_call_piece(
    index: object, position: int, call_id: object, name: object, arguments: object
) -> ToolCallDelta | None:
    """A streamed tool call's piece from its fields as sent (None when it carries nothing).

    `position`: the call's place in its delta, the index when none was sent.
    """
    piece = ToolCallDelta(
        index=index if isinstance(index, int) else position,
        tool_call_id=call_id if isinstance(call_id, str) and call_id else None,
        name=name if isinstance(name, str) and name else None,
        arguments=arguments if isinstance(arguments, str) else "",
    )
    return piece if piece.tool_call_id or piece.name or piece.arguments else None


def _stream_error(error: object) -> ChatStreamError:
    """An error event inside a 200 stream (vLLM, sglang, proxies).

    Status 500, whatever its `code` says, as litellm's path reports it: the request was
    accepted, and the failure came while answering; 429 when it says the provider is
    rate limiting, as litellm's path reads such a message too.
    """
    if not isinstance(error, dict):
        return ChatStreamError(
            str(error), status_code=_in_stream_status(str(error)), origin="event"
        )
    message = error.get("message")
    code = error.get("code")
    text = message if isinstance(message, str) else json.dumps(error)
    return ChatStreamError(
        text,
        status_code=_in_stream_status(f"{text} {code} {error.get('type')}"),
        code=code if isinstance(code, str) else None,
        origin="event",
    )


def _in_stream_status(said: str) -> int:
    folded = said.lower()
    return 429 if "rate limit" in folded or "rate_limit" in folded else 500


def _status_error(response: httpx.Response) -> ChatStreamError:
    try:
        body: object = json.loads(response.content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        message = response.text.strip()[:500] or response.reason_phrase
    return ChatStreamError(
        message,
        status_code=response.status_code,
        code=code if isinstance(code, str) else None,
        retry_after=response.headers.get("retry-after"),
    )
