"""Which transport carries a call, and that the direct one sends what litellm would send.

`tests/unit/test_litellm_client.py` runs the whole client contract on both transports;
here: the routing rule, request parity (body and headers, byte for byte where it matters),
the SSE parser, error events inside a stream, and the connection pool's lifetime.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from tests.support import openai_server as fake_openai
from tests.support.openai_server import FakeOpenAIServer, Reply

from turnkit.blocks import ImagePart, TextPart
from turnkit.errors import ProviderError
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelMessage,
    ModelRequest,
    ModelSettings,
    TextDelta,
    ToolCallDelta,
    ToolCallPart,
    ToolSpec,
    _direct,
    _openai_stream,
)
from turnkit.models._loader import load_litellm
from turnkit.models._openai_stream import ChatCall, StreamState, stream_chat
from turnkit.models.litellm import LiteLLMClient, ModelEndpoint, Transport

openai_server = fake_openai.openai_server

DIRECT_AGENT = "turnkit"
HELLO = ModelRequest(messages=(ModelMessage(role="user", content="hi"),))
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
PICTURE = ImagePart(data=b"\x89PNG fake", media_type="image/png")
RICH = ModelRequest(
    messages=(
        ModelMessage(role="system", content="Be brief."),
        ModelMessage(role="user", content=(TextPart(text="What is this?"), PICTURE)),
        ModelMessage(
            role="assistant",
            content="Let me look.",
            tool_calls=(ToolCallPart(tool_call_id="c1", name="get_weather", arguments="{}"),),
        ),
        ModelMessage(role="tool", content=(TextPart(text="sunny"), PICTURE), tool_call_id="c1"),
        ModelMessage(role="user", content="And now?", name="ana"),
    ),
    tools=(WEATHER,),
    tool_choice="none",
    max_output_tokens=300,
    settings=ModelSettings(
        temperature=0.3,
        top_p=0.8,
        seed=5,
        stop=("END", "STOP"),
        presence_penalty=0.1,
        frequency_penalty=0.2,
    ),
)


def client(
    server: FakeOpenAIServer, transport: Transport, model: str = "fake-model", **kwargs: Any
) -> LiteLLMClient:
    return LiteLLMClient(
        f"openai/{model}",
        api_base=server.base_url,
        api_key="sk-test",
        transport=transport,
        **kwargs,
    )


async def collect(stream: AsyncIterator[ModelChunk]) -> list[ModelChunk]:
    return [chunk async for chunk in stream]


# ── which transport serves ────────────────────────────────────────────────────────────


async def test_an_openai_model_streams_directly_unless_opted_out(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("same answer")] * 2)

    direct = await collect(client(openai_server, "auto").stream(HELLO))
    via_litellm = await collect(client(openai_server, "litellm").stream(HELLO))

    assert direct == via_litellm
    agents = [h["user-agent"] for h in openai_server.headers]
    assert agents[0] == DIRECT_AGENT
    assert agents[1] != DIRECT_AGENT  # the openai SDK under litellm


def test_the_endpoint_carries_the_opt_out() -> None:
    endpoint = ModelEndpoint(model="openai/gpt-4o", transport="litellm")

    assert endpoint.client().transport == "litellm"
    assert ModelEndpoint(model="openai/gpt-4o").client().transport == "auto"
    with pytest.raises(ValueError, match="transport"):
        ModelEndpoint.model_validate({"model": "openai/gpt-4o", "transport": "httpx"})


@pytest.mark.parametrize(
    ("model", "kwargs"),
    [
        pytest.param("hosted_vllm/fake-model", {}, id="another-provider"),
        pytest.param("openai/fake-model", {"num_retries": 1}, id="litellm-retries"),
    ],
)
async def test_litellm_serves_other_providers_and_its_own_retries(
    openai_server: FakeOpenAIServer, model: str, kwargs: dict[str, Any]
) -> None:
    openai_server.script("fake-model", [Reply.text("ok")])
    served = LiteLLMClient(model, api_base=openai_server.base_url, api_key="sk", **kwargs)

    chunks = await collect(served.stream(HELLO))

    assert any(isinstance(c, TextDelta) for c in chunks)
    assert openai_server.headers[0]["user-agent"] != DIRECT_AGENT


async def test_litellm_callbacks_keep_calls_on_litellms_path(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    litellm = load_litellm()
    monkeypatch.setattr(litellm, "input_callback", [lambda *args, **kwargs: None])
    openai_server.script("fake-model", [Reply.text("ok")])

    await collect(client(openai_server, "auto").stream(HELLO))

    assert openai_server.headers[0]["user-agent"] != DIRECT_AGENT


async def test_litellms_idle_cache_entry_keeps_the_direct_path(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """litellm adds its own "cache" callback when its Gemini code first loads (a `Cache`
    it only uses for keys): with no `litellm.cache` set it sees nothing, and an OpenAI
    call after a Gemini one still goes direct. A real cache keeps calls on litellm's path."""
    litellm = load_litellm()
    for name in ("input_callback", "success_callback", "_async_success_callback"):
        monkeypatch.setattr(litellm, name, ["cache"])
    openai_server.script("fake-model", [Reply.text("ok"), Reply.text("ok")])

    await collect(client(openai_server, "auto").stream(HELLO))
    assert openai_server.headers[0]["user-agent"] == DIRECT_AGENT

    monkeypatch.setattr(litellm, "cache", litellm.Cache(type="local"))
    await collect(client(openai_server, "auto").stream(HELLO))
    assert openai_server.headers[1]["user-agent"] != DIRECT_AGENT


