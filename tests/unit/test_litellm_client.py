"""LiteLLMClient against a real OpenAI-compatible HTTP server on 127.0.0.1.

Every test runs on both transports: `auto` (an `openai/...` model streams over turnkit's
own HTTP client) and `litellm` (through `litellm.acompletion`); they must not differ.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import re
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.support import openai_server as fake_openai
from tests.support.openai_server import FakeOpenAIServer, Reply

import turnkit.models
from turnkit.errors import (
    ConfigurationError,
    FamilyExhaustedError,
    ModelCredentialsError,
    ModelUnreachableError,
    ProviderError,
    UnknownModelError,
)
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelMessage,
    ModelRequest,
    ModelSettings,
    RungFailed,
    RungStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallPart,
    ToolSpec,
    _litellm_finish,
)
from turnkit.models.catalog import DEFAULT_FACTS, ModelFacts, model_facts, thinking_budget
from turnkit.models.family import ModelFamily
from turnkit.models.litellm import LiteLLMClient, Transport, resolve_model

openai_server = fake_openai.openai_server  # the fixture, visible to this module's tests

_transport: list[Transport] = ["auto"]  # the transport of the running test


@pytest.fixture(autouse=True, params=["auto", "litellm"])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    _transport[0] = request.param
    yield request.param
    _transport[0] = "auto"


def new_client(model: str, **kwargs: Any) -> LiteLLMClient:
    """A `LiteLLMClient` on the running test's transport."""
    return LiteLLMClient(model, transport=_transport[0], **kwargs)


HELLO = ModelRequest(messages=(ModelMessage(role="user", content="hi"),))
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def client_for(
    server: FakeOpenAIServer,
    model: str = "fake-model",
    *,
    timeout: float = 10.0,
    extra_body: dict[str, object] | None = None,
) -> LiteLLMClient:
    return new_client(
        f"openai/{model}",
        api_base=server.base_url,
        api_key="sk-test",
        timeout=timeout,
        extra_body=extra_body,
    )


async def collect(stream: AsyncIterator[ModelChunk]) -> list[ModelChunk]:
    return [chunk async for chunk in stream]


def text_of(chunks: list[ModelChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


def only_finish(chunks: list[ModelChunk]) -> Finish:
    finishes = [c for c in chunks if isinstance(c, Finish)]
    assert len(finishes) == 1, chunks
    assert chunks[-1] is finishes[0], "Finish must be the last chunk"
    return finishes[0]


# ── streaming ─────────────────────────────────────────────────────────────────────────


async def test_streamed_text_arrives_in_order_in_several_deltas(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("hello world", chunks=5)])

    chunks = await collect(client_for(openai_server).stream(HELLO))

    deltas = [c.text for c in chunks if isinstance(c, TextDelta)]
    assert len(deltas) == 5
    assert "".join(deltas) == "hello world"
    assert only_finish(chunks).stop_reason == "end_turn"


async def test_reasoning_content_streams_as_thinking_before_text(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("42", reasoning="six times seven", chunks=3)])

    chunks = await collect(client_for(openai_server).stream(HELLO))

    thinking = [c for c in chunks if isinstance(c, ThinkingDelta)]
    assert "".join(c.text for c in thinking) == "six times seven"
    assert len(thinking) == 3
    first_text = next(i for i, c in enumerate(chunks) if isinstance(c, TextDelta))
    assert chunks.index(thinking[-1]) < first_text
    assert text_of(chunks) == "42"


