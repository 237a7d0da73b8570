"""A tool that takes `ToolContext[Deps]` gets deps or a clear failure, never `None.x`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from turnkit import Agent, Approve, DepsScope, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.events import ToolCompletedEvent, ToolFailedEvent
from turnkit.runtime.worker import Worker
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@dataclass(frozen=True)
class AppDeps:
    tenant: str


@tool
async def whoami(ctx: ToolContext[AppDeps]) -> str:
    """Say which tenant calls."""
    return ctx.deps.tenant


@tool
async def anyone(ctx: ToolContext) -> str:
    """Work without deps."""
    return "no deps needed" if ctx.deps is None else "deps"


def _runtime(tmp_path: Path, tools: list[object], **kwargs: object) -> SessionRuntime:
    steps = [ModelStep.tool_call_reply(call(t.name)) for t in tools]  # type: ignore[attr-defined]
    model = ScriptedModel([*steps, ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'deps.db'}")
    return SessionRuntime(agent=Agent(model=model, tools=tools), config=config, **kwargs)  # type: ignore[arg-type]


async def test_a_tool_that_needs_deps_says_so_when_none_were_given(tmp_path: Path) -> None:
    async with _runtime(tmp_path, [whoami, anyone]) as runtime:
        events = await collect_events(runtime.execute_message("s1", "who?"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert failed.result.error is not None
    assert "takes ToolContext[AppDeps], but this turn has no deps" in failed.result.error
    assert "SessionRuntime(deps=...)" in failed.result.error
    assert "NoneType" not in failed.result.error  # was: 'NoneType' object has no attribute
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "no deps needed"  # a plain ToolContext runs as before


async def test_deps_from_the_factory_reach_it(tmp_path: Path) -> None:
    def factory(scope: DepsScope) -> AppDeps:
        return AppDeps(tenant="acme")

    async with _runtime(tmp_path, [whoami], deps=factory) as runtime:
        events = await collect_events(runtime.execute_message("s1", "who?"))
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "acme"


async def test_a_deps_type_imported_for_type_checking_only_still_builds(tmp_path: Path) -> None:
    from tests.tools_support.late_deps import tenant_of  # was: ConfigurationError at import

    assert "ctx" not in str(tenant_of.spec().parameters)  # the context is not an argument
    step = ModelStep.tool_call_reply(call("tenant_of", ticket=7))
    model = ScriptedModel([step, ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'late.db'}")
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[tenant_of]),
        config=config,
        deps=lambda scope: AppDeps(tenant="globex"),
    )
    async with runtime:
        events = await collect_events(runtime.execute_message("s1", "ticket 7?"))
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "ticket 7 of globex"


@tool
async def tenant_or_none(ticket: int, ctx: ToolContext[AppDeps] | None = None) -> str:
    """The tenant a ticket belongs to (the context is optional)."""
    return f"ticket {ticket} of {ctx.deps.tenant if ctx else '?'}"


@pytest.mark.parametrize("optional", [False, True])
@pytest.mark.parametrize("imported", ["for type checking", "at run time"])
async def test_a_deps_type_imported_for_type_checking_only_still_asks_for_deps(
    tmp_path: Path, imported: str, optional: bool
) -> None:
    """Wherever `AppDeps` is imported from, and optional or not, a missing deps is said."""
    from tests.tools_support import late_deps

    here = {False: whoami, True: tenant_or_none}
    there = {False: late_deps.tenant_of, True: late_deps.tenant_or_none}
    found = (there if imported == "for type checking" else here)[optional]
    step = ModelStep.tool_call_reply(
        call(found.name, **({"ticket": 7} if found.name != "whoami" else {}))
    )
    model = ScriptedModel([step, ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'late.db'}")
    async with SessionRuntime(agent=Agent(model=model, tools=[found]), config=config) as rt:
        events = await collect_events(rt.execute_message("s1", "ticket 7?"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert failed.result.error is not None
    assert "takes ToolContext[AppDeps], but this turn has no deps" in failed.result.error
    assert "NoneType" not in failed.result.error


async def test_a_turn_the_runtimes_own_worker_drives_has_the_deps_its_caller_gave(
    tmp_path: Path,
) -> None:
    """The recovery loop (a worker of the same runtime) may claim a queued turn before its
    caller's task does: it drives it with the deps the caller handed in, not none."""
    model = ScriptedModel([ModelStep.tool_call_reply(call("whoami")), ModelStep.text_reply("Ok.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}", run_in_process=False)
    async with SessionRuntime(agent=Agent(model=model, tools=[whoami]), config=config) as runtime:
        submission = await runtime.start("s1", "who?", deps=AppDeps(tenant="acme"))
        stop = asyncio.Event()
        working = asyncio.create_task(Worker(runtime, poll_interval_s=0.02).run(stop))
        try:
            events = await asyncio.wait_for(
                collect_events(runtime.reader().events(submission.turn_id)), 10
            )
        finally:
            stop.set()
            await working
    [done] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert done.result.output == "acme"


@tool(approval="always")
async def close_ticket(ctx: ToolContext[AppDeps]) -> str:
    """Close the caller's ticket (a person approves it)."""
    return f"closed for {ctx.deps.tenant}"


async def test_deps_of_turns_answered_in_another_process_are_not_kept_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused turn answered through another API process ends there: this process never
    hears of it again, and kept its caller's deps (a session, a connection) for good."""
    from turnkit.runtime import _host

    monkeypatch.setattr(_host, "MAX_HANDED_DEPS", 2, raising=False)
    steps = [ModelStep.tool_call_reply(call("close_ticket")), ModelStep.text_reply("Closed.")]
    model = ScriptedModel(steps * 4)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'two.db'}")
    agent = Agent(model=model, tools=[close_ticket])
    paused_here = SessionRuntime(agent=agent, config=config)
    answering = SessionRuntime(agent=agent, config=config, deps=lambda s: AppDeps("factory"))
    turns = []
    async with paused_here, answering:
        for n in range(4):
            events = await collect_events(
                paused_here.execute_message(f"s{n}", "close it", deps=AppDeps(tenant="acme"))
            )
            [asked] = [e for e in events if e.type == "approval.requested"]
            await answering.resume(asked.turn_id, asked.request_id, Approve())
            await collect_events(answering.follow(asked.turn_id, after_seq=asked.seq))
            assert (await answering.turn(asked.turn_id)).status == "succeeded"
            turns.append(asked.turn_id)
        kept = [t for t in turns if t in paused_here.host._deps]
    assert kept == turns[-2:]  # was: all four, one more for every turn answered elsewhere


async def test_deps_of_turns_left_to_workers_elsewhere_are_not_kept_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API process with `run_in_process=False` keeps a caller's deps for its own worker,
    if it runs one; turns other processes' workers drive must not pile them up."""
    from turnkit.runtime import _host

    monkeypatch.setattr(_host, "MAX_HANDED_DEPS", 2, raising=False)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'api.db'}", run_in_process=False)
    model = ScriptedModel([ModelStep.text_reply("Ok.")])
    async with SessionRuntime(agent=Agent(model=model, tools=[whoami]), config=config) as api:
        submitted = [
            (await api.start(f"s{n}", "who?", deps=AppDeps(tenant="acme"))).turn_id
            for n in range(5)
        ]
        kept = [t for t in submitted if t in api.host._deps]
    assert kept == submitted[-2:]  # the newest still reach a worker of this process


