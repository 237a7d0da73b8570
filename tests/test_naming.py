"""Thread naming in two writes: the opening message's name at once, then the background
model's once the opening turn has settled, never over a person's rename."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest

from tests.helpers import WrappedModel, turn_status, until
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.errors import (
    InvalidInputError,
    LeaseLostError,
    ProviderError,
    SessionNotFoundError,
)
from turnkit.events import DoneEvent, DurableEvent, RunFinishedEvent
from turnkit.ids import SessionId, TurnId
from turnkit.models import ModelChunk, ModelRequest
from turnkit.plugins import Plugin, PluginContext
from turnkit.plugins.pii import PiiRedaction
from turnkit.runtime.driver import TurnDriver
from turnkit.stages._naming import NAMING_PROMPT
from turnkit.stages._titles import opening_title
from turnkit.telemetry import Recorder
from turnkit.tenancy import DEFAULT_ORGANISATION, Organisation
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

QUESTION = "What were the three biggest causes of the 2008 financial crisis, in plain words?"


def _names(request: ModelRequest) -> bool:
    """The request is the naming call."""
    return request.messages[0].content == NAMING_PROMPT


def _utility(title: str) -> ScriptedModel:
    def answer(request: ModelRequest) -> ModelStep:
        return ModelStep.text_reply(title if request.purpose == "utility" else "{}")

    return ScriptedModel([ModelStep.respond(answer)], name="utility", repeat_last=True)


class _GatedNamer(WrappedModel):
    """A utility model that plans at once and names only once `gate` is set."""

    def __init__(self, title: str) -> None:
        self.inner = _utility(title)
        self.gate = asyncio.Event()
        self.naming = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if _names(request):
            self.naming += 1
            try:
                await self.gate.wait()
            finally:
                self.naming -= 1
        async for chunk in self.inner.stream(request):
            yield chunk


def _runtime(tmp_path: Path, agent: Agent) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'naming.db'}")
    return SessionRuntime(agent=agent, config=config)


def test_the_opening_name_is_the_first_line_cut_at_a_word() -> None:
    assert opening_title("hi") == "hi"
    assert opening_title("/brainstorming  plan a party\nmore") == "plan a party"
    long = opening_title(QUESTION)
    assert long.endswith("…")
    assert len(long) <= 61
    assert QUESTION.startswith(long[:-1])


def test_only_a_whole_leading_slug_is_dropped_from_the_opening_name() -> None:
    # A `/slug` is the first word; a path that opens a message is not one.
    assert opening_title("/etc/hosts is broken") == "/etc/hosts is broken"
    assert opening_title("/usr/bin/python crashed") == "/usr/bin/python crashed"
    assert opening_title("/haiku") == "/haiku"  # nothing after it: the message itself
    assert opening_title("/haiku autumn rain") == "autumn rain"


async def test_the_utility_model_replaces_the_opening_name(db: tuple[str, str | None]) -> None:
    model = ScriptedModel([ModelStep.text_reply("Housing, leverage, and trust.")])
    agent = Agent(model=model, utility_model=_utility("Causes of the 2008 crisis"))
    config = RuntimeConfig(database_url=db[0], database_schema=db[1])
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", QUESTION))
        await runtime.wait_background()
        session = await runtime.store.get_session(SessionId("s1"))
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]
        usage = await runtime.store.read_usage(events[0].turn_id)  # type: ignore[union-attr]
        await collect_events(runtime.execute_message("s1", "And in 2011?"))
        await runtime.wait_background()
        again = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "Causes of the 2008 crisis"
    naming = [r for r in rows if r.payloads.thread_naming is not None]
    assert [r.identity.stage_id for r in naming] == ["thread-naming"]
    assert naming[0].call is not None  # its own priced row, on the opening turn
    assert naming[0].payloads.thread_naming.applied  # type: ignore[union-attr]
    assert not [r for r in rows if r.identity.stage_id == "post-turn" and r.call is not None]
    assert usage.model_calls == sum(1 for r in rows if r.call is not None)  # the name's too
    # The turn's own account, streamed before the name was asked, leaves the name out:
    # the rollup is it plus the rows of stage `thread-naming`.
    [finished] = [e for e in events if isinstance(e, RunFinishedEvent)]
    named = [r.call for r in rows if r.identity.stage_id == "thread-naming" and r.call]
    assert usage.model_calls == finished.model_calls + len(named)
    assert usage.input_tokens == finished.input_tokens + sum(c.input_tokens for c in named)
    assert usage.output_tokens == finished.output_tokens + sum(c.output_tokens for c in named)
    [done] = [e for e in events if isinstance(e, DoneEvent)]
    assert done is events[-1]  # the turn's log ends with its ending
    assert again is not None
    assert again.title == "Causes of the 2008 crisis"  # only the opening turn names


async def test_a_name_written_on_several_lines_is_one_line(tmp_path: Path) -> None:
    """A chat list shows one line per session: the first line with words, tabs as spaces."""
    model = ScriptedModel([ModelStep.text_reply("Housing, leverage, and trust.")])
    utility = _utility('\n"Causes of the 2008\t\tcrisis"\n\nA short title for your chat.')
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'lines.db'}")
    async with SessionRuntime(agent=Agent(model=model, utility_model=utility), config=config) as rt:
        await collect_events(rt.execute_message("s1", QUESTION))
        await rt.wait_background()
        session = await rt.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "Causes of the 2008 crisis"


async def test_the_opening_turn_settles_before_the_name_arrives(tmp_path: Path) -> None:
    namer = _GatedNamer("Causes of the crisis")
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]), utility_model=namer)
    async with _runtime(tmp_path, agent) as runtime:
        async with asyncio.timeout(10):  # before, the turn waited for the naming call
            events = await collect_events(runtime.execute_message("s1", QUESTION))
        await until(lambda: namer.naming == 1, "the naming call starts")
        before = await runtime.store.get_session(SessionId("s1"))
        turn = await runtime.turn(events[0].turn_id)  # type: ignore[union-attr]
        namer.gate.set()
        await runtime.wait_background()
        after = await runtime.store.get_session(SessionId("s1"))
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]
    assert isinstance(events[-1], DoneEvent)
    assert events[-1].status == "succeeded"
    assert turn.status == "succeeded"
    assert before is not None
    assert before.title == opening_title(QUESTION)
    assert after is not None
    assert after.title == "Causes of the crisis"
    assert [r.payloads.thread_naming.applied for r in rows if r.payloads.thread_naming] == [True]


async def test_closing_the_runtime_cancels_a_pending_name(tmp_path: Path) -> None:
    namer = _GatedNamer("Never given")  # its gate stays shut
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]), utility_model=namer)
    async with _runtime(tmp_path, agent) as runtime:
        await collect_events(runtime.execute_message("s1", QUESTION))
        await until(lambda: namer.naming == 1, "the naming call starts")
    assert namer.naming == 0  # cancelled with the runtime
    async with _runtime(tmp_path, agent) as runtime:
        session = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == opening_title(QUESTION)  # the first name stands


async def test_a_failed_naming_call_leaves_its_row_and_the_first_name(tmp_path: Path) -> None:
    def answer(request: ModelRequest) -> ModelStep:
        if _names(request):
            return ModelStep.fail(ProviderError("gateway refused", is_retriable=False))
        return ModelStep.text_reply("{}")

    failing = ScriptedModel([ModelStep.respond(answer)], name="utility", repeat_last=True)
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]), utility_model=failing)
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", QUESTION))
        await runtime.wait_background()
        session = await runtime.store.get_session(SessionId("s1"))
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]
        stored = [e async for e in runtime.events(events[0].turn_id)]  # type: ignore[union-attr]
    assert session is not None
    assert session.title == opening_title(QUESTION)
    failed = [r for r in rows if r.call is not None and r.call.outcome == "error"]
    assert [(r.identity.stage_id, r.call.family) for r in failed] == [  # type: ignore[union-attr]
        ("thread-naming", "utility")
    ]
    assert stored[-1].type == "done"  # nothing was appended after the ending


class _EchoOnDone(Plugin):
    """A plugin that emits an event when it sees the turn's `done`."""

    name: ClassVar[str] = "echo"

    async def on_event(self, ctx: PluginContext, event: DurableEvent) -> None:
        if event.type == "done":
            await ctx.emit("seen", {"type": event.type})


