"""Thread naming in two writes: the opening message's name at once, then the utility
model's, never over a person's rename."""

from __future__ import annotations

from pathlib import Path

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import SessionRenamedEvent
from turnkit.ids import SessionId
from turnkit.models import ModelRequest
from turnkit.stages._naming import opening_title
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

QUESTION = "What were the three biggest causes of the 2008 financial crisis, in plain words?"


def _utility(title: str) -> ScriptedModel:
    def answer(request: ModelRequest) -> ModelStep:
        return ModelStep.text_reply(title if request.purpose == "utility" else "{}")

    return ScriptedModel([ModelStep.respond(answer)], name="utility", repeat_last=True)


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


async def test_the_utility_model_replaces_the_opening_name(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Housing, leverage, and trust.")])
    agent = Agent(model=model, utility_model=_utility("Causes of the 2008 crisis"))
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", QUESTION))
        session = await runtime.store.get_session(SessionId("s1"))
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]
        await collect_events(runtime.execute_message("s1", "And in 2011?"))
        again = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "Causes of the 2008 crisis"
    [renamed] = [e for e in events if isinstance(e, SessionRenamedEvent)]
    assert (renamed.title, renamed.source) == ("Causes of the 2008 crisis", "background-model")
    naming = [r for r in rows if r.payloads.thread_naming is not None]
    assert naming[0].call is not None  # its own priced row
    assert naming[0].payloads.thread_naming.applied  # type: ignore[union-attr]
    assert again is not None
    assert again.title == "Causes of the 2008 crisis"  # only the opening turn names


async def test_without_a_utility_model_the_first_name_stands(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hello.")]))
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", "hello there"))
        session = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "hello there"
    assert not any(isinstance(e, SessionRenamedEvent) for e in events)


async def test_a_rename_typed_mid_turn_survives(tmp_path: Path) -> None:
    holder: list[SessionRuntime] = []

    @tool
    async def rename_now() -> str:
        """Stand-in for the person renaming the thread while the turn runs."""
        await holder[0].store.rename_session(SessionId("s1"), "My own name")
        return "ok"

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("rename_now")), ModelStep.text_reply("Done.")]
    )
    agent = Agent(model=model, tools=[rename_now], utility_model=_utility("Model's name"))
    async with _runtime(tmp_path, agent) as runtime:
        holder.append(runtime)
        events = await collect_events(runtime.execute_message("s1", QUESTION))
        session = await runtime.store.get_session(SessionId("s1"))
    assert session is not None
    assert session.title == "My own name"
    assert not any(isinstance(e, SessionRenamedEvent) for e in events)


async def test_a_session_created_with_a_title_keeps_it(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]), utility_model=_utility("X"))
    async with _runtime(tmp_path, agent) as runtime:
        await runtime.create_session("s1", title="Quarterly review")
        await collect_events(runtime.execute_message("s1", QUESTION))
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
