"""Approvals, clarifications and Stop: a paused turn waits, then resumes the same turn."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import ClassVar

import pytest

from tests.helpers import follow_to_done
from turnkit import (
    Agent,
    Answer,
    Approve,
    Deny,
    InvalidInputError,
    PauseAnsweredError,
    PauseNotFoundError,
    RuntimeConfig,
    SessionRuntime,
    ToolContext,
    TurnNotFoundError,
    tool,
)
from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    ClarificationRequestedEvent,
    DoneEvent,
    RunFinishedEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
)
from turnkit.ids import TurnId
from turnkit.plugins import Plugin, PluginContext, ToolCall
from turnkit.replay import ReplaySettings
from turnkit.replay.memory import InMemoryReplayBuffer
from turnkit.runtime.worker import Worker
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events

RUNS: list[str] = []


@tool(approval="always")
async def send_email(to: str, ctx: ToolContext) -> str:
    """Send an email (needs a person's approval)."""
    RUNS.append(ctx.idempotency_key)
    return f"sent to {to}"


def _runtime(db: Path, model: ScriptedModel, **agent_kw: object) -> SessionRuntime:
    agent = Agent(model=model, tools=[send_email], **agent_kw)  # type: ignore[arg-type]
    return SessionRuntime(agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{db}"))


def _on(db: tuple[str, str | None], model: ScriptedModel) -> SessionRuntime:
    """A runtime on the `db` fixture's store (SQLite, or a PostgreSQL schema)."""
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema)
    return SessionRuntime(agent=Agent(model=model, tools=[send_email]), config=config)


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    RUNS.clear()


async def test_approval_survives_a_restart_and_resumes_the_same_turn(tmp_path: Path) -> None:
    db = tmp_path / "pause.db"
    before = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    first = _runtime(db, before)
    await first.open()
    events = await collect_events(first.execute_message("s1", "email Ada"))
    await first.close()  # the process goes away while the turn waits

    [asked] = [e for e in events if isinstance(e, ApprovalRequestedEvent)]
    assert asked.tool_name == "send_email"
    assert asked.arguments == {"to": "ada@example.com"}
    assert "send_email" in asked.summary
    assert events[-1] == asked  # this invocation ended at the request: no `done`
    assert RUNS == []  # nothing of the tool ran

    after = ScriptedModel([ModelStep.text_reply("Done: sent.")])
    second = _runtime(db, after)
    await second.open()
    try:
        record = await second.turn(asked.turn_id)
        assert record.status == "awaiting_approval"
        assert record.lease_owner is None  # a paused turn holds no process
        await second.resume(asked.turn_id, asked.request_id, Approve())
        rest = await follow_to_done(second, asked.turn_id, asked.seq)
    finally:
        await second.close()

    seqs = [e.seq for e in events if hasattr(e, "seq")] + [e.seq for e in rest]  # type: ignore[union-attr]
    assert seqs == list(range(1, len(seqs) + 1))  # same turn, seq continues gap-free
    assert {e.turn_id for e in rest} == {asked.turn_id}
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert [e.result.output for e in rest if isinstance(e, ToolCompletedEvent)] == [
        "sent to ada@example.com"
    ]
    assert len(RUNS) == 1  # the tool ran exactly once
    assert len(before.calls) == 1  # the steps before the pause were not re-run ...
    assert len(after.calls) == 1  # ... only what came after it
    after.assert_complete()


async def test_a_paused_turn_holds_no_task_lease_or_buffered_event_past_the_grace(
    tmp_path: Path,
) -> None:
    buffer = InMemoryReplayBuffer(ReplaySettings(terminal_grace_s=0.2))  # TTL: an hour
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="ada@example.com")),
            ModelStep.text_reply("Done: sent."),
        ]
    )
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[send_email]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'held.db'}"),
        replay=buffer,
    )
    await runtime.open()
    try:
        events = await collect_events(runtime.execute_message("s1", "email Ada"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert buffer.turns == 1  # kept for readers still following ...
        await asyncio.sleep(0.4)
        assert buffer.turns == 0  # ... for the grace period only
        assert (await runtime.turn(asked.turn_id)).lease_owner is None
        assert [t for t in asyncio.all_tasks() if asked.turn_id in t.get_name()] == []
        assert {t.get_name() for t in asyncio.all_tasks()}.isdisjoint(
            {"turnkit-lease", "turnkit-heartbeat"}
        )
        # A reader that followed the turn to its pause waits on the Store, and follows
        # the resumed turn to its end.
        follower = asyncio.create_task(follow_to_done(runtime, asked.turn_id, asked.seq))
        await asyncio.sleep(0.1)
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        rest = await follower
    finally:
        await runtime.close()
    seqs = [e.seq for e in rest if hasattr(e, "seq")]  # type: ignore[union-attr]
    assert seqs == list(range(asked.seq + 1, asked.seq + 1 + len(seqs)))
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"


async def test_a_denial_is_a_result_the_model_reads(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="x@example.com")),
            ModelStep.text_reply("Understood, not sending."),
            ModelStep.text_reply("I did not send it."),
        ]
    )
    runtime = _runtime(tmp_path / "deny.db", model)
    await runtime.open()
    try:
        events = await collect_events(runtime.execute_message("s1", "email x"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await runtime.resume(asked.turn_id, asked.request_id, Deny(note="wrong address"))
        rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
    finally:
        await runtime.close()
    [failed] = [e for e in rest if isinstance(e, ToolFailedEvent)]
    assert failed.code == "tool-denied"
    assert "wrong address" in (failed.result.error or "")
    assert RUNS == []
    tool_message = model.calls[1].messages[-1]
    assert tool_message.role == "tool"
    assert "denied" in tool_message.content
    assert rest[-1].type == "done"


async def test_an_approval_may_change_the_arguments_the_call_runs_with(tmp_path: Path) -> None:
    """The person fixes the address before approving: the tool runs once, with theirs, and
    the model reads its call as it ran, in this turn and the next."""
    db = tmp_path / "edit.db"
    first = _runtime(db, ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="x@"))]))
    async with first:
        events = await collect_events(first.execute_message("s1", "email Ada"))
    asked = events[-1]
    assert isinstance(asked, ApprovalRequestedEvent)
    after = ScriptedModel([ModelStep.text_reply("Sent."), ModelStep.text_reply("Yes.")])
    async with _runtime(db, after) as second:  # another process answers it
        fixed = Approve(arguments={"to": "ada@example.com"})
        await second.resume(asked.turn_id, asked.request_id, fixed, principal="grace")
        rest = await follow_to_done(second, asked.turn_id, asked.seq)
        await collect_events(second.execute_message("s1", "Did it go out?"))
        history = await second.history("s1")
        rows = await second.audit(asked.turn_id)
    [answered] = [e for e in rest if isinstance(e, ApprovalAnsweredEvent)]
    assert (answered.decision, answered.arguments) == ("approve", {"to": "ada@example.com"})
    [completed] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
    assert completed.seq > answered.seq
    assert completed.result.output == "sent to ada@example.com"
    assert completed.result.arguments == {"to": "ada@example.com"}
    assert len(RUNS) == 1
    for request in after.calls:  # the answer's call, then the next turn's
        [shown] = [m for m in request.messages if m.tool_calls]
        assert json.loads(shown.tool_calls[0].arguments) == {"to": "ada@example.com"}
    results = [b for b in history[0].blocks if b.kind == "tool_result"]
    assert results[0].arguments == {"to": "ada@example.com"}  # type: ignore[union-attr]
    [answer] = [r.payloads.pause_answer for r in rows if r.payloads.pause_answer]
    assert answer is not None  # who answered, when, how; the arguments stay out
    assert (answer.request_id, answer.pause, answer.decision) == (
        asked.request_id,
        "approval",
        "approve",
    )
    assert (answer.by, answer.arguments_changed) == ("grace", True)
    assert answer.at >= asked.ts
    seqs = [r.identity.seq_within_turn for r in rows]
    assert seqs == list(range(1, len(seqs) + 1))  # the resumed run's rows come after it