async def test_nothing_lands_after_done_while_the_name_is_asked(tmp_path: Path) -> None:
    agent = Agent(
        model=ScriptedModel([ModelStep.text_reply("Hi.")]),
        utility_model=_utility("Greetings"),
        plugins=[_EchoOnDone()],
    )
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", QUESTION))
        await runtime.wait_background()
        turn_id = events[0].turn_id  # type: ignore[union-attr]
        stored = [e async for e in runtime.events(turn_id)]
        session = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "Greetings"  # the naming call committed its row after done
    assert stored[-1].type == "done"
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))


async def _taken_over_at_the_ending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Agent, message: str
) -> tuple[SessionRuntime, TurnId]:
    """Run `message` in a driver that dies after post-turn, before the ending, then let a
    second runtime take the turn over; the second, open, and the turn's id."""
    settle = TurnDriver._settle
    died: list[TurnId] = []

    async def die_once(self: TurnDriver, rec: Recorder) -> None:
        if not died:
            died.append(rec.turn_id)
            raise LeaseLostError("as if the process died before writing the ending")
        await settle(self, rec)

    monkeypatch.setattr(TurnDriver, "_settle", die_once)
    db = tmp_path / "naming.db"
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0)
    async with SessionRuntime(agent=agent, config=config) as first:
        submission = await first.start("s1", message)
        await until(lambda: bool(died), "the first driver reaches the ending")
    assert (await turn_status(db, submission.turn_id)) == "running"
    second = SessionRuntime(
        agent=agent, config=dataclasses.replace(config, recover_in_process=True)
    )
    await second.open()
    async with asyncio.timeout(20):
        while (await second.turn(submission.turn_id)).status == "running":
            await asyncio.sleep(0.05)
    await second.wait_background()
    return second, submission.turn_id