async def test_streamed_tool_call_assembles_into_valid_json(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script(
        "fake-model",
        [Reply.tool_call("get_weather", {"city": "Oslo", "unit": "C"}, call_id="call_1", chunks=4)],
    )
    request = ModelRequest(messages=HELLO.messages, tools=(WEATHER,))

    chunks = await collect(client_for(openai_server).stream(request))

    pieces = [c for c in chunks if isinstance(c, ToolCallDelta)]
    with_arguments = [p for p in pieces if p.arguments]
    assert len(with_arguments) >= 3, "arguments must stream in several pieces"
    assert {p.index for p in pieces} == {0}
    assert [p.tool_call_id for p in pieces if p.tool_call_id] == ["call_1"]
    assert [p.name for p in pieces if p.name] == ["get_weather"]
    assert json.loads("".join(p.arguments for p in pieces)) == {"city": "Oslo", "unit": "C"}
    assert text_of(chunks) == ""
    assert only_finish(chunks).stop_reason == "tool_use"


async def test_length_finish_maps_to_max_tokens(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.text("cut sho", finish_reason="length")])

    chunks = await collect(client_for(openai_server).stream(HELLO))

    assert only_finish(chunks).stop_reason == "max_tokens"


async def test_finish_reports_usage_from_the_final_chunk(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(
        "fake-model",
        [Reply.text("ok", prompt_tokens=120, completion_tokens=30, cached_tokens=100)],
    )

    usage = only_finish(await collect(client_for(openai_server).stream(HELLO))).usage

    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (120, 30, 100)
    assert usage.cost_usd == 0.0, "a model without a known price costs 0.0, never an error"
    assert openai_server.requests[0]["stream_options"] == {"include_usage": True}


async def test_a_model_without_a_price_is_reported_once(
    openai_server: FakeOpenAIServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_litellm_finish, "_UNPRICED", set())  # once per process: this one
    openai_server.script("unpriced-model", [Reply.text("a"), Reply.text("b")])
    client = client_for(openai_server, "unpriced-model")

    with caplog.at_level(logging.WARNING, logger="turnkit.models"):
        for _ in range(2):
            assert only_finish(await collect(client.stream(HELLO))).usage.cost_usd == 0.0

    said = [r.getMessage() for r in caplog.records if "no price" in r.getMessage()]
    assert len(said) == 1, said
    assert "unpriced-model" in said[0]
    assert "USD budget limits never stop it" in said[0]


async def test_known_model_gets_a_cost(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("gpt-4o", [Reply.text("ok", prompt_tokens=1000, completion_tokens=100)])

    usage = only_finish(await collect(client_for(openai_server, "gpt-4o").stream(HELLO))).usage

    assert usage.input_tokens == 1000
    assert 0.0 < usage.cost_usd < 1.0


# ── what the provider receives ────────────────────────────────────────────────────────


async def test_request_body_carries_translated_messages_and_tools(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("It is sunny.")])
    request = ModelRequest(
        messages=(
            ModelMessage(role="system", content="Be brief."),
            ModelMessage(role="user", content="Weather in Oslo?"),
            ModelMessage(
                role="assistant",
                tool_calls=(
                    ToolCallPart(
                        tool_call_id="call_9", name="get_weather", arguments='{"city": "Oslo"}'
                    ),
                ),
            ),
            ModelMessage(role="tool", content='{"sky": "clear"}', tool_call_id="call_9"),
        ),
        tools=(WEATHER,),
        max_output_tokens=256,
    )

    chunks = await collect(client_for(openai_server).stream(request))

    assert text_of(chunks) == "It is sunny."
    (body,) = openai_server.requests
    assert body["model"] == "fake-model"
    assert body["stream"] is True
    assert body["max_tokens"] == 256
    messages = body["messages"]
    assert isinstance(messages, list)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Weather in Oslo?"}
    assert messages[2]["role"] == "assistant"
    assert not messages[2].get("content")
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    assert messages[3] == {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_9"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]


async def test_thinking_budget_is_not_sent_to_a_model_without_reasoning(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("ok")])
    request = ModelRequest(messages=HELLO.messages, thinking_budget=4096)

    await collect(client_for(openai_server).stream(request))

    (body,) = openai_server.requests
    assert "reasoning_effort" not in body
    assert "thinking" not in body


async def test_thinking_budget_becomes_reasoning_effort_for_a_reasoning_model(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("o3-mini", [Reply.text("ok"), Reply.text("ok")])
    client = client_for(openai_server, "o3-mini")

    await collect(client.stream(ModelRequest(messages=HELLO.messages, thinking_budget=16384)))
    await collect(client.stream(HELLO))

    with_budget, without = openai_server.requests
    assert with_budget["reasoning_effort"] == "high"
    assert "reasoning_effort" not in without


async def test_extra_body_is_sent_as_is(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.text("ok")])
    client = client_for(openai_server, extra_body={"metadata_tag": "turnkit-test"})

    await collect(client.stream(HELLO))

    assert openai_server.requests[0]["metadata_tag"] == "turnkit-test"


# ── failures ──────────────────────────────────────────────────────────────────────────


async def test_rate_limit_is_retriable_429_without_internal_retries(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.error(429, "slow down")])

    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        await collect(client_for(openai_server).stream(HELLO))

    assert caught.value.status_code == 429
    assert caught.value.is_retriable is True
    assert "'openai/fake-model'" in caught.value.message
    assert "give the agent a fallback model (a ModelFamily)" in caught.value.message
    assert len(openai_server.requests) == 1, "litellm must not retry on its own"
    assert time.monotonic() - started < 5