async def test_a_search_tool_reads_the_knowledge_of_the_turns_agent(tmp_path: Path) -> None:
    """One search tool, two agents: each turn's call searches its own agent's knowledge
    bases, which the model never sees; and learns whether it may keep memories."""
    searched: list[tuple[tuple[str, ...], bool]] = []

    @tool
    async def search(query: str, ctx: ToolContext) -> str:
        """Search the knowledge bases."""
        searched.append((ctx.knowledge, ctx.memory))
        return f"nothing about {query}"

    def model() -> ScriptedModel:
        return ScriptedModel(
            [ModelStep.tool_call_reply(call("search", query="refunds")), ModelStep.text_reply("ok")]
        )

    hr = Agent(name="hr", model=model(), tools=[search], knowledge=["kb-hr", "kb-policies"])
    ops = Agent(name="ops", model=model(), tools=[search], knowledge=["kb-ops"], memory=True)
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'kb.db'}")
    async with SessionRuntime(agents=[hr, ops], config=config) as runtime:
        await collect_events(runtime.execute_message("s1", "refunds?", agent="hr"))
        await collect_events(runtime.execute_message("s2", "refunds?", agent="ops"))
    assert searched == [(("kb-hr", "kb-policies"), False), (("kb-ops",), True)]
    sent = str([m.content for m in hr.model.calls[0].messages])  # type: ignore[union-attr]
    assert "kb-hr" not in sent
