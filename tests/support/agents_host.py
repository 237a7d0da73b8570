"""A host with two agents, a deps factory and a tool that reports who called it.

Used in-process by tests/test_agents.py and as a worker process it can SIGKILL:
`python -m tests.support.agents_host worker DATABASE_URL` drives turns until SIGTERM.
The models decide from the request alone, so a fresh process continues where a killed
one stopped; every tool run is appended to `$TK_TEST_LOG` (one JSON line).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from turnkit import Agent, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.models import Finish, ModelChunk, ModelRequest, TextDelta, ToolCallDelta, Usage
from turnkit.runtime.deps import DepsScope
from turnkit.runtime.worker import Worker


@dataclass(frozen=True)
class AppDeps:
    """What the app hands its tools: a tenant looked up for the principal, and who built it."""

    tenant: str
    built_by_pid: int


def build_deps(scope: DepsScope) -> AppDeps:
    return AppDeps(tenant=f"tenant-of-{scope.principal}", built_by_pid=os.getpid())


@tool
async def whoami(ctx: ToolContext[AppDeps]) -> str:
    """Say who is calling and for which tenant."""
    line = {
        "event": "tool",
        "pid": os.getpid(),
        "principal": ctx.principal,
        "tenant": ctx.deps.tenant,
        "deps_pid": ctx.deps.built_by_pid,
    }
    log = os.environ.get("TK_TEST_LOG")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())  # one append per line
        finally:
            os.close(fd)
    await asyncio.sleep(float(os.environ.get("TK_TOOL_SLEEP", "0")))
    return f"{ctx.principal} at {ctx.deps.tenant}"


@tool
async def secret_report() -> str:
    """A tool only some callers may use."""
    return "the secret report"


class RuleModel:
    """Calls `whoami` once (when offered), then answers `<name>: <tool result>`."""

    provider = "test"

    def __init__(self, name: str) -> None:
        self.model = name
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        usage = Usage(input_tokens=10, output_tokens=5)
        results = [m for m in request.messages if m.role == "tool"]
        offered = {t.name for t in request.tools}
        if request.purpose == "tool-loop" and "whoami" in offered and not results:
            yield ToolCallDelta(index=0, tool_call_id="call_who", name="whoami", arguments="{}")
            yield Finish("tool_use", usage)
            return
        said = str(results[-1].content) if results else "no tools"
        yield TextDelta(f"{self.model}: {said}")
        yield Finish("end_turn", usage)


def special(**changes: object) -> Agent:
    """The per-message agent: its own model and tool, asking before each action."""
    fields: dict[str, object] = {
        "name": "special",
        "instructions": "You are the special agent.",
        "model": RuleModel("special-model"),
        "tools": [whoami, secret_report],
        "approval": "never",
        "skip_stages": frozenset({"anchor-plan"}),
    }
    fields.update(changes)
    return Agent(**fields)  # type: ignore[arg-type]


def default() -> Agent:
    return Agent(
        name="assistant", model=RuleModel("default-model"), skip_stages=frozenset({"anchor-plan"})
    )


def runtime(database_url: str, **kw: object) -> SessionRuntime:
    config = RuntimeConfig(
        database_url=database_url,
        lease_ttl_s=float(os.environ.get("TK_LEASE_TTL_S", "2")),
        run_in_process=bool(kw.pop("run_in_process", True)),
    )
    # TK_SPECIAL_APPROVAL=always hosts the variant that asks before each action (its
    # version differs: every process driving its turns must host the same one).
    return SessionRuntime(
        agent=default(),
        agents=[special(approval=os.environ.get("TK_SPECIAL_APPROVAL", "never"))],
        deps=build_deps,
        config=config,
        **kw,  # type: ignore[arg-type]
    )


async def _work(database_url: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with runtime(database_url, run_in_process=False) as host:
        print("ready", flush=True)
        await Worker(host, concurrency=2, poll_interval_s=0.05).run(stop)


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m tests.support.agents_host worker DATABASE_URL")
    asyncio.run(_work(sys.argv[2]))