async def test_changed_arguments_the_tool_refuses_are_refused_and_the_pause_stays(
    tmp_path: Path,
) -> None:
    """A person's typo must not use the approval up: it is refused, and they answer again."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="x@")),
            ModelStep.text_reply("Sent."),
        ]
    )
    async with _runtime(tmp_path / "bad.db", model) as runtime:
        events = await collect_events(runtime.execute_message("s1", "email x"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        wrong = Approve(arguments={"address": "ada@example.com"})
        with pytest.raises(InvalidInputError, match="do not fit 'send_email': .*to"):
            await runtime.resume(asked.turn_id, asked.request_id, wrong)
        assert (await runtime.turn(asked.turn_id)).status == "awaiting_approval"
        fixed = Approve(arguments={"to": "ada@example.com"})
        await runtime.resume(asked.turn_id, asked.request_id, fixed)
        rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
    assert RUNS
    assert rest[-1].type == "done"


async def test_changed_arguments_answered_where_the_agent_is_not_hosted_fail_when_run(
    tmp_path: Path,
) -> None:
    """An API process without the agent cannot check them: the tool refuses them at run."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="x@")),
            ModelStep.text_reply("The address was refused."),
        ]
    )
    db = tmp_path / "elsewhere.db"
    async with _runtime(db, model) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "email x")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
    config = RuntimeConfig(database_url=f"sqlite:///{db}", run_in_process=False)
    other = Agent(name="frontdesk", model=ScriptedModel([]))
    async with SessionRuntime(agent=other, config=config) as api:
        wrong = Approve(arguments={"address": "ada@example.com"})
        await api.resume(asked.turn_id, asked.request_id, wrong)
    async with _runtime(db, model) as runtime:
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=1, poll_interval_s=0.05, sweep_interval_s=3600)
        working = asyncio.create_task(worker.run(stop))  # a worker hosting the agent
        try:
            rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
        finally:
            stop.set()
            await asyncio.wait_for(working, 20)
    [failed] = [e for e in rest if isinstance(e, ToolFailedEvent)]
    assert failed.code == "tool-arguments-invalid"
    assert failed.result.arguments == {"address": "ada@example.com"}
    assert RUNS == []
    assert rest[-1].type == "done"


