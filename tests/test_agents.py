"""Agents as data, pinned per turn: every driver rebuilds exactly the agent a turn began with.

A per-message agent with its own model and tools survives a pause answered in another
runtime, a worker-driven start, and a SIGKILL of the worker driving it; tools see the
principal and the app's deps wherever they run; a pinned agent that is gone ends the turn
`agent-not-found`, never silently with another agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support import agents_host
from tests.support.agents_host import AppDeps, RuleModel, special
from turnkit import Agent, Approve, SessionRuntime, tool
from turnkit.errors import AgentNotFoundError
from turnkit.events import (
    ApprovalRequestedEvent,
    DoneEvent,
    ErrorEvent,
    MessageCompleteEvent,
    StreamEvent,
)
from turnkit.models import ModelSettings
from turnkit.runtime.agents import AgentCatalog, AgentData, ToolAccessRequest
from turnkit.runtime.worker import Worker
from turnkit.testing import ModelStep, ScriptedModel, call

ROOT = Path(__file__).resolve().parents[1]


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agents.db'}"


async def _until_done(
    runtime: SessionRuntime, turn_id: str, wait_s: float = 20
) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    async with asyncio.timeout(wait_s):
        while (await runtime.turn(turn_id)).status in ("running", "queued"):
            await asyncio.sleep(0.05)
    async for event in runtime.events(turn_id):
        events.append(event)
    return events


def _answer(events: list[StreamEvent]) -> str:
    answers = (e for e in events if isinstance(e, MessageCompleteEvent) and e.block.is_answer)
    return next(answers).block.text


async def test_a_per_message_agent_survives_a_pause_approved_in_another_runtime(
    tmp_path: Path,
) -> None:
    asking = special(approval="always")
    first = agents_host.runtime(_url(tmp_path))
    second = agents_host.runtime(_url(tmp_path))
    first.agents.add(asking)
    second.agents.add(asking)  # both processes host it (as they would from the same code)
    async with first, second:
        events = [
            e async for e in first.execute_message("s1", "who am I?", agent=asking, principal="ada")
        ]
        paused = events[-1]
        assert isinstance(paused, ApprovalRequestedEvent)
        record = await first.turn(paused.turn_id)
        assert record.agent == "special"
        assert record.pinned["agent_version"] == asking.version
        assert record.pinned["principal"] == "ada"

        await second.resume(paused.turn_id, paused.request_id, Approve())
        rest = await _until_done(second, paused.turn_id)

    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    # The special model answered, with the tool's view of the caller (not the default model).
    assert _answer(rest) == "special-model: ada at tenant-of-ada"


async def test_a_turn_paused_under_an_older_turnkit_resumes_after_the_upgrade(
    tmp_path: Path,
) -> None:
    """Tools' own approval policies joined the version in a later turnkit: a turn pinned to
    the version the same bundle had before still resumes with it."""
    import sqlite3

    model = ScriptedModel([ModelStep.tool_call_reply(call("_pay", to="bo")),
                           ModelStep.text_reply("Paid.")])  # fmt: skip
    asking = Agent(model=model, tools=[tool(_pay, approval="always")],
                   skip_stages=frozenset({"anchor-plan"}))  # fmt: skip
    earlier = asking.earlier_versions[0]  # hashed without the tool's own policy
    assert earlier != asking.version
    runtime = agents_host.runtime(_url(tmp_path))
    runtime.agents.add(asking)
    async with runtime:
        events = [e async for e in runtime.execute_message("s1", "pay bo", agent=asking)]
        paused = events[-1]
        assert isinstance(paused, ApprovalRequestedEvent)
    with sqlite3.connect(tmp_path / "agents.db") as db:  # as the older turnkit pinned it
        [(pinned,)] = db.execute("SELECT pinned FROM tk_turns").fetchall()
        db.execute("UPDATE tk_turns SET pinned = ?", (pinned.replace(asking.version, earlier),))
    upgraded = agents_host.runtime(_url(tmp_path))
    upgraded.agents.add(asking)
    async with upgraded:
        assert (await upgraded.turn(paused.turn_id)).pinned["agent_version"] == earlier
        await upgraded.resume(paused.turn_id, paused.request_id, Approve())
        rest = await _until_done(upgraded, paused.turn_id)
    assert rest[-1].status == "succeeded"  # type: ignore[union-attr]


def test_a_policy_that_is_no_plain_function_has_one_version_in_every_process() -> None:
    import subprocess
    import sys

    code = (
        "import functools; from tests.test_agents import _large, _pay, RuleModel;"
        "from turnkit import Agent, tool;"
        "print(Agent(model=RuleModel('m'), tools=[tool(_pay, approval=functools.partial(_large))],"
        " approval=functools.partial(_large)).version)"
    )
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, cwd=Path(__file__).parent.parent).stdout
        for _ in range(2)
    }  # fmt: skip
    assert len(runs) == 1, runs


async def test_a_worker_drives_a_turn_started_elsewhere_with_its_pinned_agent(
    tmp_path: Path,
) -> None:
    api = agents_host.runtime(_url(tmp_path), run_in_process=False)
    worker_host = agents_host.runtime(_url(tmp_path), run_in_process=False)
    async with api, worker_host:
        submission = await api.start("s1", "who am I?", agent="special", principal="grace")
        stop = asyncio.Event()
        working = asyncio.create_task(Worker(worker_host, poll_interval_s=0.02).run(stop))
        try:
            events = await _until_done(api, submission.turn_id)
        finally:
            stop.set()
            await working
    assert _answer(events) == "special-model: grace at tenant-of-grace"


async def test_message_overrides_are_pinned_and_reach_every_driver(tmp_path: Path) -> None:
    """A message's model and settings hold on a worker, which never saw the message."""
    served = RuleModel("override-model")
    api = agents_host.runtime(
        _url(tmp_path), run_in_process=False, models={"override": RuleModel("override-model")}
    )
    worker_host = agents_host.runtime(
        _url(tmp_path), run_in_process=False, models={"override": served}
    )
    async with api, worker_host:
        submission = await api.start(
            "s1",
            "who am I?",
            agent="special",
            model="override",
            settings=ModelSettings(temperature=0.1, seed=3),
            principal="ada",
        )
        record = await api.turn(submission.turn_id)
        assert record.pinned["overrides"] == {
            "model": "override",
            "settings": {"temperature": 0.1, "seed": 3},
        }
        stop = asyncio.Event()
        working = asyncio.create_task(Worker(worker_host, poll_interval_s=0.02).run(stop))
        try:
            events = await _until_done(api, submission.turn_id)
        finally:
            stop.set()
            await working
    assert _answer(events) == "override-model: ada at tenant-of-ada"
    assert {r.settings for r in served.requests} == {ModelSettings(temperature=0.1, seed=3)}


