"""The agent loop on the litellm path, over real HTTP to the local OpenAI-compatible server:
call counts, the answer streamed once, and request bodies that only append (byte for byte)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from tests.helpers import add
from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit import Agent, ImagePart, ModelFamily, RuntimeConfig, SessionRuntime, TextPart, tool
from turnkit.events import DoneEvent, MessageCompleteEvent, MessageDeltaEvent
from turnkit.models.litellm import LiteLLMClient
from turnkit.testing import collect_events


def _client(server: FakeOpenAIServer, name: str) -> LiteLLMClient:
    return LiteLLMClient(f"openai/{name}", api_base=server.base_url, api_key="sk-test")


def _messages(body: dict[str, object]) -> list[str]:
    """The request's messages as the bytes the provider received (one JSON text each)."""
    messages = body["messages"]
    assert isinstance(messages, list)
    return [json.dumps(m, sort_keys=True) for m in messages]


def _extends(after: dict[str, object], before: dict[str, object]) -> bool:
    old, new = _messages(before), _messages(after)
    same_tools = json.dumps(after.get("tools"), sort_keys=True) == json.dumps(
        before.get("tools"), sort_keys=True
    )
    return new[: len(old)] == old and same_tools


async def test_a_no_tool_turn_is_one_request_streamed_once(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    openai_server.script("m", [Reply.text("Oslo is in Norway.", chunks=4)])
    agent = Agent(model=_client(openai_server, "m"), tools=[add])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "Where is Oslo?"))
        [turn] = await runtime.history("s1")
    assert len(openai_server.requests) == 1
    deltas = [e.text for e in events if isinstance(e, MessageDeltaEvent)]
    assert "".join(deltas) == "Oslo is in Norway."
    assert len(deltas) == 4
    [complete] = [e for e in events if isinstance(e, MessageCompleteEvent)]
    assert complete.block.is_answer
    assert turn.answer == "Oslo is in Norway."
    assert sum(1 for b in turn.blocks if getattr(b, "text", None) == "Oslo is in Norway.") == 1


async def test_requests_only_append_across_turns_a_restart_and_a_fallback(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'conv.db'}"
    openai_server.script(
        "big",
        [
            Reply.tool_call("add", {"a": 1, "b": 2}, call_id="call_1"),
            Reply.text("1 + 2 = 3."),
            Reply.text("Glad to help."),
            Reply.error(429),  # turn 3, after the restart: the first rung is busy ...
            Reply.error(429),  # ... for both of its calls (each call starts at rung 0)
        ],
    )
    openai_server.script(
        "small",
        [Reply.tool_call("add", {"a": 3, "b": 4}, call_id="call_2"), Reply.text("3 + 4 = 7.")],
    )

    def agent() -> Agent:
        family = ModelFamily(
            "gpt", [_client(openai_server, "big"), _client(openai_server, "small")]
        )
        return Agent(model=family, tools=[add])

    async with SessionRuntime(agent=agent(), config=RuntimeConfig(database_url=url)) as runtime:
        await collect_events(runtime.execute_message("s1", "What is 1 + 2?"))
        await collect_events(runtime.execute_message("s1", "Thanks!"))
    # The process restarts; the next turn's first rung is rate-limited.
    async with SessionRuntime(agent=agent(), config=RuntimeConfig(database_url=url)) as runtime:
        events = await collect_events(runtime.execute_message("s1", "And 3 + 4?"))
        assert isinstance(events[-1], DoneEvent)
        assert events[-1].status == "succeeded"
        assert [t.answer for t in await runtime.history("s1")] == [
            "1 + 2 = 3.",
            "Glad to help.",
            "3 + 4 = 7.",
        ]
    bodies = openai_server.requests
    assert [b["model"] for b in bodies] == ["big", "big", "big", "big", "small", "big", "small"]
    for refused, answered in ((bodies[3], bodies[4]), (bodies[5], bodies[6])):
        assert _messages(refused) == _messages(answered)  # only the model changed
    served = [b for i, b in enumerate(bodies) if i not in (3, 5)]
    for before, after in zip(served, served[1:], strict=False):
        assert _extends(after, before), "a request rewrote bytes an earlier one sent"
    # Turn 2 carries turn 1's tool call and result exactly as the provider first saw them.
    turn2 = json.loads(_messages(bodies[2])[2])
    assert turn2["tool_calls"][0]["id"] == "call_1"


@tool
async def snapshot() -> ImagePart:
    """A picture of the screen."""
    return ImagePart(data=b"\x89PNG-screen", media_type="image/png")


async def test_pictures_reach_the_provider_in_its_multimodal_form(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    openai_server.script(
        "m", [Reply.tool_call("snapshot", {}, call_id="call_s"), Reply.text("I see it.")]
    )
    agent = Agent(model=_client(openai_server, "m"), tools=[snapshot])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'p.db'}")
    photo = ImagePart(data=b"\xff\xd8user-photo", media_type="image/jpeg")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await collect_events(
            runtime.execute_message("s1", [TextPart(text="Compare these."), photo])
        )
    first, second = openai_server.requests
    messages = first["messages"]
    assert isinstance(messages, list)
    user = messages[-1]
    assert user["content"] == [
        {"type": "text", "text": "Compare these."},
        {
            "type": "image_url",
            "image_url": {
                "url": "data:image/jpeg;base64," + base64.b64encode(photo.data or b"").decode()
            },
        },
    ]
    later = second["messages"]
    assert isinstance(later, list)
    tool_message, pictures = later[-2], later[-1]
    assert tool_message["role"] == "tool"
    assert isinstance(tool_message["content"], str)  # OpenAI tool messages carry text only
    assert pictures["role"] == "user"
    assert pictures["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert _extends(second, first)