@tool
async def note_down(text: str) -> str:
    """Note something down (no approval needed)."""
    return f"noted {text}"


@pytest.mark.parametrize("decision", [Approve(), Deny(note="no")])
async def test_a_call_beside_an_approval_is_not_in_doubt_when_the_batch_resumes(
    tmp_path: Path, decision: Approve | Deny
) -> None:
    """Nothing of a batch runs before its approvals: its other calls never ran, no doubt."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("send_email", to="ada@example.com"), call("note_down", text="sent")
            ),
            ModelStep.text_reply("Done."),
        ]
    )
    agent = Agent(model=model, tools=[send_email, note_down])
    runtime = SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'b.db'}")
    )
    await runtime.open()
    try:
        events = await collect_events(runtime.execute_message("s1", "email Ada, note it"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await runtime.resume(asked.turn_id, asked.request_id, decision)
        rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
    finally:
        await runtime.close()
    assert [e.type for e in rest if e.type == "tool.in_doubt"] == []
    [noted] = [e for e in rest if isinstance(e, ToolCompletedEvent)][-1:]
    assert noted.result.output == "noted sent"
    assert rest[-1].type == "done"


async def test_each_answer_is_on_the_stream_once_though_the_batch_replays_it(
    tmp_path: Path,
) -> None:
    """Two calls ask in one batch: answering the first replays its answer when the second's
    comes in; the stream says how each was answered, once, in answer order."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("send_email", to="a@example.com"), call("send_email", to="b@example.com")
            ),
            ModelStep.text_reply("One sent, one not."),
        ]
    )
    async with _runtime(tmp_path / "two.db", model) as runtime:
        events = await collect_events(runtime.execute_message("s1", "email a and b"))
        first = events[-1]
        assert isinstance(first, ApprovalRequestedEvent)
        await runtime.resume(first.turn_id, first.request_id, Approve(note="fine"))
        # followed, it ends where the turn waits again: a's answer, then b's question
        middle = await collect_events(runtime.follow(first.turn_id, after_seq=first.seq))
        second = middle[-1]
        assert isinstance(second, ApprovalRequestedEvent)
        assert second.arguments == {"to": "b@example.com"}
        assert await collect_events(runtime.follow(first.turn_id, after_seq=second.seq)) == []
        await runtime.resume(second.turn_id, second.request_id, Deny(note="not b"))
        rest = await collect_events(runtime.follow(first.turn_id, after_seq=first.seq))
        durable = [e for e in rest if hasattr(e, "seq")]
        assert durable[: len(middle)] == [e for e in middle if hasattr(e, "seq")]  # again
        view = await runtime.turn_view(first.turn_id)
    answered = [e for e in rest if isinstance(e, ApprovalAnsweredEvent)]
    assert [(e.request_id, e.decision, e.note) for e in answered] == [
        (first.request_id, "approve", "fine"),
        (second.request_id, "deny", "not b"),
    ]
    assert all(e.arguments is None for e in answered)  # nobody changed them
    seqs = [e.seq for e in events if hasattr(e, "seq")] + [e.seq for e in durable]
    assert seqs == list(range(1, len(seqs) + 1))
    assert [(d.answer, d.note) for d in view.decisions] == [("approve", "fine"), ("deny", "not b")]
    assert len(RUNS) == 1  # a ran once; b never