async def test_server_error_is_retriable(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.error(500)])

    with pytest.raises(ProviderError) as caught:
        await collect(client_for(openai_server).stream(HELLO))

    assert caught.value.status_code == 500
    assert caught.value.is_retriable is True
    assert len(openai_server.requests) == 1


@pytest.mark.parametrize(
    ("status", "hint"), [(400, "rejected"), (401, "api_key"), (404, "api_base")]
)
async def test_client_errors_are_not_retriable(
    openai_server: FakeOpenAIServer, status: int, hint: str
) -> None:
    openai_server.script("fake-model", [Reply.error(status, "nope")])

    with pytest.raises(ProviderError) as caught:
        await collect(client_for(openai_server).stream(HELLO))

    assert caught.value.status_code == status
    assert caught.value.is_retriable is False
    assert "'openai/fake-model'" in caught.value.message
    assert hint in caught.value.message


async def test_a_404_from_an_api_base_without_v1_says_so(
    openai_server: FakeOpenAIServer,
) -> None:
    """`--api-base http://127.0.0.1:8000` for a server that serves `/v1/chat/completions`."""
    root = openai_server.base_url.removesuffix("/v1")
    client = new_client("openai/fake-model", api_base=root, api_key="none")
    with pytest.raises(ProviderError) as caught:
        await collect(client.stream(HELLO))
    assert caught.value.status_code == 404
    assert (
        f"check the model and api_base ({root}: if that server serves its API under /v1, "
        "add /v1 to the address)" in caught.value.message
    )
    openai_server.script("fake-model", [Reply.error(404, "no such model")])
    with pytest.raises(ProviderError) as caught:  # at /v1 already: no such hint
        await collect(client_for(openai_server).stream(HELLO))
    assert "add /v1" not in caught.value.message


async def test_credentials_a_provider_echoes_are_not_passed_on(
    openai_server: FakeOpenAIServer,
) -> None:
    """A provider's (or a proxy's) error text reaches end users: no credential in it."""
    echoed = (
        "Incorrect API key provided: Basic cHJveHl1c2VyOnByb3h5cGFzcw== via "
        "https://proxyuser:proxypass@proxy.internal/v1 (key sk-live1234567890abcdef)"
    )
    openai_server.script("fake-model", [Reply.error(400, echoed)])
    with pytest.raises(ProviderError) as caught:
        await collect(client_for(openai_server).stream(HELLO))
    message = caught.value.message
    assert "Provider said: " in message
    assert "Incorrect API key provided: Basic ***" in message
    for secret in ("cHJveHl1c2Vy", "proxypass", "sk-live1234567890abcdef"):
        assert secret not in message
    assert "https://***@proxy.internal/v1" in message


def test_ordinary_provider_words_are_not_taken_for_credentials() -> None:
    from turnkit.models._errors import redact_secrets

    for said in (
        "Basic authentication failed",
        "Missing bearer authentication",
        "Invalid token: expected JSON",
        "max_tokens=4096 is more than the model allows",
    ):
        assert redact_secrets(said) == said
    assert redact_secrets("password: hunter2x9") == "password: ***"