async def test_an_attempt_that_only_writes_the_ending_still_names_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first driver dies after post-turn, before the ending; the takeover names it."""
    model = ScriptedModel([ModelStep.text_reply("Hi.")])
    agent = Agent(model=model, utility_model=_utility("Causes of the crisis"))
    second, turn_id = await _taken_over_at_the_ending(tmp_path, monkeypatch, agent, QUESTION)
    async with second:
        session = await second.store.get_session(SessionId("s1"))
        record = await second.turn(turn_id)
    assert record.status == "succeeded"
    assert record.attempts == 2
    assert session is not None
    assert session.title == "Causes of the crisis"


async def test_a_takeover_that_only_writes_the_ending_names_from_the_masked_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The naming call of a turn taken over reads the message as the guardrails left it."""
    long = "Please draft a short and friendly note for the team about the offsite"
    utility = ScriptedModel([ModelStep.text_reply("Offsite note")], repeat_last=True)
    agent = Agent(
        model=ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True),
        utility_model=utility,
        plugins=[PiiRedaction(check_input=True)],
        skip_stages=frozenset({"anchor-plan"}),
    )
    message = f"{long}, then write to ada@example.com"  # the address after the title's cut
    second, _ = await _taken_over_at_the_ending(tmp_path, monkeypatch, agent, message)
    await second.close()
    assert utility.calls, "the naming call"
    for request in utility.calls:
        sent = " ".join(str(m.content) for m in request.messages)
        assert "ada@example.com" not in sent, request.purpose


async def test_without_a_utility_model_the_first_name_stands(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hello.")]))
    async with _runtime(tmp_path, agent) as runtime:
        await collect_events(runtime.execute_message("s1", "hello there"))
        await runtime.wait_background()
        session = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "hello there"


async def test_a_rename_typed_mid_turn_survives(tmp_path: Path) -> None:
    holder: list[SessionRuntime] = []

    @tool
    async def rename_now() -> str:
        """Stand-in for the person renaming the thread while the turn runs."""
        await holder[0].rename_session("s1", "My own name")
        return "ok"

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("rename_now")), ModelStep.text_reply("Done.")]
    )
    agent = Agent(model=model, tools=[rename_now], utility_model=_utility("Model's name"))
    async with _runtime(tmp_path, agent) as runtime:
        holder.append(runtime)
        await collect_events(runtime.execute_message("s1", QUESTION))
        await runtime.wait_background()
        session = await runtime.store.get_session(SessionId("s1"))
        calls = agent.utility_model.calls  # type: ignore[union-attr]
        utility_calls = sum(1 for c in calls if _names(c))
    assert session is not None
    assert session.title == "My own name"
    assert utility_calls == 0  # renamed: nothing to improve, no call made


async def test_a_session_created_with_a_title_keeps_it(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]), utility_model=_utility("X"))
    async with _runtime(tmp_path, agent) as runtime:
        await runtime.create_session("s1", title="Quarterly review")
        await collect_events(runtime.execute_message("s1", QUESTION))
        await runtime.wait_background()
        session = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "Quarterly review"