async def test_a_bundle_removed_between_pause_and_approve_ends_the_turn(tmp_path: Path) -> None:
    bundles: dict[str, dict[str, Any]] = {
        "reviewer": {
            "name": "reviewer",
            "model": "reviewer-model",
            "tools": ["whoami"],
            "approval": "always",
        }
    }

    async def load(name: str) -> Mapping[str, Any] | None:
        return bundles.get(name)

    catalog = AgentCatalog([agents_host.default()], loader=load, tools=[agents_host.whoami])
    runtime = SessionRuntime(
        agents=catalog,
        models={"reviewer-model": RuleModel("reviewer-model")},
        deps=agents_host.build_deps,
        config=agents_host.runtime(_url(tmp_path)).config,
    )
    async with runtime:
        events = [e async for e in runtime.execute_message("s1", "hi", agent="reviewer")]
        paused = events[-1]
        assert isinstance(paused, ApprovalRequestedEvent)
        expected = AgentData.model_validate(bundles["reviewer"]).build(catalog.tools).version
        # The host's tools as a list, as AgentCatalog takes them, build the same agent.
        listed = AgentData.model_validate(bundles["reviewer"]).build(list(catalog.tools.values()))
        assert listed.version == expected
        assert (await runtime.turn(paused.turn_id)).pinned["agent_version"] == expected

        del bundles["reviewer"]  # the app deleted the agent while the turn waited
        await runtime.resume(paused.turn_id, paused.request_id, Approve())
        rest = await _until_done(runtime, paused.turn_id)
        record = await runtime.turn(paused.turn_id)
        history = await runtime.history("s1")

    assert (record.status, record.error_code) == ("failed", "agent-not-found")
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.error_code == "agent-not-found"
    error = next(e for e in rest if isinstance(e, ErrorEvent))
    assert "reviewer" in error.message  # the error names the agent; nothing ran instead
    assert history[0].status == "failed"
    assert not any(isinstance(e, MessageCompleteEvent) and e.block.is_answer for e in rest)