async def test_a_paused_turn_s_view_shows_its_card_by_id_or_by_record(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    runtime = _runtime(tmp_path / "view.db", model)
    await runtime.open()
    try:
        events = await collect_events(runtime.execute_message("s1", "email Ada"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        by_id = await runtime.turn_view(asked.turn_id)
        by_record = await runtime.turn_view(await runtime.turn(asked.turn_id))
        with pytest.raises(TurnNotFoundError):
            await runtime.turn_view("turn_missing")
    finally:
        await runtime.close()
    assert by_id == by_record
    assert by_id.status == "awaiting_approval"
    assert by_id.pending is not None
    assert by_id.pending.request_id == asked.request_id
    assert by_id.pending.tool_name == "send_email"


async def test_a_clarification_with_choices_pauses_then_answers(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("ask_user", question="Which format?", choices=["PDF", "DOCX"])
            ),
            ModelStep.text_reply("PDF it is."),
            ModelStep.text_reply("Here is the PDF plan."),
        ]
    )
    runtime = _runtime(tmp_path / "ask.db", model, clarifications=True)
    await runtime.open()
    try:
        events = await collect_events(runtime.execute_message("s1", "write the report"))
        asked = events[-1]
        assert isinstance(asked, ClarificationRequestedEvent)
        assert (asked.question, asked.choices) == ("Which format?", ("PDF", "DOCX"))
        [ask_user] = [e for e in events if isinstance(e, ToolStartedEvent)]
        assert asked.tool_call_id == ask_user.block.tool_call_id  # the call that waits
        [card] = await runtime.pending("s1")
        assert card.tool_call_id == asked.tool_call_id
        assert (await runtime.turn(asked.turn_id)).status == "awaiting_input"
        assert "ask_user" in [t.name for t in model.calls[0].tools]
        with pytest.raises(Exception, match="answer it with answer"):
            await runtime.resume(asked.turn_id, asked.request_id, Approve())
        await runtime.resume(asked.turn_id, asked.request_id, Answer(text="PDF"))
        rest = await follow_to_done(runtime, asked.turn_id, asked.seq)
    finally:
        await runtime.close()
    [answered] = [e for e in rest if isinstance(e, ToolCompletedEvent)]
    assert answered.result.output == {"answer": "PDF"}
    assert '"PDF"' in model.calls[1].messages[-1].content
    assert rest[-1].type == "done"


async def test_answers_twice_or_for_another_turn_are_refused(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="a@example.com")),
            ModelStep.tool_call_reply(call("send_email", to="b@example.com")),
            ModelStep.text_reply("ok"),
            ModelStep.text_reply("ok"),
        ]
    )
    runtime = _runtime(tmp_path / "twice.db", model)
    await runtime.open()
    try:
        one = (await collect_events(runtime.execute_message("s1", "email a")))[-1]
        two = (await collect_events(runtime.execute_message("s2", "email b")))[-1]
        assert isinstance(one, ApprovalRequestedEvent)
        assert isinstance(two, ApprovalRequestedEvent)
        with pytest.raises(PauseNotFoundError):
            await runtime.resume(one.turn_id, two.request_id, Approve())
        assert (await runtime.turn(two.turn_id)).status == "awaiting_approval"
        await runtime.resume(one.turn_id, one.request_id, Approve())
        with pytest.raises(PauseAnsweredError, match="nothing was changed"):
            await runtime.resume(one.turn_id, one.request_id, Deny())
        await follow_to_done(runtime, one.turn_id, one.seq)
    finally:
        await runtime.close()


async def test_the_store_reads_one_request_of_a_turn_by_its_id(db: tuple[str, str | None]) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="a@example.com")),
            ModelStep.text_reply("ok"),
        ]
    )
    async with _on(db, model) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "email a")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        turn_id = TurnId(asked.turn_id)
        saved = await runtime.store.get_pause(turn_id, asked.request_id)
        assert saved is not None
        assert (saved.kind, saved.tool_call_id) == ("approval", asked.tool_call_id)
        assert saved.payload["tool_name"] == "send_email"
        assert saved.payload["arguments"] == {"to": "a@example.com"}
        assert await runtime.store.get_pause(turn_id, "req_nope") is None
        assert await runtime.store.get_pause(TurnId("turn_nope"), asked.request_id) is None
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        answered = await runtime.store.get_pause(turn_id, asked.request_id)
        assert answered == saved  # as saved, answered or not


