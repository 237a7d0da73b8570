"""Running tools: exits, batches that end a turn, reconcile hooks, tool threads, jobs, answerers."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import RuntimeFactory
from turnkit import Agent, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.events import (
    DoneEvent,
    JobCompletedEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolInDoubtEvent,
)
from turnkit.plugins import Plugin, PluginContext, ToolCall, Verdict
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events
from turnkit.tools import ToolClass

# ── a tool that calls sys.exit() ───────────────────────────────────────────────────────


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_tool_that_calls_sys_exit_is_a_failed_call_not_a_dead_process(
    runtime_factory: RuntimeFactory, kind: str
) -> None:
    """argparse / click in a tool raise SystemExit on bad input: it reached the event loop,
    which re-raises it and the whole process exits (every turn with it); recovery then
    re-runs the call in doubt and kills the next process too."""

    def quits(args: str) -> str:
        """Run a small CLI."""
        sys.exit(f"usage: cli --n N (got {args!r})")

    async def quits_async(args: str) -> str:
        """Run a small CLI."""
        raise SystemExit(2)  # click's standalone mode, a library's exit()

    made = tool(quits if kind == "sync" else quits_async, name="cli")
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("cli", args="--bad")), ModelStep.text_reply("It failed.")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[made]))
    events = await collect_events(runtime.execute_message("s1", "run it"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert failed.code == "tool-failed"
    assert "SystemExit" in (failed.result.error or "")
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"


# ── a batch whose one call ends the turn leaves the others running ────────────────────

MAIL_LOG: list[str] = []


@tool
async def read_secret() -> str:
    """Read a secret."""
    return "TOP-SECRET"


@tool
async def send_mail(to: str) -> str:
    """Send a mail (slowly)."""
    MAIL_LOG.append("start")
    try:
        await asyncio.sleep(0.5)
    except asyncio.CancelledError:
        MAIL_LOG.append("cancelled")
        raise
    MAIL_LOG.append("sent")
    return "sent"


class BlockSecrets(Plugin):
    name: ClassVar[str] = "block-secrets"

    async def check_tool_result(
        self, ctx: PluginContext, call: ToolCall, text: str
    ) -> Verdict | None:
        return Verdict(action="block", kind="secret") if "SECRET" in text else None


async def test_a_call_still_running_when_its_batch_ends_the_turn_is_stopped(
    runtime_factory: RuntimeFactory,
) -> None:
    """A guardrail blocks one result of a batch: the turn ends `failed`, but the other call
    went on running (and sending) after `done`, no longer part of any turn."""
    MAIL_LOG.clear()
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("read_secret"), call("send_mail", to="a@b.c")),
            ModelStep.text_reply("ok"),
        ]
    )
    agent = Agent(model=model, tools=[read_secret, send_mail], plugins=[BlockSecrets()])
    runtime = runtime_factory(agent)
    events = await collect_events(runtime.execute_message("s1", "go"))
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "failed"
    await asyncio.sleep(1.0)  # the mail would be sent by now
    assert MAIL_LOG == ["start", "cancelled"]


# ── a reconcile hook that says "it took effect" is ignored: the call runs again ──────

CHARGES: list[int] = []
CHARGED: dict[str, bool] = {}
SLOW = {"seconds": 60.0}


class Receipt:
    """A payment SDK's receipt object (no JSON form of its own)."""

    def __init__(self, amount: int) -> None:
        self.amount = amount


async def _charged_async(key: str, arguments: dict[str, object]) -> object:
    from turnkit.tools import NOT_APPLIED

    return Receipt(int(arguments["amount"])) if CHARGED.get(key) else NOT_APPLIED  # type: ignore[arg-type]


def _charged_sync(key: str, arguments: dict[str, object]) -> object:
    from turnkit.tools import NOT_APPLIED

    return {"charged": arguments["amount"]} if CHARGED.get(key) else NOT_APPLIED


def _charge_tool(hook: object) -> object:
    @tool(name="charge", reconcile=hook)  # type: ignore[arg-type]
    async def charge(amount: int, ctx: ToolContext) -> dict[str, int]:
        """Charge a card (the provider dedupes on the idempotency key)."""
        CHARGED[ctx.idempotency_key] = True
        CHARGES.append(amount)
        await asyncio.sleep(SLOW["seconds"])  # the process dies before the result lands
        return {"charged": amount}

    return charge


def _recovering(db: Path, charge: object, model: ScriptedModel) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0, recover_in_process=True)
    return SessionRuntime(agent=Agent(model=model, tools=[charge]), config=config)  # type: ignore[list-item]


