"""A note added mid-conversation reaches a one-system-prompt provider where it stands.

Over real HTTP to small Gemini- and Anthropic-style servers on 127.0.0.1 (litellm's
`gemini` and `anthropic` providers with `api_base`). litellm moves every system message
into Gemini's one `system_instruction`, so turnkit sends a note (a plan, a skill, a
plugin's) as a user message marked as an operator's note; for Anthropic litellm does the
same itself. Either way the system prompt stays the agent's instructions, turn to turn.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, ClassVar

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.conftest import RuntimeFactory
from tests.support.openai_server import FakeOpenAIServer, Reply
from tests.support.server import serve
from turnkit import Agent
from turnkit.models._chat_format import NOTE_PREFIX
from turnkit.models.litellm import LiteLLMClient
from turnkit.plugins import ModelCallView, Plugin, PluginContext
from turnkit.testing import collect_events

NOTE = "Answer in one short sentence."


class Reminder(Plugin):
    name: ClassVar[str] = "reminder"

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str] | None:
        return [NOTE]


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _anthropic_app(bodies: list[dict[str, Any]]) -> Starlette:
    async def messages(request: Request) -> StreamingResponse:
        body = await request.json()
        bodies.append(body)

        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 9, "output_tokens": 1},
        }
        events = [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "Hi."}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": 2}},
            {"type": "message_stop"},
        ]  # fmt: skip

        async def stream() -> AsyncIterator[bytes]:
            for event in events:
                yield _sse(str(event["type"]), event)

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


def _gemini_app(bodies: list[dict[str, Any]]) -> Starlette:
    async def generate(request: Request) -> StreamingResponse:
        bodies.append(await request.json())
        answer = {
            "candidates": [{"content": {"parts": [{"text": "Hi."}], "role": "model"},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 2,
                              "totalTokenCount": 11},
        }  # fmt: skip

        async def stream() -> AsyncIterator[bytes]:
            yield f"data: {json.dumps(answer)}\n\n".encode()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/{path:path}", generate, methods=["POST"])])


@pytest.fixture
def gemini() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    with serve(_gemini_app(bodies)) as url:
        yield url, bodies


@pytest.fixture
def anthropic() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    with serve(_anthropic_app(bodies)) as url:
        yield url, bodies


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    assert isinstance(content, list)
    return "".join(part.get("text", "") for part in content)


async def _two_turns(runtime_factory: RuntimeFactory, model: LiteLLMClient) -> None:
    agent = Agent(
        model=model,
        instructions="You are terse.",
        plugins=[Reminder()],
        skip_stages=frozenset({"anchor-plan"}),
    )
    runtime = runtime_factory(agent)
    for text in ("first question", "second question"):
        events = await collect_events(runtime.execute_message("s1", text))
        assert events[-1].status == "succeeded"  # type: ignore[attr-defined]


def _in_order(said: str) -> None:
    """Each turn's note after that turn's message, marked as not the person's words."""
    assert said.index("first question") < said.index(NOTE) < said.index("second question")
    assert said.count(NOTE_PREFIX) == 2


async def test_a_note_stays_where_it_was_added_on_gemini(
    runtime_factory: RuntimeFactory, gemini: tuple[str, list[dict[str, Any]]]
) -> None:
    url, bodies = gemini
    await _two_turns(
        runtime_factory, LiteLLMClient("gemini/gemini-2.5-flash", api_base=url, api_key="k")
    )
    assert len(bodies) == 2
    systems = [json.dumps(body["system_instruction"]) for body in bodies]
    assert systems == [systems[0]] * 2  # the prompt's start does not move
    assert NOTE not in systems[0]
    assert "You are terse." in systems[0]
    parts = [p.get("text", "") for c in bodies[1]["contents"] for p in c["parts"]]
    _in_order("\n".join(parts))


async def test_litellm_keeps_a_note_in_place_on_anthropic_itself(
    runtime_factory: RuntimeFactory, anthropic: tuple[str, list[dict[str, Any]]]
) -> None:
    url, bodies = anthropic
    await _two_turns(
        runtime_factory, LiteLLMClient("anthropic/claude-test", api_base=url, api_key="sk-ant")
    )
    systems = [_text(body["system"]) for body in bodies]
    assert systems == [systems[0]] * 2
    assert NOTE not in systems[0]
    _in_order("\n".join(_text(m["content"]) for m in bodies[1]["messages"]))


async def test_an_openai_style_provider_still_gets_the_note_as_a_system_message(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    openai_server.script("gpt-fake", [Reply.text("Hi.")])
    model = LiteLLMClient("openai/gpt-fake", api_base=openai_server.base_url, api_key="sk")
    agent = Agent(model=model, plugins=[Reminder()], skip_stages=frozenset({"anchor-plan"}))
    runtime = runtime_factory(agent)
    await collect_events(runtime.execute_message("s1", "first question"))
    [request] = openai_server.requests
    roles = [(m["role"], m["content"]) for m in request["messages"]]  # type: ignore[union-attr, index]
    assert roles[-1] == ("system", NOTE)