async def test_stop_while_awaiting_ends_the_turn_cancelled(db: tuple[str, str | None]) -> None:
    """Ended in the Store with no driver, the turn still says what it cost, and the next
    turn's model reads the call it asked for, that it never ran, and why."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="c@example.com"), text="On it."),
            ModelStep.text_reply("Hello."),
        ]
    )
    runtime = _on(db, model)
    await runtime.open()
    try:
        asked = (await collect_events(runtime.execute_message("s1", "email c")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        assert await runtime.cancel(asked.turn_id, principal="ops-ann") == "cancelled"
        record = await runtime.turn(asked.turn_id)
        assert (record.status, record.error_code) == ("cancelled", None)
        rows = await runtime.audit(asked.turn_id)  # who ended the wait, and when
        stops = [r.payloads.pause_answer for r in rows if r.payloads.pause_answer is not None]
        assert [(s.request_id, s.decision, s.by) for s in stops] == [
            (asked.request_id, "stopped", "ops-ann")
        ]
        stored = [e async for e in runtime.events(asked.turn_id)]
        assert [e.type for e in stored[-2:]] == ["run.finished", "done"]
        finished, done = stored[-2:]
        assert isinstance(done, DoneEvent)
        assert done.status == "cancelled"
        assert done.seq == asked.seq + 2
        assert isinstance(finished, RunFinishedEvent)
        assert (finished.status, finished.model_calls) == ("cancelled", 1)
        assert finished.input_tokens > 0
        assert record.summary is not None
        assert record.summary.input_tokens == finished.input_tokens
        with pytest.raises(PauseAnsweredError):
            await runtime.resume(asked.turn_id, asked.request_id, Approve())
        await collect_events(runtime.execute_message("s1", "hi"))
        [view] = [t for t in await runtime.history("s1") if t.turn_id == asked.turn_id]
    finally:
        await runtime.close()
    assert RUNS == []
    assert view.input_tokens == finished.input_tokens
    shown = [(m.role, m.content, [c.name for c in m.tool_calls]) for m in model.calls[-1].messages]
    assert shown[1:] == [
        ("user", "email c", []),
        ("assistant", "On it.", ["send_email"]),
        ("tool", "Error: the turn ended before this call finished", []),
        ("assistant", "[the person stopped this turn before I answered]", []),
        ("user", "hi", []),
    ]


async def test_an_answered_pause_leaves_the_transcript_to_the_turn_s_end(
    db: tuple[str, str | None],
) -> None:
    """What the pause kept for a Stop is replaced by what the turn itself ends with."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="c@example.com"), text="On it."),
            ModelStep.text_reply("Sent."),
            ModelStep.text_reply("You're welcome."),
        ]
    )
    async with _on(db, model) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "email c")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await runtime.resume(asked.turn_id, asked.request_id, Approve())
        await follow_to_done(runtime, asked.turn_id, asked.seq)
        await collect_events(runtime.execute_message("s1", "thanks"))
    shown = [(m.role, m.content) for m in model.calls[-1].messages]
    assert shown[1:] == [
        ("user", "email c"),
        ("assistant", "On it."),
        ("tool", "sent to c@example.com"),
        ("assistant", "Sent."),
        ("user", "thanks"),
    ]


@tool
async def slow_lookup(order: str) -> str:
    """Look an order up (slowly)."""
    await asyncio.sleep(30)
    return f"order {order}"


@tool
async def quick_note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


async def test_a_stop_while_a_tool_runs_keeps_the_call_and_the_results_that_came_in(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("quick_note", text="a"), call("slow_lookup", order="7"), text="Checking."
            ),
            ModelStep.text_reply("Hello."),
        ]
    )
    agent = Agent(model=model, tools=[quick_note, slow_lookup])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'stop.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = runtime.execute_message("s1", "look up order 7")
        async for event in events:
            if isinstance(event, ToolCompletedEvent):  # the quick one is in; the slow runs
                assert await runtime.cancel(event.turn_id) == "cancelled"  # at once
        await collect_events(runtime.execute_message("s1", "hi"))
    shown = [(m.role, m.content) for m in model.calls[-1].messages]
    assert shown[1:] == [
        ("user", "look up order 7"),
        ("assistant", "Checking."),
        ("tool", "noted a"),
        ("tool", "Error: the turn ended before this call finished"),
        ("assistant", "[the person stopped this turn before I answered]"),
        ("user", "hi"),
    ]