def test_a_model_litellm_sends_to_the_responses_api_is_declined() -> None:
    litellm = load_litellm()
    kwargs: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}], "stream": True}

    assert _direct.prepare(litellm, kwargs, model="o3-pro") is None
    assert _direct.prepare(litellm, kwargs, model="gpt-4o") is not None


# ── what the provider receives ────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("model", "request_"),
    [
        pytest.param("fake-model", RICH, id="unknown-model-every-setting"),
        pytest.param("gpt-4o", RICH, id="gpt-4o-every-setting"),
        pytest.param(
            "o3-mini",
            replace(RICH, settings=ModelSettings(seed=5), thinking_budget=4096),
            id="o-series-reasoning-and-max-completion-tokens",
        ),
        pytest.param(
            "gpt-4o",
            replace(
                RICH,
                messages=tuple(
                    replace(m, content="") if m.role == "assistant" else m for m in RICH.messages
                ),
            ),
            id="a-tool-call-with-no-text",
        ),
    ],
)
async def test_the_direct_body_is_the_one_litellm_sends(
    openai_server: FakeOpenAIServer, model: str, request_: ModelRequest
) -> None:
    openai_server.script(model, [Reply.text("ok"), Reply.text("ok")])
    extra = {"extra_body": {"user": "u-1"}, "headers": {"X-Route": "team-a"}}

    await collect(client(openai_server, "auto", model, **extra).stream(request_))
    await collect(client(openai_server, "litellm", model, **extra).stream(request_))

    direct, via_litellm = openai_server.requests
    assert direct == via_litellm
    assert direct["user"] == "u-1"
    if model == "o3-mini":
        assert direct["reasoning_effort"] == "low"  # a 4096 budget under a 300 cap
        assert direct["max_completion_tokens"] == 300
    for headers in openai_server.headers:
        assert headers["authorization"] == "Bearer sk-test"
        assert headers["x-route"] == "team-a"


async def test_a_parameter_litellm_refuses_fails_the_same_way(
    openai_server: FakeOpenAIServer,
) -> None:
    hot = replace(HELLO, settings=ModelSettings(temperature=0.2))  # o-series: only 1.0

    errors: list[ProviderError] = []
    for transport in ("auto", "litellm"):
        with pytest.raises(ProviderError) as caught:
            await collect(client(openai_server, transport, "o3-mini").stream(hot))
        errors.append(caught.value)

    assert [(e.status_code, e.is_retriable) for e in errors] == [(400, False), (400, False)]
    assert openai_server.requests == []


# ── the stream itself (a scripted transport stands in for the server) ─────────────────


def scripted(
    monkeypatch: pytest.MonkeyPatch, respond: Callable[[httpx.Request], httpx.Response]
) -> ChatCall:
    async def mock_client(endpoint: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(respond))

    monkeypatch.setattr(_openai_stream, "_client", mock_client)
    return ChatCall(
        url="http://127.0.0.1:9/v1/chat/completions",
        endpoint="http://127.0.0.1:9",
        headers={"content-type": "application/json"},
        body=b"{}",
        timeout=5.0,
    )


def sse(*pieces: bytes) -> httpx.Response:
    return httpx.Response(
        200,
        headers={"content-type": "text/event-stream"},
        stream=httpx.ByteStream(b"".join(pieces)),
    )