async def test_exhausted_script_answers_500_naming_the_model(
    openai_server: FakeOpenAIServer,
) -> None:
    with pytest.raises(ProviderError) as caught:
        await collect(client_for(openai_server).stream(HELLO))

    assert caught.value.status_code == 500
    assert "no scripted reply left for model 'fake-model'" in caught.value.message


async def test_a_refused_connection_names_the_address_and_is_not_retried() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"http://127.0.0.1:{port}/v1"
    client = new_client("openai/fake-model", api_base=address, api_key="sk", timeout=5)

    started = time.perf_counter()
    with pytest.raises(ModelUnreachableError) as caught:
        await collect(client.stream(HELLO))

    assert time.perf_counter() - started < 3  # no retries with backoff
    assert caught.value.code == "model-unreachable"
    assert caught.value.is_retriable is False
    assert address in caught.value.message
    assert caught.value.address == address


async def test_a_refused_connection_names_the_address_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no api_base the call goes to $OPENAI_BASE_URL: the error names that address."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"http://127.0.0.1:{port}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", address)
    client = new_client("openai/fake-model", api_key="sk", timeout=5)

    with pytest.raises(ModelUnreachableError) as caught:
        await collect(client.stream(HELLO))

    assert address in caught.value.message
    assert caught.value.address == address
    assert "default URL" not in caught.value.message
    # It names what to check in the words the address was set with, not an argument not given.
    assert "is OPENAI_BASE_URL right?" in caught.value.message


