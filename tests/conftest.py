"""Shared fixtures: network guard, runtimes on a temporary SQLite file, the fake OpenAI server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import turnkit.models
from tests.support.openai_server import openai_server as openai_server
from turnkit import Agent, RuntimeConfig, SessionRuntime

RuntimeFactory = Callable[..., SessionRuntime]


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    """No model client may reach a non-loopback address during tests."""
    turnkit.models.ALLOW_NETWORK = False
    yield
    turnkit.models.ALLOW_NETWORK = True


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'turnkit.db'}"


@pytest.fixture
async def runtime_factory(database_url: str) -> AsyncIterator[RuntimeFactory]:
    """Build open runtimes on one temporary SQLite database; closed after the test."""
    opened: list[SessionRuntime] = []

    def make(agent: Agent | None = None, **kwargs: Any) -> SessionRuntime:
        config = kwargs.pop("config", None) or RuntimeConfig(database_url=database_url)
        runtime = SessionRuntime(agent=agent or kwargs.pop("agent_obj"), config=config, **kwargs)
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        await runtime.close()