async def test_a_reader_of_a_paused_turn_gets_done_when_it_is_stopped(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="c@example.com"))])
    async with _runtime(tmp_path / "follow.db", model) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "email c")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        reading = asyncio.create_task(
            collect_events(runtime.reader().events(asked.turn_id, after_seq=asked.seq))
        )
        await asyncio.sleep(0.2)  # the reader waits on the paused turn
        assert await runtime.cancel(asked.turn_id) == "cancelled"
        read = await asyncio.wait_for(reading, 10)
    assert [e.type for e in read] == ["run.finished", "done"]


async def test_a_stop_right_after_the_answer_keeps_what_the_pause_kept(tmp_path: Path) -> None:
    """Answered, then stopped before any driver took the turn on: the call never ran, and
    the next turn's model reads so."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("send_email", to="c@example.com"), text="On it."),
            ModelStep.text_reply("Hello."),
        ]
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'race.db'}", run_in_process=False)
    agent = Agent(model=model, tools=[send_email])
    async with SessionRuntime(agent=agent, config=config) as queued:  # no driver here
        asked = (await collect_events(queued.execute_message("s1", "email c")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await queued.resume(asked.turn_id, asked.request_id, Approve())
        assert await queued.cancel(asked.turn_id) == "cancelled"
    async with _runtime(tmp_path / "race.db", model) as runtime:
        await collect_events(runtime.execute_message("s1", "hi"))
    assert RUNS == []
    shown = [(m.role, m.content) for m in model.calls[-1].messages]
    assert shown[1:] == [
        ("user", "email c"),
        ("assistant", "On it."),
        ("tool", "Error: the turn ended before this call finished"),
        ("assistant", "[the person stopped this turn before I answered]"),
        ("user", "hi"),
    ]


class _SlowObserver(Plugin):
    """Looks at each result slowly (a log sink over the network, say)."""

    name: ClassVar[str] = "slow-observer"

    async def after_tool_call(self, ctx: PluginContext, call: ToolCall, result: object) -> None:
        await asyncio.sleep(0.3)


@tool(approval="always")
async def send_note(text: str) -> str:
    """Send a note (a side effect a person approves)."""
    RUNS.append(text)
    return f"sent {text}"


async def test_a_stop_mid_batch_keeps_the_changed_arguments_and_the_results_that_came_in(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("send_note", text="draft"), call("slow_lookup", order="7"), text="On it."
            ),
            ModelStep.text_reply("Hello."),
        ]
    )
    agent = Agent(model=model, tools=[send_note, slow_lookup], plugins=[_SlowObserver()])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'batch.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        asked = (await collect_events(runtime.execute_message("s1", "note it")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await runtime.resume(asked.turn_id, asked.request_id, Approve(arguments={"text": "final"}))
        async for event in runtime.reader().events(asked.turn_id, after_seq=asked.seq):
            if isinstance(event, ToolCompletedEvent):  # the note is sent; the lookup runs
                assert await runtime.cancel(asked.turn_id) == "cancelled"
                break
        await collect_events(runtime.execute_message("s1", "hi"))
    assert RUNS == ["final"]
    shown = [
        (m.role, m.content, [c.arguments for c in m.tool_calls]) for m in model.calls[-1].messages
    ]
    assert shown[1:] == [
        ("user", "note it", []),
        ("assistant", "On it.", ['{"text": "final"}', '{"order": "7"}']),
        ("tool", "sent final", []),
        ("tool", "Error: the turn ended before this call finished", []),
        ("assistant", "[the person stopped this turn before I answered]", []),
        ("user", "hi", []),
    ]


async def test_a_paused_turn_is_never_swept(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="d@example.com"))])
    runtime = _runtime(tmp_path / "sweep.db", model)
    await runtime.open()
    try:
        asked = (await collect_events(runtime.execute_message("s1", "email d")))[-1]
        assert await runtime.store.sweep(ceiling_s=0, max_attempts=1) == []
        assert (await runtime.turn(asked.turn_id)).status == "awaiting_approval"
    finally:
        await runtime.close()


async def test_stop_reaches_a_turn_driven_by_another_process(tmp_path: Path) -> None:
    db = tmp_path / "remote-stop.db"
    # A lease long enough that a loaded machine's late renewal does not let it lapse: the
    # turn must still be its driver's when `other` flags it.
    config = RuntimeConfig(
        database_url=f"sqlite:///{db}", lease_ttl_s=2.0, heartbeat_interval_s=0.05
    )
    model = ScriptedModel([ModelStep.hang("thinking")])
    driving = SessionRuntime(agent=Agent(model=model), config=config)
    other = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    await driving.open()
    await other.open()
    try:
        submission = await driving.start("s1", "go")
        async with asyncio.timeout(10):
            while model.calls == []:
                await asyncio.sleep(0.01)
            # `other` does not drive the turn: it can only flag it for its driver.
            assert await other.cancel(submission.turn_id) == "running"
            while (await other.turn(submission.turn_id)).status == "running":
                await asyncio.sleep(0.02)
        record = await other.turn(submission.turn_id)
        assert (record.status, record.error_code) == ("cancelled", None)
        assert model.aborted == 1  # the driver aborted its own model call
        rows = await other.audit(submission.turn_id)
        assert rows[-1].call is not None
        assert rows[-1].call.outcome == "user-aborted"
    finally:
        await driving.close()
        await other.close()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_a_pause_in_the_first_stage_is_on_disk_before_the_turn_says_so(
    tmp_path: Path, durability: str
) -> None:
    """The checkpoint a pause resumes from is written before the pause is committed, even
    when the very first stage pauses: a process that dies right after (no `close`) leaves
    a turn another process can resume."""
    db = tmp_path / "pause.db"
    before = ScriptedModel([ModelStep.tool_call_reply(call("send_email", to="ada@example.com"))])
    first = SessionRuntime(
        agent=Agent(model=before, tools=[send_email], skip_stages=frozenset({"anchor-plan"})),
        config=RuntimeConfig(
            database_url=f"sqlite:///{db}",
            checkpoint_durability=durability,  # type: ignore[arg-type]
        ),
    )
    await first.open()
    # The same agent (so the same version), with the model the rest of the turn reads.
    second = _runtime(
        db,
        ScriptedModel([ModelStep.text_reply("Sent.")], repeat_last=True),
        skip_stages=frozenset({"anchor-plan"}),
    )
    try:
        events = await collect_events(first.execute_message("s1", "email Ada"))
        asked = events[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        # `first` is never closed before `second` resumes: only what is on disk counts.
        await second.open()
        await second.resume(asked.turn_id, asked.request_id, Approve())
        rest = await follow_to_done(second, asked.turn_id, asked.seq)
    finally:
        await second.close()
        await first.close()
    done = rest[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert len(RUNS) == 1
    assert len(before.calls) == 1  # resumed from the pause, not re-run from the start


SENT_BY: list[str] = []


@tool
async def send_by_api(to: str) -> str:
    """Send a message through the API (it is down)."""
    raise ConnectionError("the API is down")


@tool(approval="always")
async def send_by_mail(to: str) -> str:
    """Send a message by mail: a person approves each one."""
    SENT_BY.append(f"mail to {to}")
    return "mailed"


async def test_a_tool_class_asks_when_any_member_would(tmp_path: Path) -> None:
    """A failing first member must not open a way past a later member's approval."""
    from turnkit.tools import ToolClass

    send = ToolClass("send", [send_by_api, send_by_mail])
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("send", to="attacker@example.com"))],
    )
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'class.db'}")
    async with SessionRuntime(agent=Agent(model=model, tools=[send]), config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "send it"))
    assert isinstance(events[-1], ApprovalRequestedEvent)  # asked before anything ran
    assert events[-1].tool_name == "send"
    assert SENT_BY == []


