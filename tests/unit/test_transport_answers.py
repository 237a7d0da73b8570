"""Server answers both transports must read alike (and credentials never repeated).

A raw loopback server answers each model name with scripted bytes (status, headers,
body), so the tests can send what real OpenAI-compatible servers send and
`FakeOpenAIServer` never does.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from turnkit.errors import ModelUnreachableError, ProviderError
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelMessage,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
)
from turnkit.models.litellm import LiteLLMClient, Transport

HELLO = ModelRequest(messages=(ModelMessage(role="user", content="hi"),))
STREAM = "text/event-stream"


def chunk(delta: dict[str, object] | None, finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def sse(obj: object, end: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(obj).encode() + end


DONE = b"data: [DONE]\n\n"
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
GOOD = sse(chunk({"content": "hello"})) + sse(chunk({}, "stop")) + DONE


REFUSALS: dict[str, tuple[str, bytes]] = {
    # a server that ignores `stream`: one JSON answer with a refusal
    "refusal-whole": (
        "application/json",
        json.dumps(
            {
                "id": "chatcmpl-raw",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "refusal": "I can't help with that.",
                        },
                        "finish_reason": "stop",
                    }
                ],
                "usage": USAGE,
            }
        ).encode(),
    ),
    # a server that sends `refusal: ""` on every delta of an ordinary answer
    "empty-refusal-field": (
        STREAM,
        sse(chunk({"role": "assistant", "content": "", "refusal": ""}))
        + sse(chunk({"content": "hello", "refusal": ""}))
        + sse(chunk({}, "stop"))
        + DONE,
    ),
    "empty-refusal-alone": (
        STREAM,
        sse(chunk({"role": "assistant", "content": None, "refusal": ""}))
        + sse(chunk({}, "stop"))
        + DONE,
    ),
    "empty-refusal-thinking": (
        STREAM,
        sse(chunk({"role": "assistant", "content": None, "refusal": ""}))
        + sse(chunk({"reasoning_content": "Let me think.", "refusal": ""}))
        + sse(chunk({}, "stop"))
        + DONE,
    ),
}


def _answer(status: int, content_type: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    ).encode() + body


class RawServer:
    """Answers `POST .../chat/completions` by the request's `model` with fixed bytes."""

    def __init__(self) -> None:
        self.base_url = ""
        self.port = 0
        self.paths: list[str] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            model = str(json.loads(await reader.readexactly(length))["model"])
            path = head.split(b" ")[1].decode()
            self.paths.append(path)
            writer.write(self._reply(model, path))
            await writer.drain()
        finally:
            writer.close()

    def _reply(self, model: str, path: str) -> bytes:
        if model == "redirected":  # a proxy that moved: 307 keeps the method and body
            if path.startswith("/moved/"):
                return _answer(200, STREAM, GOOD)
            where = f"http://127.0.0.1:{self.port}/moved/v1/chat/completions"
            return _answer(307, "text/plain", b"", f"location: {where}\r\n")
        if model == "tool-args-object":  # arguments as a JSON object, not a string
            call = {"index": 0, "id": "c1", "type": "function"}
            call["function"] = {"name": "get_weather", "arguments": {"city": "Paris"}}
            body = sse(chunk({"tool_calls": [call]})) + sse(chunk({}, "tool_calls")) + DONE
            return _answer(200, STREAM, body)
        if model == "sse-labelled-json":  # an event stream sent as application/json
            return _answer(200, "application/json", GOOD)
        if model == "json-with-error-null":  # a whole answer naming no error
            answer = {
                "id": "x",
                "object": "chat.completion",
                "model": "m-2025",
                "error": None,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "whole"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": USAGE,
            }
            return _answer(200, "application/json", json.dumps(answer).encode())
        if model == "json-answer":  # a server that ignores `stream`
            answer = {
                "id": "x",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "whole"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": USAGE,
            }
            return _answer(200, "application/json", json.dumps(answer).encode())
        if model == "refusal":  # a refusal streams in `delta.refusal`, content null
            body = (
                sse(chunk({"role": "assistant", "content": None, "refusal": ""}))
                + sse(chunk({"refusal": "I can't help "}))
                + sse(chunk({"refusal": "with that."}))
                + sse(chunk({}, "stop"))
                + DONE
            )
            return _answer(200, STREAM, body)
        if model in REFUSALS:
            return _answer(200, *REFUSALS[model])
        if model == "rate-limited-mid-stream":  # an error event after some text
            error = {"message": "Rate limit reached for m", "code": "rate_limit_exceeded"}
            return _answer(200, STREAM, sse(chunk({"content": "hel"})) + sse({"error": error}))
        if model == "bom":  # a body that opens with a UTF-8 byte order mark
            return _answer(200, STREAM, b"\xef\xbb\xbf" + GOOD)
        if model == "cr-lines":  # SSE allows a lone CR as the line ending
            body = sse(chunk({"content": "hello"}), b"\r\r") + sse(chunk({}, "stop"), b"\r\r")
            return _answer(200, STREAM, body + b"data: [DONE]\r\r")
        return _answer(200, STREAM, GOOD)


