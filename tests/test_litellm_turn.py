"""A whole turn on the litellm path, over real HTTP to the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import RuntimeFactory
from tests.helpers import add
from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit import Agent, ModelFamily, RuntimeConfig
from turnkit.events import (
    DoneEvent,
    MessageDeltaEvent,
    ProviderCascadeEvent,
    ToolCompletedEvent,
    ToolDeltaEvent,
    UsageEvent,
)
from turnkit.models.litellm import LiteLLMClient
from turnkit.testing import collect_events


def _client(server: FakeOpenAIServer, name: str) -> LiteLLMClient:
    return LiteLLMClient(f"openai/{name}", api_base=server.base_url, api_key="sk-test")


async def test_tool_using_turn_over_http(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    openai_server.script(
        "fake-model",
        [
            Reply.tool_call("add", {"a": 20, "b": 22}, call_id="call_abc", chunks=5),
            Reply.text("The answer is 42.", chunks=4, prompt_tokens=50, completion_tokens=6),
        ],
    )
    runtime = runtime_factory(Agent(model=_client(openai_server, "fake-model"), tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "What is 20 + 22?"))

    assert any(isinstance(e, ToolDeltaEvent) for e in events)
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.tool_call_id == "call_abc"
    assert completed.result.output == 42
    answer_deltas = [
        e.text for e in events if isinstance(e, MessageDeltaEvent) and e.stage_id == "tool-loop"
    ]
    assert len(answer_deltas) == 4
    assert "".join(answer_deltas) == "The answer is 42."
    [usage] = [e for e in events if isinstance(e, UsageEvent)]
    assert usage.model_calls == 2  # the loop's last call wrote the answer
    assert usage.input_tokens == 11 + 50
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    # What the provider received: the tool result went back as a tool message.
    second = openai_server.requests[1]
    messages = second["messages"]
    assert isinstance(messages, list)
    tool_message = messages[-1]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_abc"
    assert json.loads(tool_message["content"]) == 42
    assert len(openai_server.requests) == 2


async def test_parallel_tool_calls_in_one_reply_each_run_and_answer_their_own_id(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    # The provider streams three calls at once, their argument deltas interleaved and
    # named by index only: each must be put back together on its own.
    openai_server.script(
        "fake-model",
        [
            Reply.tool_calls(
                [("add", {"a": 1, "b": 2}), ("add", {"a": 30, "b": 40}), ("add", {"a": 5, "b": 6})],
                call_ids=["call_x", "call_y", "call_z"],
                chunks=4,
            ),
            Reply.text("3, 70 and 11."),
        ],
    )
    runtime = runtime_factory(Agent(model=_client(openai_server, "fake-model"), tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "Add three pairs."))

    completed = {
        e.tool_call_id: e.result.output for e in events if isinstance(e, ToolCompletedEvent)
    }
    assert completed == {"call_x": 3, "call_y": 70, "call_z": 11}
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    messages = openai_server.requests[1]["messages"]
    assert isinstance(messages, list)
    [asked] = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert [c["id"] for c in asked["tool_calls"]] == ["call_x", "call_y", "call_z"]
    assert [json.loads(c["function"]["arguments"]) for c in asked["tool_calls"]] == [
        {"a": 1, "b": 2},
        {"a": 30, "b": 40},
        {"a": 5, "b": 6},
    ]
    answers = {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}
    assert answers == {"call_x": 3, "call_y": 70, "call_z": 11}


async def test_parallel_tool_calls_a_server_sends_without_index_stay_apart(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    # Some OpenAI-compatible servers send each call whole in a chunk of its own with no
    # `index`: every call then arrives at position 0 and must not be joined to the last.
    openai_server.script(
        "fake-model",
        [
            Reply.tool_calls(
                [("add", {"a": 1, "b": 2}), ("add", {"a": 30, "b": 40})],
                call_ids=["call_x", "call_y"],
                unindexed=True,
            ),
            Reply.text("3 and 70."),
        ],
    )
    runtime = runtime_factory(Agent(model=_client(openai_server, "fake-model"), tools=[add]))
    events = await collect_events(runtime.execute_message("s1", "Add two pairs."))

    completed = {
        e.tool_call_id: e.result.output for e in events if isinstance(e, ToolCompletedEvent)
    }
    assert completed == {"call_x": 3, "call_y": 70}
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


async def test_rate_limited_rung_walks_to_the_next_over_http(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    openai_server.script("big", [Reply.error(429)])
    openai_server.script("small", [Reply.text("fine")])
    family = ModelFamily("gpt", [_client(openai_server, "big"), _client(openai_server, "small")])
    runtime = runtime_factory(Agent(model=family))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    [step] = [e for e in events if isinstance(e, ProviderCascadeEvent)]
    assert step.status_code == 429
    assert step.to_model == "openai/small"
    assert (await runtime.history("s1"))[0].answer == "fine"


async def test_each_failed_rung_is_audited_with_its_own_code_and_no_advice_it_followed(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    from tests.support.services import free_port

    openai_server.script("busy", [Reply.error(503)])
    openai_server.script("small", [Reply.text("fine")])
    nowhere = LiteLLMClient(
        "openai/gone", api_base=f"http://127.0.0.1:{free_port()}/v1", api_key="sk-test"
    )
    family = ModelFamily(
        "gpt", [nowhere, _client(openai_server, "busy"), _client(openai_server, "small")]
    )
    runtime = runtime_factory(Agent(model=family))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    assert (await runtime.history("s1"))[0].answer == "fine"
    rows = [r for r in await runtime.audit(events[0].turn_id) if r.payloads.fallback_step]
    codes = [r.call.error_code for r in rows if r.call is not None]
    assert codes == ["model-unreachable", "provider-error"]
    reasons = [r.payloads.fallback_step.reason for r in rows if r.payloads.fallback_step]
    assert all("fallback model" not in reason for reason in reasons), reasons
    assert "HTTP 503" in reasons[1]


async def test_server_errors_exhaust_the_family_over_http(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    openai_server.script("big", [Reply.error(500)])
    openai_server.script("small", [Reply.error(503)])
    family = ModelFamily("gpt", [_client(openai_server, "big"), _client(openai_server, "small")])
    runtime = runtime_factory(Agent(model=family))
    events = await collect_events(runtime.execute_message("s1", "hello"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.error_code == "family-exhausted"


async def test_a_stream_whose_frame_never_ends_fails_the_turn(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer
) -> None:
    """Seed 000: a sender whose frame never ends still fails the turn (no hang)."""
    openai_server.script("stalls", [Reply.text("Hello there, this never", stall=True)])
    client = LiteLLMClient(
        "openai/stalls", api_base=openai_server.base_url, api_key="sk-test", timeout=1.0
    )
    runtime = runtime_factory(Agent(model=client))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "failed"
    assert done.error_code == "family-exhausted"
    assert any(isinstance(e, ProviderCascadeEvent) and e.status_code == 408 for e in events)


async def test_a_stalled_stream_ends_at_the_ceiling_and_hangs_up(
    runtime_factory: RuntimeFactory, openai_server: FakeOpenAIServer, database_url: str
) -> None:
    """A provider that goes quiet mid-stream, under the client's own timeout: a model call
    is never idle (its heartbeats count), so the turn ends `timed_out` at its ceiling and
    the connection to the provider is closed."""
    openai_server.script("stalls", [Reply.text("Hello there, this never", stall=True)])
    config = RuntimeConfig(
        database_url=database_url, idle_window_s=0.5, heartbeat_interval_s=0.05, ceiling_s=1.0
    )
    runtime = runtime_factory(Agent(model=_client(openai_server, "stalls")), config=config)
    async with asyncio.timeout(20):
        events = await collect_events(runtime.execute_message("s1", "hi"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.status, done.error_code) == ("timed_out", "deadline-exceeded")
    assert any(isinstance(e, MessageDeltaEvent) for e in events)  # it did start streaming
    assert openai_server.wait_for_disconnects(1)
