"""The network guard: with `ALLOW_NETWORK` False (as in this suite) a call leaves no machine.

It must look where the call would really go: the client's `api_base`, else litellm's
global `api_base`, else `$OPENAI_BASE_URL` / `$OPENAI_API_BASE` for `openai/` models.
"""

from __future__ import annotations

import pytest

from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit.errors import ConfigurationError
from turnkit.models import Finish, ModelMessage, ModelRequest, TextDelta
from turnkit.models._loader import load_litellm
from turnkit.models.litellm import LiteLLMClient

_REQUEST = ModelRequest(messages=(ModelMessage(role="user", content="hi"),))
_REMOTE = "http://203.0.113.7/v1"  # TEST-NET-3: never routed


async def _first(client: LiteLLMClient) -> object:
    pieces = client.stream(_REQUEST)
    try:
        return await anext(pieces)
    finally:
        await pieces.aclose()


async def test_a_remote_api_base_is_refused_before_any_connection() -> None:
    with pytest.raises(ConfigurationError, match="ALLOW_NETWORK"):
        await _first(LiteLLMClient("openai/m", api_base=_REMOTE, api_key="sk"))


async def test_an_openai_model_with_no_api_base_is_judged_by_where_the_env_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", _REMOTE)
    with pytest.raises(ConfigurationError, match="203.0.113.7"):
        await _first(LiteLLMClient("openai/m", api_key="sk"))


async def test_litellm_s_global_api_base_is_where_the_call_goes_so_the_guard_looks_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loopback `$OPENAI_BASE_URL` does not let a call to litellm's global base through."""
    monkeypatch.setattr(load_litellm(), "api_base", _REMOTE, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigurationError, match="203.0.113.7"):
        await _first(LiteLLMClient("openai/m", api_key="sk"))


async def test_a_loopback_server_is_allowed(openai_server: FakeOpenAIServer) -> None:
    openai_server.script("m", [Reply.text("hello")])
    client = LiteLLMClient("openai/m", api_base=openai_server.base_url, api_key="sk")
    pieces = [piece async for piece in client.stream(_REQUEST)]
    assert "".join(p.text for p in pieces if isinstance(p, TextDelta)) == "hello"
    assert isinstance(pieces[-1], Finish)


def test_the_client_names_the_base_its_calls_go_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """What spans (`server.address`) and errors name: the base the environment gave too."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    assert LiteLLMClient("openai/m", api_key="sk").api_base == "http://127.0.0.1:8000/v1"
    given = LiteLLMClient("openai/m", api_base="http://localhost:1/v1", api_key="sk")
    assert given.api_base == "http://localhost:1/v1"
