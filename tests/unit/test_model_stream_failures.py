"""Broken 200 responses and transport failures, on both transports, over real loopback HTTP.

A small raw HTTP server answers each model name with fixed bytes, so a test can send
what `FakeOpenAIServer` never would: a stream cut off before its finish, an event that is
not JSON, a web page, a body shorter than its `content-length`, or nothing at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from turnkit.errors import ConfigurationError, ProviderError, UnknownModelError
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelMessage,
    ModelRequest,
    RungFailed,
    TextDelta,
)
from turnkit.models._errors import retry_after
from turnkit.models._openai_stream import ChatStreamError
from turnkit.models.family import ModelFamily
from turnkit.models.litellm import LiteLLMClient, ModelEndpoint, Transport

HELLO = ModelRequest(messages=(ModelMessage(role="user", content="hi"),))
STREAM = "text/event-stream"


def event(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content else {}
    chunk = {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
PAGE = b"<html><body>Welcome to nginx!</body></html>"
BODIES: dict[str, tuple[str, bytes]] = {
    "good": (STREAM, event("from the next rung") + event(finish="stop") + DONE),
    "cut-off": (STREAM, event("Truncated answ")),
    "done-no-finish": (STREAM, event("whole") + DONE),
    "finish-no-done": (STREAM, event("whole") + event(finish="stop")),
    "not-json": (STREAM, event("hello") + b"data: {not json\n\n" + event(finish="stop") + DONE),
    "html": ("text/html", PAGE),
    "looping": (STREAM, event("=" * 20) * 150 + event(finish="stop") + DONE),
}


class RawServer:
    """Answers `POST .../chat/completions` by the request's `model` with scripted bytes."""

    def __init__(self) -> None:
        self.base_url = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            model = await self._model_of(reader)
            await self._answer(model, writer)
        finally:
            writer.close()

    async def _model_of(self, reader: asyncio.StreamReader) -> str:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return str(json.loads(await reader.readexactly(length))["model"])

    async def _answer(self, model: str, writer: asyncio.StreamWriter) -> None:
        if model == "disconnect":  # promises more than it sends, then hangs up
            writer.write(_head(STREAM, 1000) + event("partial"))
        elif model == "stall":  # headers, then nothing
            writer.write(_head(STREAM, 1000))
            await writer.drain()
            await asyncio.sleep(10)
        else:
            content_type, body = BODIES[model]
            writer.write(_head(content_type, len(body)) + body)
        await writer.drain()


def _head(content_type: str, length: int) -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n"
        "connection: close\r\n\r\n"
    ).encode()


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


async def failure(client: LiteLLMClient) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        [chunk async for chunk in client.stream(HELLO)]
    return caught.value


# ── a 200 that is not a whole answer (the direct transport) ───────────────────────────


async def test_a_stream_cut_off_before_its_finish_walks_the_family(raw_server: RawServer) -> None:
    family = ModelFamily(
        "f", [rung(raw_server, "cut-off", "auto"), rung(raw_server, "good", "auto")]
    )

    chunks: list[ModelChunk] = [chunk async for chunk in family.stream(HELLO)]

    failed = [c for c in chunks if isinstance(c, RungFailed)]
    assert len(failed) == 1
    assert isinstance(failed[0].error, ProviderError)
    assert failed[0].error.is_retriable is True
    assert "cut off" in failed[0].error.message
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == [
        "Truncated answ",
        "from the next rung",
    ]
    for whole in ("done-no-finish", "finish-no-done"):  # either one completes a stream
        answer = [c async for c in rung(raw_server, whole, "auto").stream(HELLO)]
        assert answer[0] == TextDelta("whole")
        assert isinstance(answer[-1], Finish)


async def test_an_event_that_is_not_json_is_a_retriable_provider_error(
    raw_server: RawServer,
) -> None:
    error = await failure(rung(raw_server, "not-json", "auto"))

    assert error.is_retriable is True
    assert "stream event that is not JSON: '{not json'" in error.message


async def test_a_web_page_says_what_came_back(raw_server: RawServer) -> None:
    error = await failure(rung(raw_server, "html", "auto"))

    assert error.is_retriable is True
    assert "not a chat-completion stream" in error.message
    assert "'text/html'" in error.message
    assert "Welcome to nginx!" in error.message
    assert "api_base" in error.message