async def test_an_edited_bundle_does_not_take_over_a_pinned_turn(tmp_path: Path) -> None:
    runtime = agents_host.runtime(_url(tmp_path))
    pausing = special(approval="always")
    runtime.agents.add(pausing)
    async with runtime:
        events = [e async for e in runtime.execute_message("s1", "hi", agent="special")]
        paused = events[-1]
        assert isinstance(paused, ApprovalRequestedEvent)

    edited = agents_host.runtime(_url(tmp_path))  # a deploy changed the agent's instructions
    edited.agents.add(special(approval="always", instructions="Something else."))
    async with edited:
        await edited.resume(paused.turn_id, paused.request_id, Approve())
        await _until_done(edited, paused.turn_id)
        record = await edited.turn(paused.turn_id)
    assert (record.status, record.error_code) == ("failed", "agent-not-found")


async def test_an_unknown_agent_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    async with agents_host.runtime(_url(tmp_path)) as runtime:
        with pytest.raises(AgentNotFoundError, match="nobody"):
            await runtime.submit("s1", "hi", agent="nobody")
        assert await runtime.store.list_turns("s1") == []  # type: ignore[arg-type]


async def test_tool_access_narrows_what_is_advertised(tmp_path: Path) -> None:
    asked: list[ToolAccessRequest] = []

    def access(request: ToolAccessRequest) -> set[str]:
        asked.append(request)
        return {"whoami"} if request.principal == "intern" else set(request.tools)

    model = RuleModel("special-model")
    runtime = SessionRuntime(
        agent=special(model=model),
        deps=agents_host.build_deps,
        tool_access=access,
        config=agents_host.runtime(_url(tmp_path)).config,
    )
    async with runtime:
        events = [e async for e in runtime.execute_message("s1", "hi", principal="intern")]
        record = await runtime.turn(events[0].turn_id)  # type: ignore[union-attr]
    assert record.pinned["tools"] == ["whoami"]
    assert asked[0].tools == ("whoami", "secret_report")
    offered = {t.name for r in model.requests for t in r.tools}
    assert offered - {"read_tool_result"} == {"whoami"}  # secret_report is never offered


async def test_deps_given_with_the_message_reach_the_tool(tmp_path: Path) -> None:
    mine = AppDeps(tenant="given-per-request", built_by_pid=0)
    async with agents_host.runtime(_url(tmp_path)) as runtime:
        events = [
            e
            async for e in runtime.execute_message(
                "s1", "who?", agent="special", principal="ada", deps=mine
            )
        ]
    assert _answer(events) == "special-model: ada at given-per-request"