@pytest.mark.parametrize("hook", [_charged_async, _charged_sync], ids=["not-json", "plain-def"])
async def test_a_reconcile_hook_that_says_it_took_effect_is_not_run_again(
    tmp_path: Path, hook: object
) -> None:
    CHARGES.clear()
    CHARGED.clear()
    SLOW["seconds"] = 60.0
    charge = _charge_tool(hook)
    db = tmp_path / "charge.db"
    first = _recovering(
        db, charge, ScriptedModel([ModelStep.tool_call_reply(call("charge", amount=40))])
    )
    await first.open()
    submission = await first.start("s1", "charge 40")
    for _ in range(200):
        if CHARGES:
            break
        await asyncio.sleep(0.02)
    await first.close()  # dies after the charge took effect, before its result
    SLOW["seconds"] = 0.0
    second = _recovering(db, charge, ScriptedModel([ModelStep.text_reply("Done.")]))
    await second.open()
    try:
        deadline = time.monotonic() + 20
        while (await second.turn(submission.turn_id)).status == "running":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        events = [e async for e in second.events(submission.turn_id)]
    finally:
        await second.close()
        SLOW["seconds"] = 60.0
    assert CHARGES == [40]  # the card was charged once
    [doubt] = [e for e in events if isinstance(e, ToolInDoubtEvent)]
    assert doubt.resolution != "rerun"


# ── tool.completed names the class, not the member that answered ─────────────────────


@tool
async def bing(q: str) -> str:
    """Search bing."""
    return f"bing: {q}"


@tool
async def google(q: str) -> str:
    """Search google."""
    return f"google: {q}"


@tool
async def primary(q: str) -> str:
    """Search the primary index."""
    raise ConnectionError("down")


@pytest.mark.parametrize(
    "web",
    [
        ToolClass("web", [bing, google]),
        ToolClass("web", [primary, ToolClass("mirrors", [bing, google])]),
    ],
    ids=["first-member", "nested"],
)
async def test_tool_completed_names_the_member_that_answered(
    runtime_factory: RuntimeFactory, web: ToolClass
) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("web", q="x")), ModelStep.text_reply("ok")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[web]))
    events = await collect_events(runtime.execute_message("s1", "go"))
    [completed] = [e for e in events if isinstance(e, ToolCompletedEvent)]
    assert completed.result.output == "bing: x"
    assert completed.tool_name == "bing"


# ── a job whose turn is cancelled never completes ─────────────────────────────────────

JOB_RUNNING = asyncio.Event()


@tool
async def long_export(rows: int, ctx: ToolContext) -> int:
    """Export rows for a long time."""
    await ctx.report_progress(0.1, "started")
    JOB_RUNNING.set()
    await asyncio.sleep(30)
    return rows


async def test_a_job_of_a_cancelled_turn_is_completed(runtime_factory: RuntimeFactory) -> None:
    JOB_RUNNING.clear()
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("long_export", rows=1)), ModelStep.text_reply("ok")]
    )
    runtime = runtime_factory(Agent(model=model, tools=[long_export]))
    submission = await runtime.start("s1", "export")
    await asyncio.wait_for(JOB_RUNNING.wait(), 10)
    await runtime.cancel(submission.turn_id)
    deadline = time.monotonic() + 10
    while (await runtime.turn(submission.turn_id)).status == "running":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    events = [e async for e in runtime.events(submission.turn_id)]
    assert events[-1].type == "done"
    [completed] = [e for e in events if isinstance(e, JobCompletedEvent)]
    assert completed.is_error


# ── timed-out sync tools starve the event loop's default thread pool ─────────────────

STUCK = threading.Event()


@tool(timeout_s=0.2)
def stuck_fetch(n: int) -> int:
    """Fetch from a server that never answers (no socket timeout)."""
    STUCK.wait(20)
    return n


@tool(timeout_s=2)
def quick_lookup(n: int) -> int:
    """Answer at once."""
    return n


async def test_timed_out_sync_tools_do_not_starve_the_runtime(
    runtime_factory: RuntimeFactory,
) -> None:
    """Each timed-out sync tool keeps its thread; they were the loop's default executor's
    (cpu+4 threads), which DNS lookups (every new provider connection) also need."""
    STUCK.clear()
    stuck = [call("stuck_fetch", n=i) for i in range(12)]
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(*stuck),
            ModelStep.tool_call_reply(call("quick_lookup", n=7, tool_call_id="quick")),
            ModelStep.text_reply("ok"),
        ]
    )
    runtime = runtime_factory(Agent(model=model, tools=[stuck_fetch, quick_lookup]))
    try:
        events = await collect_events(runtime.execute_message("s1", "go"))
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.getaddrinfo("localhost", 80), 2)  # a model call's DNS
    finally:
        STUCK.set()
    [quick] = [
        e
        for e in events
        if isinstance(e, ToolCompletedEvent | ToolFailedEvent) and e.tool_call_id == "quick"
    ]
    assert isinstance(quick, ToolCompletedEvent), quick.result.error


# ── a result whose dict has a key with no JSON form reads as if the tool raised ───────


async def test_a_result_keyed_by_a_frozenset_says_it_cannot_be_json(
    runtime_factory: RuntimeFactory,
) -> None:
    @tool
    def groups() -> dict[object, int]:
        """Group counts."""
        return {frozenset({"a", "b"}): 2}

    model = ScriptedModel([ModelStep.tool_call_reply(call("groups")), ModelStep.text_reply("ok")])
    runtime = runtime_factory(Agent(model=model, tools=[groups]))
    events = await collect_events(runtime.execute_message("s1", "go"))
    [failed] = [e for e in events if isinstance(e, ToolFailedEvent)]
    assert (failed.result.error or "").startswith("the tool returned dict, which cannot be sent")