async def test_a_session_created_unnamed_takes_its_first_messages_name_and_keeps_it(
    db: tuple[str, str | None],
) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")], repeat_last=True))
    config = RuntimeConfig(database_url=db[0], database_schema=db[1])
    async with SessionRuntime(agent=agent, config=config) as runtime:
        await runtime.create_session("s1")
        await collect_events(runtime.execute_message("s1", "plan the offsite"))
        first = await runtime.store.get_session(SessionId("s1"))
        await collect_events(runtime.execute_message("s1", "and the budget"))
        second = await runtime.store.get_session(SessionId("s1"))
    assert first is not None
    assert second is not None
    assert (first.title, second.title) == ("plan the offsite", "plan the offsite")


async def test_a_session_is_read_by_its_id_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    from turnkit.errors import SessionNotFoundError

    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'session.db'}")
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        done = await collect_events(runtime.execute_message("s1", "Plan my trip to Lisbon"))
        session = await runtime.session("s1")
        assert (session.session_id, session.title) == ("s1", "Plan my trip to Lisbon")
        with pytest.raises(SessionNotFoundError, match="no session 'nope'"):
            await runtime.session("nope")
        frames = [f async for f in runtime.reader().follow(done[-1].turn_id, after_seq=1)]
        assert frames  # a plain string is a turn id too


async def test_a_rename_from_python_is_checked_as_over_http(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]))
    async with _runtime(tmp_path, agent) as runtime:
        await collect_events(runtime.execute_message("s1", QUESTION))
        for bad in ("", "   ", "x" * 501, "a\x00b"):
            with pytest.raises(InvalidInputError, match="1-500 characters"):
                await runtime.rename_session("s1", bad)
        with pytest.raises(SessionNotFoundError):
            await runtime.rename_session("nobody", "Fine")
        for bad in ("", "   ", "x" * 501):
            with pytest.raises(InvalidInputError, match="1-500 characters"):
                await runtime.create_session("s2", title=bad)
        assert await runtime.store.get_session(SessionId("s2")) is None  # nothing written
        renamed = await runtime.rename_session("s1", "Trip to Lisbon")
        assert renamed.title == "Trip to Lisbon"
        assert (await runtime.session("s1")).title == "Trip to Lisbon"


async def test_the_organisations_background_model_names_its_sessions(
    db: tuple[str, str | None],
) -> None:
    """An organisation that names a background model has every member's session named
    by it: an agent without a utility model too, and over an agent's own."""
    org = Organisation(name=DEFAULT_ORGANISATION, background_model="namer")
    namer = _utility("Named by the organisation")
    own = _utility("Named by the agent")
    config = RuntimeConfig(database_url=db[0], database_schema=db[1])
    plain = Agent(name="plain", model=ScriptedModel([ModelStep.text_reply("Hi.")]))
    helper = Agent(
        name="helper", model=ScriptedModel([ModelStep.text_reply("Hi.")]), utility_model=own
    )
    async with SessionRuntime(
        agents=[plain, helper], models={"namer": namer}, tenancy=[org], config=config
    ) as runtime:
        for session, agent in (("s1", "plain"), ("s2", "helper")):
            await collect_events(runtime.execute_message(session, QUESTION, agent=agent))
        await runtime.wait_background()
        titles = [(await runtime.session(s)).title for s in ("s1", "s2")]
    assert titles == ["Named by the organisation"] * 2
    assert not [r for r in own.calls if _names(r)]


async def test_without_a_background_model_the_opening_name_stands(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]))
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", QUESTION))
        await runtime.wait_background()
        session = await runtime.session("s1")
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]
    assert session.title == opening_title(QUESTION)
    assert not [r for r in rows if r.identity.stage_id == "thread-naming"]


def test_a_naming_row_stored_by_an_earlier_version_still_reads() -> None:
    """Rows written before naming had its own stage say `post-turn`: they still decode."""
    from turnkit.audit import AuditRow

    stored = {
        "identity": {
            "session_id": "s1",
            "turn_id": "turn_1",
            "stage_id": "post-turn",
            "seq_within_turn": 3,
        },
        "call": None,
        "payloads": {"threadNaming": {"kind": "threadNaming", "title_chars": 9, "applied": True}},
    }
    row = AuditRow.model_validate(stored)
    assert row.identity.stage_id == "post-turn"
    assert row.payloads.thread_naming is not None