def test_an_approval_summary_names_every_argument_however_long_one_is() -> None:
    """A model cannot push the argument that matters out of the line a person approves."""
    from turnkit.pauses import summarize_call

    padded = summarize_call("send", {"a" * 500: 1, "body": "x" * 5000, "to": "attacker@example"})
    assert 'to="attacker@example"' in padded
    assert len(padded) < 260
    assert summarize_call("transfer", {"amount": 5, "to": "Bob"}) == (
        'Run transfer with amount=5, to="Bob"'
    )
    many = summarize_call("f", {f"k{n:02}": n for n in range(20)})
    assert many.endswith(", and 8 more")


async def test_a_policy_keyed_on_a_tool_classs_name_still_asks(tmp_path: Path) -> None:
    """The agent's policy names the tool the model sees (the class), not its members."""
    from turnkit.tools import ToolClass

    send = ToolClass("send", [send_by_api, send_by_api])
    model = ScriptedModel([ModelStep.tool_call_reply(call("send", to="a@example.com"))])
    agent = Agent(model=model, tools=[send], approval=lambda name, args: name == "send")
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'named.db'}")
    async with SessionRuntime(agent=agent, config=config) as runtime:
        events = await collect_events(runtime.execute_message("s1", "send it"))
    assert isinstance(events[-1], ApprovalRequestedEvent)