def event(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def test_sse_framing_variants_are_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    body = (
        b": keep-alive comment\r\n\r\n"
        + b"event: message\r\ndata: "
        + json.dumps(event({"content": "Hel"})).encode()
        + b"\r\n\r\n"
        + b"data:"
        + json.dumps(event({"content": "lo"})).encode()
        + b"\n\n"
        + b'data: {"choices": [{"index": 0,\ndata:  "delta": {"reasoning": "hm"}}]}\n\n'
        + b"data: "
        + json.dumps(event({}, "length")).encode()
        + b"\n\n"
        + b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    )  # the last event lacks its closing blank line
    call = scripted(monkeypatch, lambda request: sse(body))
    state = StreamState()

    chunks = await collect(stream_chat(call, state))

    assert [getattr(c, "text", None) for c in chunks] == ["Hel", "lo", "hm"]
    assert state.finish_reason == "length"
    assert state.usage == {"prompt_tokens": 3, "completion_tokens": 2}


async def test_events_split_across_reads_are_reassembled(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = b"".join(
        b"data: " + json.dumps(event({"content": str(i)})).encode() + b"\n\n" for i in range(20)
    )
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)] + [b"data: [DONE]\n\n"]

    class Trickle(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

    call = scripted(
        monkeypatch,
        lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Trickle()
        ),
    )

    chunks = await collect(stream_chat(call, StreamState()))

    assert [c.text for c in chunks if isinstance(c, TextDelta)] == [str(i) for i in range(20)]


@pytest.mark.parametrize(
    "error",
    [
        pytest.param({"message": "overloaded", "code": 503}, id="with-a-code"),
        pytest.param({"message": "bad", "code": 400}, id="with-a-client-code"),
        pytest.param({"message": "boom", "type": "server_error"}, id="without-a-code"),
    ],
)
async def test_an_error_event_inside_a_stream_is_a_retriable_500(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, error: dict[str, object]
) -> None:
    """As litellm's path reports it, whatever the event's `code` says."""
    first = b"data: " + json.dumps(event({"content": "par"})).encode() + b"\n\n"
    failure = b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    scripted(monkeypatch, lambda request: sse(first, failure))

    seen: list[ModelChunk] = []

    async def consume() -> None:
        async for chunk in client(openai_server, "auto").stream(HELLO):
            seen.append(chunk)

    with pytest.raises(ProviderError) as caught:
        await consume()

    assert caught.value.status_code == 500
    assert caught.value.is_retriable is True
    assert seen == [TextDelta("par")]
    assert str(error["message"]) in caught.value.message


async def test_a_context_window_error_says_so(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"error": {"message": "too long", "code": "context_length_exceeded"}}
    scripted(monkeypatch, lambda request: httpx.Response(400, json=body))

    with pytest.raises(ProviderError) as caught:
        await collect(client(openai_server, "auto").stream(HELLO))

    assert caught.value.status_code == 400
    assert caught.value.is_retriable is False
    assert "context window" in caught.value.message


async def test_a_server_that_ignores_stream_still_answers_in_chunks(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "calling",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3},
    }
    scripted(monkeypatch, lambda request: httpx.Response(200, json=whole))

    chunks = await collect(client(openai_server, "auto").stream(HELLO))

    assert chunks[:2] == [
        TextDelta("calling"),
        ToolCallDelta(index=0, tool_call_id="c1", name="get_weather", arguments="{}"),
    ]
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert (finish.stop_reason, finish.usage.input_tokens, finish.usage.output_tokens) == (
        "tool_use",
        4,
        3,
    )


# ── the pool ──────────────────────────────────────────────────────────────────────────


def test_one_pooled_client_per_endpoint_closed_with_its_loop(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("a"), Reply.text("b"), Reply.text("c")])

    async def three_calls() -> list[httpx.AsyncClient]:
        for _ in range(3):
            await collect(client(openai_server, "auto").stream(HELLO))
        pool = _openai_stream._POOLS[asyncio.get_running_loop()]
        return list(pool.clients.values())

    clients = asyncio.run(three_calls())

    assert len(clients) == 1
    assert clients[0].is_closed, "asyncio.run's shutdown closes the loop's clients"


def test_a_loop_that_ended_leaves_no_pool_behind(openai_server: FakeOpenAIServer) -> None:
    """An app that runs each job in `asyncio.run` (a task queue's worker, a sync view)
    kept every ended loop, and its pool, for good: the pool's keeper refers to its loop."""
    openai_server.script("fake-model", [Reply.text("a"), Reply.text("b"), Reply.text("c")])

    async def one_call() -> weakref.ref[asyncio.AbstractEventLoop]:
        await collect(client(openai_server, "auto").stream(HELLO))
        return weakref.ref(asyncio.get_running_loop())

    loops = [asyncio.run(one_call()) for _ in range(3)]
    gc.collect()

    assert len(_openai_stream._POOLS) == 0  # was: one per loop that ever called
    assert [loop() for loop in loops] == [None, None, None]