async def test_a_404_names_the_variable_the_address_came_from(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`turnkit serve` with `OPENAI_BASE_URL` and a model the server does not have."""
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    openai_server.script("fake-model", [Reply.error(404, "no such model")])
    with pytest.raises(ProviderError) as caught:
        await collect(new_client("openai/fake-model", api_key="sk").stream(HELLO))
    assert "check the model and OPENAI_BASE_URL." in caught.value.message
    root = openai_server.base_url.removesuffix("/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", root)
    with pytest.raises(ProviderError) as caught:
        await collect(new_client("openai/fake-model", api_key="sk").stream(HELLO))
    assert f"check the model and OPENAI_BASE_URL ({root}: if that server" in caught.value.message


async def test_stalled_stream_times_out_as_retriable(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.text("hello world", stall=True)])
    client = client_for(openai_server, timeout=0.5)

    seen: list[ModelChunk] = []

    async def consume() -> None:
        async for chunk in client.stream(HELLO):
            seen.append(chunk)

    with pytest.raises(ProviderError) as caught:
        await consume()

    assert caught.value.is_retriable is True
    assert caught.value.status_code == 408
    assert not any(isinstance(c, Finish) for c in seen)


# ── family cascade ────────────────────────────────────────────────────────────────────


async def test_family_walks_to_the_second_rung_after_a_429(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("rung-a", [Reply.error(429)])
    openai_server.script("rung-b", [Reply.text("from rung b", chunks=3)])
    family = ModelFamily(
        "test", [client_for(openai_server, "rung-a"), client_for(openai_server, "rung-b")]
    )

    chunks = await collect(family.stream(HELLO))

    started = [c for c in chunks if isinstance(c, RungStarted)]
    failed = [c for c in chunks if isinstance(c, RungFailed)]
    assert [(s.rung, s.model, s.provider) for s in started] == [
        (0, "openai/rung-a", "openai"),
        (1, "openai/rung-b", "openai"),
    ]
    assert [(f.rung, f.next_rung, f.next_model) for f in failed] == [(0, 1, "openai/rung-b")]
    assert isinstance(failed[0].error, ProviderError)
    assert failed[0].error.status_code == 429
    assert chunks.index(started[0]) < chunks.index(failed[0]) < chunks.index(started[1])
    first_text = next(i for i, c in enumerate(chunks) if isinstance(c, TextDelta))
    assert chunks.index(started[1]) < first_text
    assert text_of(chunks) == "from rung b"
    assert only_finish(chunks).stop_reason == "end_turn"
    assert [r["model"] for r in openai_server.requests] == ["rung-a", "rung-b"]


# ── cancellation ──────────────────────────────────────────────────────────────────────


async def server_saw_disconnect(server: FakeOpenAIServer) -> bool:
    return await asyncio.to_thread(server.wait_for_disconnects, 1, 5.0)


async def test_cancelling_the_consumer_closes_the_http_stream(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("hello world", chunks=5, stall=True)])
    first = asyncio.Event()

    async def consume() -> None:
        async for chunk in client_for(openai_server).stream(HELLO):
            if isinstance(chunk, TextDelta):
                first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert await server_saw_disconnect(openai_server)
    assert openai_server.disconnects == 1


async def test_closing_the_stream_early_closes_the_http_stream(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.script("fake-model", [Reply.text("hello world", chunks=5, stall=True)])
    stream = client_for(openai_server).stream(HELLO)
    assert isinstance(stream, AsyncGenerator)

    async for chunk in stream:
        if isinstance(chunk, TextDelta):
            break
    await stream.aclose()

    assert await server_saw_disconnect(openai_server)
    assert openai_server.disconnects == 1


# ── model resolution and the network guard ────────────────────────────────────────────


def test_unresolvable_model_raises_unknown_model_error() -> None:
    with pytest.raises(UnknownModelError) as caught:
        resolve_model("definitely-not-a-provider-model-xyz")

    message = caught.value.message
    assert "'definitely-not-a-provider-model-xyz'" in message
    assert "openai/" in message
    assert "turnkit.testing.ScriptedModel" in message
    # `turnkit serve` and `turnkit worker` take the model from $TURNKIT_MODEL, not --model.
    assert "the demo model (no --model, TURNKIT_MODEL unset)" in message


def test_client_construction_fails_for_an_unresolvable_model() -> None:
    with pytest.raises(UnknownModelError):
        new_client("definitely-not-a-provider-model-xyz")


def test_resolve_model_returns_the_provider() -> None:
    assert resolve_model("openai/fake-model") == "openai"
    assert resolve_model("anthropic/claude-sonnet-4-5") == "anthropic"


@pytest.mark.parametrize("api_base", ["https://api.example.com/v1", None])
async def test_network_guard_refuses_non_loopback_calls(
    monkeypatch: pytest.MonkeyPatch, api_base: str | None
) -> None:
    monkeypatch.setattr(turnkit.models, "ALLOW_NETWORK", False)
    client = new_client("openai/fake-model", api_base=api_base, api_key="sk-test")

    with pytest.raises(ConfigurationError) as caught:
        await collect(client.stream(HELLO))

    assert "ALLOW_NETWORK" in caught.value.message
    assert "'openai/fake-model'" in caught.value.message


async def test_network_guard_allows_loopback(
    monkeypatch: pytest.MonkeyPatch, openai_server: FakeOpenAIServer
) -> None:
    monkeypatch.setattr(turnkit.models, "ALLOW_NETWORK", False)
    openai_server.script("fake-model", [Reply.text("local")])

    chunks = await collect(client_for(openai_server).stream(HELLO))

    assert text_of(chunks) == "local"


async def test_network_guard_reads_the_base_url_of_the_environment(
    monkeypatch: pytest.MonkeyPatch, openai_server: FakeOpenAIServer
) -> None:
    """With no api_base, both transports send to $OPENAI_BASE_URL: so does the guard look."""
    monkeypatch.setattr(turnkit.models, "ALLOW_NETWORK", False)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.base_url)
    openai_server.script("fake-model", [Reply.text("local via env")])

    chunks = await collect(new_client("openai/fake-model", api_key="sk-test").stream(HELLO))

    assert text_of(chunks) == "local via env"


# ── catalog ───────────────────────────────────────────────────────────────────────────

REASONING = ModelFacts(context_window=200_000, max_output_tokens=100_000, supports_reasoning=True)


@pytest.mark.parametrize(
    ("effort", "budget"), [("off", 0), ("low", 1024), ("medium", 4096), ("high", 16384)]
)
def test_thinking_budget_levels(effort: str, budget: int) -> None:
    assert thinking_budget(effort, REASONING) == budget  # type: ignore[arg-type]


def test_thinking_budget_is_zero_without_reasoning() -> None:
    facts = ModelFacts(context_window=128_000, max_output_tokens=16_384, supports_reasoning=False)

    assert thinking_budget("high", facts) == 0


@pytest.mark.parametrize("max_output", [2048, 4096, 8192, 16384, 20000])
def test_thinking_budget_stays_below_the_output_limit(max_output: int) -> None:
    facts = ModelFacts(
        context_window=128_000, max_output_tokens=max_output, supports_reasoning=True
    )

    budget = thinking_budget("high", facts)

    assert 1024 <= budget < max_output
    assert budget <= max_output // 2, "the answer keeps at least half of the output limit"


def test_thinking_budget_is_off_when_the_output_limit_is_tiny() -> None:
    facts = ModelFacts(context_window=8_000, max_output_tokens=1500, supports_reasoning=True)

    assert thinking_budget("low", facts) == 0


def test_model_facts_for_known_and_unknown_models() -> None:
    known = model_facts("openai/o3-mini")
    assert known.supports_reasoning is True
    assert known.context_window > known.max_output_tokens > 4096

    assert model_facts("openai/definitely-not-a-real-model") == DEFAULT_FACTS
    assert (DEFAULT_FACTS.context_window, DEFAULT_FACTS.max_output_tokens) == (128_000, 4_096)
    assert DEFAULT_FACTS.supports_reasoning is False


def test_a_local_models_context_window_is_given_or_said_to_be_assumed(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnkit.models import litellm as client_module
    from turnkit.models.litellm import ModelEndpoint

    monkeypatch.setattr(client_module, "_UNKNOWN_WINDOWS", set())
    local = "openai/my-local-llama"
    given = LiteLLMClient(local, api_base="http://127.0.0.1:9/v1", context_window=8_192)
    assert given.context_window == 8_192
    endpoint = ModelEndpoint(model=local, api_base="http://127.0.0.1:9/v1", context_window=4_096)
    assert endpoint.client().context_window == 4_096
    with caplog.at_level(logging.WARNING, logger="turnkit.models"):
        assumed = LiteLLMClient(local, api_base="http://127.0.0.1:9/v1")
        assert assumed.context_window == assumed.context_window == 128_000
    said = [r.getMessage() for r in caplog.records if "not in litellm's catalog" in r.getMessage()]
    assert len(said) == 1  # once per model
    assert "context_window" in said[0]
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ConfigurationError, match="context_window"):
            LiteLLMClient(local, context_window=bad)  # type: ignore[arg-type]


# ── model settings, endpoints and credentials ──────────────────────────────────────


async def test_settings_reach_the_request_body(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.text("ok")])
    settings = ModelSettings(temperature=0.2, top_p=0.9, max_tokens=321, seed=7, stop=("END",))

    await collect(client_for(openai_server).stream(replace(HELLO, settings=settings)))

    body = openai_server.requests[0]
    assert body["temperature"] == 0.2
    assert body["top_p"] == 0.9
    assert body["max_tokens"] == 321
    assert body["seed"] == 7
    assert body["stop"] == ["END"]
    assert "presence_penalty" not in body  # unset fields are not sent


def test_settings_refuse_out_of_range_and_unknown_fields() -> None:
    with pytest.raises(ValueError, match="temperature"):
        ModelSettings(temperature=3.0)
    with pytest.raises(ValueError, match="temprature"):
        ModelSettings.model_validate({"temprature": 0.5})
    merged = ModelSettings(temperature=0.1, seed=1).merged(ModelSettings(temperature=0.9))
    assert (merged.temperature, merged.seed) == (0.9, 1)


async def test_headers_and_a_key_from_a_named_variable_reach_the_server(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNKIT_TEST_PROXY_KEY", "sk-from-env")
    openai_server.script("fake-model", [Reply.text("ok")])
    client = new_client(
        "openai/fake-model",
        api_base=openai_server.base_url,
        api_key_env="TURNKIT_TEST_PROXY_KEY",
        headers={"X-Route": "team-a"},
    )

    await collect(client.stream(HELLO))

    headers = openai_server.headers[0]
    assert headers["authorization"] == "Bearer sk-from-env"
    assert headers["x-route"] == "team-a"


async def test_a_missing_key_fails_at_once_naming_the_variable(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNKIT_TEST_UNSET_KEY", raising=False)
    named = new_client(
        "openai/fake-model", api_base=openai_server.base_url, api_key_env="TURNKIT_TEST_UNSET_KEY"
    )
    with pytest.raises(ModelCredentialsError, match="TURNKIT_TEST_UNSET_KEY") as caught:
        await collect(named.stream(HELLO))
    assert caught.value.code == "model-credentials"
    assert caught.value.is_retriable is False

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    default = new_client("openai/fake-model", api_base=openai_server.base_url)
    with pytest.raises(ModelCredentialsError, match="OPENAI_API_KEY") as caught:
        await collect(default.stream(HELLO))
    assert "needs no key takes any text" in str(caught.value)  # a local server's way out
    assert openai_server.requests == []  # found before any request left
    # A variable set to nothing is no key (a `.env` line `OPENAI_API_KEY=` sets it so).
    monkeypatch.setenv("OPENAI_API_KEY", " ")
    blank = new_client("openai/fake-model", api_base=openai_server.base_url)
    with pytest.raises(ModelCredentialsError, match="set the environment variable OPENAI_API_KEY"):
        await collect(blank.stream(HELLO))
    assert openai_server.requests == []
    keyless = new_client("openai/fake-model", api_base=openai_server.base_url, api_key="none")
    openai_server.script("fake-model", [Reply.text("Hi.")])
    assert await collect(keyless.stream(HELLO))


@pytest.mark.parametrize("variable", ["OPENAI_BASE_URL", "OPENAI_API_BASE"])
async def test_a_missing_key_for_a_server_named_by_the_environment_says_any_text_will_do(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """`OPENAI_BASE_URL=... turnkit run --model openai/x`: the way out is named, as for api_base."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    monkeypatch.setenv(variable, openai_server.base_url)
    client = new_client("openai/fake-model")
    with pytest.raises(ModelCredentialsError) as caught:
        await collect(client.stream(HELLO))
    assert caught.value.message.endswith(
        f"; a server at {variable} that needs no key takes any text as one (OPENAI_API_KEY=none)"
    )
    assert openai_server.requests == []


async def test_a_refused_key_is_a_credentials_error(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("fake-model", [Reply.error(401, "Incorrect API key provided")])

    with pytest.raises(ModelCredentialsError, match="refused the API key") as caught:
        await collect(client_for(openai_server).stream(HELLO))

    assert caught.value.status_code == 401
    assert len(openai_server.requests) == 1  # not retried


async def test_a_refused_connection_walks_to_the_fallback_and_bad_credentials_do_not(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider restarting refuses connections: what a fallback is for. A refused key
    would be refused again, and a family of one refused rung says where it tried."""
    monkeypatch.delenv("TURNKIT_TEST_UNSET_KEY", raising=False)
    openai_server.script("second", [Reply.text("from the second rung")])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fallback = client_for(openai_server, "second")
    keyless = new_client(
        "openai/first", api_base=openai_server.base_url, api_key_env="TURNKIT_TEST_UNSET_KEY"
    )
    refused = new_client("openai/first", api_base=f"http://127.0.0.1:{port}/v1", api_key="k")

    with pytest.raises(ModelCredentialsError):
        await collect(ModelFamily("f", [keyless, fallback]).stream(HELLO))
    assert openai_server.requests == []

    chunks = await collect(ModelFamily("f", [refused, fallback]).stream(HELLO))
    [failed] = [c for c in chunks if isinstance(c, RungFailed)]
    assert isinstance(failed.error, ModelUnreachableError)
    assert failed.next_model == "openai/second"
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "from the second rung"

    with pytest.raises(ModelUnreachableError):  # the last rung: raised as it is
        await collect(ModelFamily("f", [refused]).stream(HELLO))
    strict = ModelFamily("f", [refused, fallback], is_retriable=lambda exc: False)
    with pytest.raises(ModelUnreachableError):  # a predicate of your own decides alone
        await collect(strict.stream(HELLO))


async def test_a_family_that_runs_out_names_each_failure_once(
    openai_server: FakeOpenAIServer,
) -> None:
    for model in ("one", "two"):
        openai_server.script(model, [Reply.error(503, "overloaded, try later")])
    openai_server.script("three", [Reply.error(400, "bad tools")])
    rungs = [client_for(openai_server, m) for m in ("one", "two", "three")]

    with pytest.raises(FamilyExhaustedError) as exhausted:
        await collect(ModelFamily("f", rungs[:2]).stream(HELLO))

    # One line per way of failing, after the rungs that failed that way, no advice repeated.
    message = exhausted.value.message
    assert message.startswith(
        "every rung of model family 'f' failed (openai/one, openai/two: HTTP 503: the "
        "provider had a server error. Provider said: "
    ), message
    assert "overloaded, try later" in message
    assert message.count("HTTP 503") == 1
    assert message.count("retry later") == 0
    assert message.endswith(
        "Retry later, or pick another family: turnkit never widens a cascade on its own"
    )
    # A failure that is not retriable is the rung's own: it does not walk the family.
    with pytest.raises(ProviderError) as refused:
        await collect(ModelFamily("g", [rungs[2], rungs[0]]).stream(HELLO))
    assert refused.value.brief is not None
    assert refused.value.brief.startswith("HTTP 400: the provider rejected the request")


async def test_a_providers_retry_after_is_kept_and_reported(
    openai_server: FakeOpenAIServer,
) -> None:
    in_a_minute = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=60), True)
    openai_server.script("one", [Reply.error(429, "slow down", retry_after="20")])
    openai_server.script("two", [Reply.error(503, "overloaded", retry_after=in_a_minute)])
    openai_server.script("three", [Reply.error(503, "overloaded")])
    rungs = [client_for(openai_server, m) for m in ("one", "two", "three")]

    with pytest.raises(FamilyExhaustedError) as lone:
        await collect(ModelFamily("f", rungs[:1]).stream(HELLO))
    assert lone.value.details["retry_after_s"] == 20.0
    assert "the provider is rate limiting (it asked to wait 20 s)" in lone.value.message

    with pytest.raises(FamilyExhaustedError) as both:
        await collect(ModelFamily("f", rungs[1:2]).stream(HELLO))
    assert 55 <= both.value.details["retry_after_s"] <= 60  # an HTTP date: from now
    assert re.search(r"\(it asked to wait (5[5-9]|60) s\)", both.value.message)  # whole seconds

    # A rung that said nothing about waiting: no wait is known for the family.
    openai_server.script("one", [Reply.error(429, "slow down", retry_after="20")])
    with pytest.raises(FamilyExhaustedError) as mixed:
        await collect(ModelFamily("f", [rungs[0], rungs[2]]).stream(HELLO))
    assert "retry_after_s" not in mixed.value.details


async def test_each_rung_reaches_its_own_api_base(openai_server: FakeOpenAIServer) -> None:
    with FakeOpenAIServer() as other:
        openai_server.script("primary", [Reply.error(503, "overloaded")])
        other.script("backup", [Reply.text("from the backup server")])
        family = ModelFamily(
            "two-servers", [client_for(openai_server, "primary"), client_for(other, "backup")]
        )

        chunks = await collect(family.stream(HELLO))

        assert text_of(chunks) == "from the backup server"
        assert [r["model"] for r in openai_server.requests] == ["primary"]
        assert [r["model"] for r in other.requests] == ["backup"]