SEEN_BY_THE_TOOL: list[list[str]] = []
LIVE: list[SessionRuntime] = []


@tool(approval="always")
async def wire(amount: int, ctx: ToolContext) -> str:
    """Send money (a person approves); notes what the turn's log holds as it starts."""
    SEEN_BY_THE_TOOL.append([e.type async for e in LIVE[0].events(ctx.turn_id)])
    return f"sent {amount}"


async def test_the_answer_is_committed_before_the_approved_call_runs(tmp_path: Path) -> None:
    """A customer following the turn sees the call approved while it runs, not after."""
    SEEN_BY_THE_TOOL.clear()
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("wire", amount=5)),
        ModelStep.text_reply("Sent."),
    ])  # fmt: skip
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}")
    async with SessionRuntime(agent=Agent(model=model, tools=[wire]), config=config) as rt:
        LIVE[:] = [rt]
        asked = (await collect_events(rt.execute_message("s1", "pay 5")))[-1]
        assert isinstance(asked, ApprovalRequestedEvent)
        await rt.resume(asked.turn_id, asked.request_id, Approve())
        await collect_events(rt.follow(asked.turn_id, after_seq=asked.seq))
    [seen] = SEEN_BY_THE_TOOL
    assert seen[-1] == "approval.answered"


async def test_follow_from_the_start_ends_at_the_pause_the_turn_waits_on_now(
    tmp_path: Path,
) -> None:
    """An earlier pause, answered already, is not where a follower stops."""
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("send_email", to="a@example.com")),
        ModelStep.tool_call_reply(call("send_email", to="b@example.com")),
        ModelStep.text_reply("Both sent."),
    ])  # fmt: skip
    async with _runtime(tmp_path / "two.db", model) as runtime:
        first = (await collect_events(runtime.execute_message("s1", "email a, then b")))[-1]
        assert isinstance(first, ApprovalRequestedEvent)
        await runtime.resume(first.turn_id, first.request_id, Approve())
        second = (await collect_events(runtime.follow(first.turn_id, after_seq=first.seq)))[-1]
        assert isinstance(second, ApprovalRequestedEvent)
        assert second.request_id != first.request_id
        whole = await collect_events(runtime.follow(first.turn_id))
    assert whole[-1] == second
    assert [e.type for e in whole].count("approval.requested") == 2


def test_the_summary_shows_invisible_and_direction_characters_as_escapes() -> None:
    # What a person approves reads as the call has it: a right-to-left override would show
    # `report\u202etxt.exe` as "reportexe.txt", and a zero-width space or tag letter hides.
    from turnkit.pauses import summarize_call

    summary = summarize_call(
        "rename", {"path": "report\u202etxt.exe", "to": "keep\u200bme\U000e0041", "who": "Ørsted"}
    )
    assert summary == (
        'Run rename with path="report\\u202etxt.exe", to="keep\\u200bme\\udb40\\udc41", '
        'who="Ørsted"'
    )
    assert summary.isprintable()


def test_the_summary_shows_control_characters_as_escapes_and_never_cuts_one_in_half() -> None:
    # A terminal acts on ESC and the C1 controls: an argument name or value carrying them
    # could redraw the line a person approves in the CLI.
    from turnkit.pauses import summarize_call

    summary = summarize_call("t", {"k\x1b[2K\rx": "v\x9b2J\x7f"})
    assert summary == 'Run t with k\\u001b[2K\\u000dx="v\\u009b2J\\u007f"'
    assert summary.isprintable()
    cut = summarize_call("t", {"k": "a" * 290 + "\u202e" * 10})
    assert cut.endswith("\\u202e…")
    assert cut.isprintable()