@pytest.fixture
async def raw_server() -> AsyncIterator[RawServer]:
    server = RawServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture(params=["auto", "litellm"])
def transport(request: pytest.FixtureRequest) -> Transport:
    return request.param  # type: ignore[no-any-return]


def rung(server: RawServer, model: str, transport: Transport, **kwargs: Any) -> LiteLLMClient:
    return LiteLLMClient(
        f"openai/{model}", api_base=server.base_url, api_key="sk", transport=transport, **kwargs
    )


async def collect(client: LiteLLMClient, request: ModelRequest = HELLO) -> list[ModelChunk]:
    return [c async for c in client.stream(request)]


def text_of(chunks: list[ModelChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


# ── HIGH: a secret in api_base reaches the error message ───────────────────────────────


@pytest.mark.parametrize(
    "base",
    [
        "http://proxyuser:hunter2secret@127.0.0.1:{port}/v1",
        "http://127.0.0.1:{port}/v1?api-key=sk-abcdef123456789",
    ],
)
async def test_a_refused_connection_does_not_repeat_the_credentials_of_api_base(
    transport: Transport, base: str
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = LiteLLMClient(
        "openai/m", api_base=base.format(port=port), api_key="sk-x", transport=transport
    )

    with pytest.raises(ProviderError) as caught:
        await collect(client)

    error = caught.value
    shown = f"{error.message} {getattr(error, 'address', '')}"
    assert "hunter2secret" not in shown
    assert "sk-abcdef123456789" not in shown
    if isinstance(error, ModelUnreachableError):
        assert "127.0.0.1" in error.message  # still says where


# ── HIGH: tool-call arguments sent as a JSON object are lost ──────────────────────────


@pytest.mark.filterwarnings("ignore::UserWarning")  # litellm's pydantic serializer warns
async def test_tool_call_arguments_sent_as_an_object_are_kept(
    raw_server: RawServer, transport: Transport
) -> None:
    chunks = await collect(rung(raw_server, "tool-args-object", transport))

    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert json.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}
    assert isinstance(chunks[-1], Finish)
    assert chunks[-1].stop_reason == "tool_use"


# ── MEDIUM: a redirect fails the direct call (litellm's path follows it) ──────────────


async def test_a_307_redirect_is_followed(raw_server: RawServer, transport: Transport) -> None:
    chunks = await collect(rung(raw_server, "redirected", transport))

    assert text_of(chunks) == "hello"
    assert raw_server.paths[-1] == "/moved/v1/chat/completions"


# ── MEDIUM: an event stream labelled application/json ─────────────────────────────────


async def test_an_event_stream_labelled_json_is_read_as_a_stream(
    raw_server: RawServer, transport: Transport
) -> None:
    chunks = await collect(rung(raw_server, "sse-labelled-json", transport))

    assert text_of(chunks) == "hello"
    assert isinstance(chunks[-1], Finish)
    assert chunks[-1].stop_reason == "end_turn"


# ── MEDIUM: a lone surrogate in a message crashes the direct call untyped ─────────────


async def test_a_lone_surrogate_in_a_message_is_not_an_untyped_crash(
    raw_server: RawServer,
) -> None:
    """A file name read with surrogateescape (os.listdir of a non-UTF-8 name), say."""
    request = ModelRequest(messages=(ModelMessage(role="user", content="caf\udce9.txt"),))
    try:
        chunks = await collect(rung(raw_server, "good", "auto"), request)
    except ProviderError:  # typed, as on litellm's path, is acceptable
        return
    assert text_of(chunks) == "hello"


# ── MEDIUM: litellm's path turns a whole JSON answer into an empty finished answer ────


async def test_a_server_that_ignores_stream_is_never_an_empty_answer(
    raw_server: RawServer, transport: Transport
) -> None:
    chunks: list[ModelChunk] = []
    refused: ProviderError | None = None
    try:
        chunks = await collect(rung(raw_server, "json-answer", transport))
    except ProviderError as error:  # refusing it (retriable) is fine; silence is not
        refused = error
    if refused is not None:
        assert refused.is_retriable
        assert "ignored `stream`" in refused.message
    else:
        assert text_of(chunks) == "whole"


# ── LOW: a whole JSON answer with `"error": null` loses its text ──────────────────────


async def test_a_whole_answer_with_a_null_error_keeps_its_text(raw_server: RawServer) -> None:
    chunks = await collect(rung(raw_server, "json-with-error-null", "auto"))

    assert text_of(chunks) == "whole"
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.response_model == "m-2025"


# ── LOW: lone-CR line endings ─────────────────────────────────────────────────────────


async def test_events_ended_by_a_lone_cr_are_read(
    raw_server: RawServer, transport: Transport
) -> None:
    chunks = await collect(rung(raw_server, "cr-lines", transport))

    assert text_of(chunks) == "hello"


# ── MEDIUM: a refusal (`delta.refusal`) was the answer on one path, nothing on the other ──


async def test_a_refusal_ends_on_the_content_filter_without_answer_text(
    raw_server: RawServer, transport: Transport
) -> None:
    """OpenAI's `refusal` is the model declining (structured outputs), not an answer: no
    text, the finish says `content_filter`, and the words travel apart on the `Finish`.
    litellm's stream handler drops every delta that holds only `refusal` words before
    turnkit sees it; the opening delta's empty `refusal` still says the model refused."""
    chunks = await collect(rung(raw_server, "refusal", transport))

    assert text_of(chunks) == ""
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.stop_reason == "content_filter"
    assert finish.refusal == ("I can't help with that." if transport == "auto" else "")


async def test_a_refusal_in_one_json_answer_is_read_the_same(raw_server: RawServer) -> None:
    chunks = await collect(rung(raw_server, "refusal-whole", "auto"))

    assert text_of(chunks) == ""
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert (finish.stop_reason, finish.refusal) == ("content_filter", "I can't help with that.")


async def test_an_empty_refusal_field_beside_text_is_no_refusal(
    raw_server: RawServer, transport: Transport
) -> None:
    """Some servers send `refusal: ""` on every delta of an ordinary answer."""
    chunks = await collect(rung(raw_server, "empty-refusal-field", transport))

    assert text_of(chunks) == "hello"
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert (finish.stop_reason, finish.refusal) == ("end_turn", "")


async def test_an_empty_refusal_alone_is_a_refusal_only_where_its_words_are_dropped(
    raw_server: RawServer, transport: Transport
) -> None:
    """litellm's handler drops a refusal's words: its empty opening is all that is left.

    turnkit's own client reads the words, so there an empty `refusal` with nothing else is an
    empty reply (asked again), not a refusal.
    """
    chunks = await collect(rung(raw_server, "empty-refusal-alone", transport))

    finish = chunks[-1]
    assert isinstance(finish, Finish)
    expected = "content_filter" if transport == "litellm" else "end_turn"
    assert finish.stop_reason == expected


async def test_an_empty_refusal_beside_thinking_is_no_refusal(
    raw_server: RawServer, transport: Transport
) -> None:
    """A reasoning model that only thought replied: it is asked again, not refused."""
    chunks = await collect(rung(raw_server, "empty-refusal-thinking", transport))

    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.stop_reason == "end_turn"


# ── LOW: a UTF-8 byte order mark cost the first event ─────────────────────────────────


async def test_a_byte_order_mark_does_not_cost_the_first_event(raw_server: RawServer) -> None:
    chunks = await collect(rung(raw_server, "bom", "auto"))

    assert text_of(chunks) == "hello"


# ── LOW: an api_base with a query string (api-version=…) built a broken URL ───────────


async def test_an_api_base_with_a_query_keeps_it_after_the_path(raw_server: RawServer) -> None:
    client = LiteLLMClient(
        "openai/good",
        api_base=f"{raw_server.base_url}?api-version=2024-10-21",
        api_key="sk",
        transport="auto",
    )

    chunks = await collect(client)

    assert text_of(chunks) == "hello"
    assert raw_server.paths[-1] == "/v1/chat/completions?api-version=2024-10-21"


# ── LOW: a rate limit said inside the stream read as a server error on the direct path ─


async def test_a_rate_limit_inside_the_stream_reads_alike_on_both_paths(
    raw_server: RawServer, transport: Transport
) -> None:
    with pytest.raises(ProviderError) as caught:
        await collect(rung(raw_server, "rate-limited-mid-stream", transport))

    assert caught.value.status_code == 429
    assert "rate limiting" in caught.value.message
    assert caught.value.is_retriable