async def test_a_web_page_on_litellms_transport_walks_the_family_instead_of_an_empty_answer(
    raw_server: RawServer,
) -> None:
    error = await failure(rung(raw_server, "html", "litellm"))
    assert error.is_retriable is True
    assert "not a chat-completion stream (content-type 'text/html" in error.message

    family = ModelFamily(
        "f", [rung(raw_server, "html", "litellm"), rung(raw_server, "good", "litellm")]
    )
    chunks = [chunk async for chunk in family.stream(HELLO)]
    assert len([c for c in chunks if isinstance(c, RungFailed)]) == 1
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["from the next rung"]


# ── what the messages claim ───────────────────────────────────────────────────────────


async def test_a_cut_connection_is_not_called_unreachable(
    raw_server: RawServer, transport: Transport
) -> None:
    error = await failure(rung(raw_server, "disconnect", transport))

    assert error.is_retriable is True
    assert "could not be reached" not in error.message
    assert "HTTP" not in error.message.split("Provider said")[0]
    assert "before the answer was complete" in error.message


async def test_a_client_timeout_names_its_seconds_not_a_status(
    raw_server: RawServer, transport: Transport
) -> None:
    error = await failure(rung(raw_server, "stall", transport, timeout=0.5))

    assert (error.status_code, error.is_retriable) == (408, True)
    assert "timed out after 0.5 s" in error.message
    assert "HTTP 408" not in error.message
    assert not error.message.rstrip().endswith("Provider said:")


# ── configuration ─────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("timeout", [0, -1, "5", True, float("nan"), float("inf")])
def test_a_timeout_that_is_not_positive_seconds_is_refused(timeout: object) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        LiteLLMClient("openai/gpt-4o", timeout=timeout)  # type: ignore[arg-type]

    with pytest.raises(ValidationError, match="timeout"):
        ModelEndpoint(model="openai/gpt-4o", timeout=float("inf"))
    assert LiteLLMClient("openai/gpt-4o", timeout=1).model == "openai/gpt-4o"
    assert ModelEndpoint(model="openai/gpt-4o", timeout=2.5).client().model == "openai/gpt-4o"


def test_an_unknown_provider_prefix_is_named_with_the_openai_compatible_way() -> None:
    with pytest.raises(UnknownModelError) as caught:
        LiteLLMClient("nosuchprov/mymodel")

    message = caught.value.message
    assert "'nosuchprov'" in message
    assert "'openai/mymodel' with api_base" in message
    assert "openai/nosuchprov" not in message


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("20", 20.0),
        ("0.5", 0.5),
        ("-3", 0.0),  # already past: no wait
        ("1e9", 86_400.0),  # more than a day is reported as a day
        ("soon", None),
        ("nan", None),
        ("", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past
    ],
)
def test_retry_after_is_read_as_seconds_or_a_date(header: str, wait: float | None) -> None:
    error = ChatStreamError("busy", status_code=429, retry_after=header)
    assert retry_after(error) == wait


async def test_a_stream_that_sends_no_usage_is_counted_alike_on_both_transports(
    raw_server: RawServer,
) -> None:
    """A server ignoring `include_usage`: tokens are estimated, so budgets still count them."""
    finished = {}
    for transport in ("auto", "litellm"):
        chunks = [c async for c in rung(raw_server, "good", transport).stream(HELLO)]
        assert isinstance(chunks[-1], Finish)
        finished[transport] = chunks[-1].usage
    assert finished["auto"].input_tokens > 0
    assert finished["auto"].output_tokens > 0
    assert finished["auto"] == finished["litellm"]


async def test_a_model_that_loops_is_stopped_by_litellm_and_said_to_loop(
    raw_server: RawServer,
) -> None:
    """litellm's own guard ends a stream of one chunk repeated; it did not "break off"."""
    error = await failure(rung(raw_server, "looping", "litellm"))
    assert "the model sent the same chunk 100 times in a row" in error.message
    assert "broke off" not in error.message
    chunks = [c async for c in rung(raw_server, "looping", "auto").stream(HELLO)]
    assert sum(len(c.text) for c in chunks if isinstance(c, TextDelta)) == 20 * 150