def _spawn_worker(url: str, log: Path, **env: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.agents_host", "worker", url],
        cwd=ROOT,
        env={**os.environ, "TK_TEST_LOG": str(log), "TK_LEASE_TTL_S": "1.5", **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _reap(proc: subprocess.Popen[str]) -> None:
    proc.wait(timeout=20)
    if proc.stdout is not None:
        proc.stdout.close()


def _tool_runs(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


async def test_a_pause_in_one_worker_process_is_approved_and_finished_by_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, log = _url(tmp_path), tmp_path / "tools.log"
    monkeypatch.setenv("TK_SPECIAL_APPROVAL", "always")
    api = agents_host.runtime(url, run_in_process=False)
    async with api:
        submission = await api.start("s1", "who am I?", agent="special", principal="ada")
        first = _spawn_worker(url, log, TK_SPECIAL_APPROVAL="always")
        try:
            async with asyncio.timeout(20):
                while (await api.turn(submission.turn_id)).status != "awaiting_approval":
                    await asyncio.sleep(0.05)
        finally:
            first.terminate()
            _reap(first)
        paused = [e async for e in api.events(submission.turn_id)][-1]
        assert isinstance(paused, ApprovalRequestedEvent)
        assert _tool_runs(log) == []  # nothing of the tool ran before the approval
        await api.resume(submission.turn_id, paused.request_id, Approve())
        second = _spawn_worker(url, log, TK_SPECIAL_APPROVAL="always")
        try:
            events = await _until_done(api, submission.turn_id, wait_s=30)
        finally:
            second.terminate()
            _reap(second)

    assert [r["pid"] for r in _tool_runs(log)] == [second.pid]
    assert [r["principal"] for r in _tool_runs(log)] == ["ada"]
    # The pinned special agent (its model and tool) answered, not the default one.
    assert _answer(events) == "special-model: ada at tenant-of-ada"


async def test_a_sigkilled_worker_is_recovered_with_the_pinned_agent_and_fresh_deps(
    tmp_path: Path,
) -> None:
    url, log = _url(tmp_path), tmp_path / "tools.log"
    api = agents_host.runtime(url, run_in_process=False)
    async with api:
        submission = await api.start("s1", "who am I?", agent="special", principal="ada")
        doomed = _spawn_worker(url, log, TK_TOOL_SLEEP="60")
        try:
            deadline = time.monotonic() + 20
            while not _tool_runs(log):  # the tool is running in the doomed worker
                assert time.monotonic() < deadline, "the worker never ran the tool"
                await asyncio.sleep(0.05)
        finally:
            doomed.send_signal(signal.SIGKILL)
            _reap(doomed)
        rescuer = _spawn_worker(url, log)
        try:
            events = await _until_done(api, submission.turn_id, wait_s=30)
        finally:
            rescuer.terminate()
            _reap(rescuer)

    runs = _tool_runs(log)
    assert [r["pid"] for r in runs] == [doomed.pid, rescuer.pid]
    assert all(r["principal"] == "ada" for r in runs)
    # deps are built again by the factory in the process that drives the turn
    assert [r["deps_pid"] for r in runs] == [doomed.pid, rescuer.pid]
    assert any(e.type == "turn.recovering" for e in events)
    assert _answer(events) == "special-model: ada at tenant-of-ada"


def test_an_agent_version_is_a_content_hash_equal_across_constructions() -> None:
    assert special().version == special().version
    assert special().version != special(instructions="Other.").version
    assert special().version != special(settings=ModelSettings(temperature=0.5)).version
    assert len(special().version) == 16
    assert isinstance(special(), Agent)


def _pay(to: str) -> str:
    return f"paid {to}"


def _large(name: str, args: Mapping[str, object]) -> bool:
    return name == "pay"


def test_a_tools_own_approval_policy_is_part_of_the_version() -> None:
    # A deploy that makes a tool ask first is a new version: a turn paused under the old
    # policy resumes under it (kept hosted) or ends agent-not-found, never silently changed.
    def agent(approval: Any) -> Agent:
        return Agent(model=RuleModel("m"), tools=[tool(_pay, approval=approval)])

    versions = {agent(None).version, agent("always").version, agent("never").version,
                agent(_large).version}  # fmt: skip
    assert len(versions) == 4
    assert agent("always").version == agent("always").version
    # A tool on the agent's policy keeps the version it had before tools' own counted.
    described = agent(None).describe()["tools"]
    assert isinstance(described, list)
    assert described[0] == {"name": "_pay", "description": described[0]["description"],
                            "parameters": described[0]["parameters"]}  # fmt: skip
