"""`gen_ai.response.model` is the model the provider says answered, not the one asked for."""

from __future__ import annotations

import pytest
from tests.conftest import RuntimeFactory
from tests.otel.conftest import Telemetry
from tests.support.openai_server import FakeOpenAIServer, Reply

from turnkit import Agent
from turnkit.models.litellm import LiteLLMClient
from turnkit.testing import collect_events


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_the_response_model_is_what_the_provider_said(
    runtime_factory: RuntimeFactory,
    otel: Telemetry,
    openai_server: FakeOpenAIServer,
    transport: str,
) -> None:
    # The provider answers with a dated snapshot of the model asked for, as OpenAI does.
    openai_server.script("gpt-fake", [Reply.text("Hello.", model="gpt-fake-2026-05-01")])
    client = LiteLLMClient(
        "openai/gpt-fake", api_base=openai_server.base_url, api_key="sk", transport=transport
    )
    runtime = runtime_factory(Agent(model=client))
    await collect_events(runtime.execute_message("s1", "hello"))

    [chat] = otel.named("chat ")
    attributes = dict(chat.attributes or {})
    assert attributes["gen_ai.request.model"] == "gpt-fake"
    assert attributes["gen_ai.response.model"] == "gpt-fake-2026-05-01"
    usage = otel.points("gen_ai.client.token.usage")
    assert {a["gen_ai.response.model"] for a, _ in usage} == {"gpt-fake-2026-05-01"}


async def test_a_client_that_names_no_model_keeps_the_requested_one(
    runtime_factory: RuntimeFactory, otel: Telemetry
) -> None:
    from turnkit.testing import ModelStep, ScriptedModel

    runtime = runtime_factory(Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")], name="m")))
    await collect_events(runtime.execute_message("s1", "hello"))
    [chat] = otel.named("chat ")
    assert dict(chat.attributes or {})["gen_ai.response.model"] == "m"
