"""The AG-UI adapter in-process: mapping, pause → interrupt → resume, reconnects, bad input.

`build_app` and `GatedModel` are shared with `test_agui_node.py`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers import WrappedModel, WriteRecorder, report
from tests.support.server import serve
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.http import create_turnkit_router, install_problem_handlers
from turnkit.models import ModelChunk, ModelRequest, TextDelta
from turnkit.protocols.agui import create_agui_router
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/agui"
HOLD_TEXT = "The answer is forty-two, after a careful look at every number we have."


# ── shared helpers ──────────────────────────────────────────────────────────────────────


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(approval="always")
async def transfer(amount: int, to: str) -> str:
    """Move money (needs approval)."""
    return f"sent {amount} EUR to {to}"


@dataclass
class GatedModel(WrappedModel):
    """Plays a ScriptedModel, holding call `gated_call` after `hold_after` text chunks.

    The hold lasts until `POST /test/release` (at most 30 s), so a test can reconnect while
    a block is half written.
    """

    inner: ScriptedModel
    gated_call: int = 0
    hold_after: int = 2
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    _calls: int = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        index, self._calls = self._calls, self._calls + 1
        texts = 0
        async for chunk in self.inner.stream(request):
            if index == self.gated_call and isinstance(chunk, TextDelta):
                if texts == self.hold_after:
                    await asyncio.wait_for(self.gate.wait(), timeout=30)
                texts += 1
            yield chunk


def build_app(
    tmp_path: Path,
    agents: Sequence[Agent],
    *,
    keepalive_s: float = 10.0,
    clarifications: bool = False,
    max_frame_bytes: int = 1_000_000,
    db: tuple[str, str | None] | None = None,
) -> FastAPI:
    """The AG-UI routes (and turnkit's, for cancel) over agents hosted by name.

    The first agent is the default; `forwardedProps.agent` picks another. The runtime is
    opened by the app's lifespan (or by the test, in-process). `db`: (database url, schema)
    of another store than a fresh SQLite file.
    """
    url, schema = db or (f"sqlite:///{tmp_path / 'agui.db'}", None)
    runtime = SessionRuntime(
        agent=agents[0],
        agents=list(agents[1:]),
        config=RuntimeConfig(database_url=url, database_schema=schema),
    )
    gates = [a.model.gate for a in agents if isinstance(a.model, GatedModel)]

    app = FastAPI(lifespan=_lifespan(runtime))
    app.include_router(
        create_agui_router(runtime, keepalive_s=keepalive_s, max_frame_bytes=max_frame_bytes)
    )
    app.include_router(create_turnkit_router(runtime))
    install_problem_handlers(app)
    app.state.runtime = runtime

    @app.post("/test/release")
    async def release() -> dict[str, int]:
        for gate in gates:
            gate.set()
        return {"released": len(gates)}

    return app


def _lifespan(runtime: SessionRuntime) -> Any:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.open()
        try:
            yield
        finally:
            await runtime.close()

    return lifespan


def run_input(thread: str, run: str, content: Any = "hi", **extra: Any) -> dict[str, Any]:
    messages = [] if content is None else [{"id": f"u-{run}", "role": "user", "content": content}]
    return {"threadId": thread, "runId": run, "messages": messages, **extra}


@dataclass
class Frame:
    event: dict[str, Any]
    id: str | None


def parse(text: str) -> list[Frame]:
    """AG-UI frames of a body; asserts the framing (`\\n` lines, comments alone on a line)."""
    assert "\r" not in text
    frames = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            key, _, value = line.partition(": ")
            assert key in ("id", "data"), line
            fields[key] = value
        if "data" in fields:
            frames.append(Frame(json.loads(fields["data"]), fields.get("id")))
        else:
            assert "id" not in fields, block  # never an id without data
    return frames


def types(frames: Sequence[Frame]) -> list[str]:
    return [
        f"{f.event['type']}:{f.event['name']}" if f.event["type"] == "CUSTOM" else f.event["type"]
        for f in frames
    ]


def check_run(frames: Sequence[Frame]) -> None:
    """What every run satisfies: starts and ends once, integer ms, ids increase."""
    assert frames[0].event["type"] == "RUN_STARTED"
    assert frames[-1].event["type"] in ("RUN_FINISHED", "RUN_ERROR")
    ends = [f for f in frames if f.event["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert len(ends) == 1
    assert all(type(f.event["timestamp"]) is int for f in frames)
    ids = [int(f.id) for f in frames if f.id is not None]
    assert ids == sorted(set(ids))
    for f in frames:
        if f.event["type"] in ("TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_START"):
            assert f.id is None  # from ephemeral deltas, or not the last frame of an event
        if f.event["type"] == "CUSTOM" and "seq" not in f.event["value"]:
            assert f.id is None  # an ephemeral turnkit event


# ── in-process (httpx over ASGI) ─────────────────────────────────────────────────────────


@pytest.fixture
def app_for(tmp_path: Path) -> Any:
    """A client of the routes over agents, in-process; the runtime is closed afterwards."""

    @asynccontextmanager
    async def make(*agents: Agent, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
        app = build_app(tmp_path, agents, **kw)
        runtime: SessionRuntime = app.state.runtime
        await runtime.open()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                yield http
        finally:
            await runtime.close()

    return make


async def _post(http: httpx.AsyncClient, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return await http.post(f"{API}/run", json=body, **kw)


async def test_a_tool_using_turn_maps_to_ag_ui_events(app_for: Any) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=2, b=3), text="Adding."),
        ModelStep.text_reply("The sum is 5."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[add])) as http:
        response = await _post(http, run_input("t1", "r1", "What is 2 + 3?"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = parse(response.text)
    check_run(frames)
    assert types(frames) == [
        "RUN_STARTED",
        "CUSTOM:turnkit.turn.started",
        "STEP_STARTED", "STEP_FINISHED",  # anchor-plan
        "STEP_STARTED",  # tool-loop 1
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",  # "Adding."
        "CUSTOM:turnkit.tool.delta",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED", "STEP_STARTED",  # tool-loop 2
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT",
        "STEP_FINISHED", "STEP_STARTED",  # synthesize
        "TEXT_MESSAGE_END",
        "STEP_FINISHED", "STEP_STARTED",  # post-turn
        "CUSTOM:turnkit.usage",
        "STEP_FINISHED",
        "CUSTOM:turnkit.checkpoint.created",
        "CUSTOM:turnkit.run.finished",
        "RUN_FINISHED",
    ]  # fmt: skip
    by_type = {f.event["type"]: f.event for f in frames}
    started = frames[0].event
    assert (started["threadId"], started["runId"]) == ("t1", "r1")
    assert started["metadata"]["turnkit"]["turnId"] == response.headers["x-turn-id"]
    narration = frames[5].event["messageId"]
    assert by_type["TOOL_CALL_START"] == by_type["TOOL_CALL_START"] | {
        "toolCallName": "add", "parentMessageId": narration,
    }  # fmt: skip
    assert json.loads(by_type["TOOL_CALL_ARGS"]["delta"]) == {"a": 2, "b": 3}
    assert by_type["TOOL_CALL_RESULT"]["content"] == "5"
    assert by_type["TOOL_CALL_RESULT"]["toolCallId"] == by_type["TOOL_CALL_START"]["toolCallId"]
    answer_id = frames[15].event["messageId"]
    answer = "".join(
        f.event["delta"] for f in frames
        if f.event["type"] == "TEXT_MESSAGE_CONTENT" and f.event["messageId"] == answer_id
    )  # fmt: skip
    assert answer == "The sum is 5."
    assert [f.event["stepName"] for f in frames if f.event["type"] == "STEP_STARTED"] == [
        "anchor-plan", "tool-loop", "tool-loop", "synthesize", "post-turn",
    ]  # fmt: skip
    finished = frames[-1].event
    assert finished["outcome"] == {"type": "success"}
    assert finished["result"]["turnId"] == response.headers["x-turn-id"]
    assert finished["result"]["usage"]["modelCalls"] == 2
    assert finished["usage"][0]["totalTokens"] == (
        finished["usage"][0]["inputTokens"] + finished["usage"][0]["outputTokens"]
    )
    # Every durable turnkit event went out once, as the id of its last frame.
    assert [int(f.id) for f in frames if f.id is not None] == list(range(1, 20))
    custom = next(f for f in frames if f.event.get("name") == "turnkit.usage")
    assert custom.event["value"]["type"] == "usage"
    assert custom.id == str(custom.event["value"]["seq"])


async def test_parallel_calls_with_no_text_go_in_one_assistant_message(app_for: Any) -> None:
    # HttpAgent makes an assistant message for a call with no parent: the second call of
    # the same model call must join the first's, not make one message per call.
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=1, b=2), call("add", a=3, b=4)),
        ModelStep.text_reply("3 and 7."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[add])) as http:
        frames = parse((await _post(http, run_input("t1", "r1", "Add both"))).text)
    check_run(frames)
    first, second = [f.event for f in frames if f.event["type"] == "TOOL_CALL_START"]
    assert "parentMessageId" not in first
    assert second["parentMessageId"] == first["toolCallId"]


async def test_narration_of_only_white_space_is_no_message(app_for: Any) -> None:
    # A model that writes a line break beside its call: no blank assistant message, and its
    # call's parent is the message the client makes for it, not one that was never sent.
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=1, b=2), text="  \n \t\n"),
        ModelStep.text_reply("It is 3."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[add])) as http:
        frames = parse((await _post(http, run_input("t1", "r1", "Add"))).text)
    check_run(frames)
    started = [f.event for f in frames if f.event["type"] == "TEXT_MESSAGE_START"]
    texts = {e["messageId"]: "" for e in started}
    for f in frames:
        if f.event["type"] == "TEXT_MESSAGE_CONTENT":
            texts[f.event["messageId"]] += f.event["delta"]
    assert list(texts.values()) == ["It is 3."]
    [call_start] = [f.event for f in frames if f.event["type"] == "TOOL_CALL_START"]
    assert "parentMessageId" not in call_start


async def test_a_call_id_an_earlier_turn_used_goes_out_renamed(app_for: Any) -> None:
    # A server that numbers calls per response says `call_1` in every turn; the thread's
    # client holds the first turn's `call_1` (and its result) when the second turn's comes.
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=1, b=1, tool_call_id="call_1")),
        ModelStep.text_reply("2."),
        ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob", tool_call_id="call_1")),
        ModelStep.text_reply("Sent."),
    ])  # fmt: skip
    held = [
        {"id": "u-r1", "role": "user", "content": "Add"},
        {"id": "call_1", "role": "assistant", "toolCalls": [{"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": '{"a":1,"b":1}'}}]},
        {"id": "result_call_1", "role": "tool", "toolCallId": "call_1", "content": "2"},
        {"id": "blk", "role": "assistant", "content": "2."},
        {"id": "u-r2", "role": "user", "content": "Pay Bob"},
    ]  # fmt: skip
    async with app_for(Agent(model=model, tools=[add, transfer])) as http:
        await _post(http, run_input("t1", "r1", "Add"))
        paused = parse((await _post(http, {**run_input("t1", "r2"), "messages": held})).text)
        check_run(paused)
        [start] = [f.event for f in paused if f.event["type"] == "TOOL_CALL_START"]
        renamed = start["toolCallId"]
        assert renamed != "call_1"  # the client's call_1 is the first turn's
        [args] = [f.event for f in paused if f.event["type"] == "TOOL_CALL_ARGS"]
        assert (args["toolCallId"], json.loads(args["delta"])) == (
            renamed,
            {"amount": 5, "to": "Bob"},
        )
        [interrupt] = paused[-1].event["outcome"]["interrupts"]
        assert interrupt["toolCallId"] == interrupt["metadata"]["turnkit"]["toolCallId"] == renamed
        function = {"name": "transfer", "arguments": args["delta"]}
        asked = {
            "id": renamed,
            "role": "assistant",
            "toolCalls": [{"id": renamed, "type": "function", "function": function}],
        }
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        body = {**run_input("t1", "r3"), "messages": [*held, asked], "resume": resume}
        resumed = parse((await _post(http, body)).text)
    check_run(resumed)
    [result] = [f.event for f in resumed if f.event["type"] == "TOOL_CALL_RESULT"]
    assert (result["toolCallId"], result["messageId"]) == (renamed, f"result_{renamed}")
    assert result["content"] == "sent 5 EUR to Bob"


async def test_a_fast_turn_streams_in_far_fewer_writes_than_events(tmp_path: Path) -> None:
    """The frames of turnkit events ready together go out in one write, all, in order."""
    text = "abcdefghij" * 30
    agent = Agent(model=ScriptedModel([ModelStep.text_reply(text, chunk_size=1)]))
    app = build_app(tmp_path, [agent])
    runtime: SessionRuntime = app.state.runtime
    recording = WriteRecorder(app)
    await runtime.open()
    try:
        transport = httpx.ASGITransport(app=recording)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            response = await _post(http, run_input("fast", "r1", "go"))
    finally:
        await runtime.close()
    frames = parse(response.text)
    check_run(frames)
    content = [f.event["delta"] for f in frames if f.event["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(content) == text
    assert len(recording.writes) < len(frames) / 4


async def test_an_oversized_frame_is_replaced_and_the_run_goes_on(app_for: Any) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("report", pages=2)),
        ModelStep.text_reply("The report is written."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[report]), max_frame_bytes=5_000) as http:
        response = await _post(http, run_input("t-big", "r1", "Write the report"))
    assert response.status_code == 200, response.text
    assert max(len(block) for block in response.text.split("\n\n")) < 5_000
    frames = parse(response.text)
    check_run(frames)
    assert frames[-1].event["type"] == "RUN_FINISHED"
    assert "CUSTOM:turnkit.frame_dropped" not in types(frames)
    [result] = [f for f in frames if f.event["type"] == "TOOL_CALL_RESULT"]
    assert result.event["content"].startswith("[a result of ")  # the call still has one
    assert result.event["metadata"]["turnkit"]["droppedBytes"] > 5_000
    assert result.id is not None  # it keeps the frame's id: a resume goes on after it
    text = "".join(f.event["delta"] for f in frames if f.event["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "The report is written."


async def test_a_replayed_text_longer_than_the_bound_comes_in_several_contents(
    app_for: Any,
) -> None:
    # A replay sends a finished block as one content with its whole text: cut, not dropped.
    text = "Línea 👍 שלום\n" * 1_500  # about 24,000 characters, beyond the 5,000-byte bound
    model = ScriptedModel([ModelStep.text_reply(text, chunk_size=100)])
    async with app_for(Agent(model=model), max_frame_bytes=5_000) as http:
        live = await _post(http, run_input("t-long", "r1", "Write"))
        replayed = await _post(
            http, run_input("t-long", "r1", "Write"), headers={"Last-Event-ID": "0"}
        )
    for response in (live, replayed):
        assert response.status_code == 200, response.text
        assert max(len(block.encode()) for block in response.text.split("\n\n")) < 5_000
        frames = parse(response.text)
        check_run(frames)
        assert "CUSTOM:turnkit.frame_dropped" not in types(frames)
        content = [f for f in frames if f.event["type"] == "TEXT_MESSAGE_CONTENT"]
        assert "".join(f.event["delta"] for f in content) == text


async def test_posting_the_same_run_again_starts_no_second_turn(app_for: Any) -> None:
    model = ScriptedModel([ModelStep.text_reply("Once.")])
    async with app_for(Agent(model=model)) as http:
        first = await _post(http, run_input("t1", "r1"))
        again = await _post(http, run_input("t1", "r1"))
    assert first.headers["x-turn-id"] == again.headers["x-turn-id"]
    assert types(parse(again.text)) == types(parse(first.text))


async def test_approval_pauses_as_an_interrupt_and_resume_continues_the_same_turn(
    app_for: Any,
) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob")),
        ModelStep.text_reply("Sent."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[transfer])) as http:
        first = await _post(http, run_input("t1", "r1", "Send Bob 5 EUR"))
        frames = parse(first.text)
        check_run(frames)
        assert types(frames)[-4:] == [
            "TOOL_CALL_END", "CUSTOM:turnkit.approval.requested", "STEP_FINISHED", "RUN_FINISHED",
        ]  # fmt: skip
        finished = frames[-1].event
        assert finished["runId"] == "r1"
        (interrupt,) = finished["outcome"]["interrupts"]
        asked = frames[-3].event["value"]
        assert interrupt["id"] == asked["request_id"]
        assert interrupt["reason"] == "tool_call"
        assert interrupt["toolCallId"] == asked["tool_call_id"]
        assert interrupt["message"] == asked["summary"]
        assert interrupt["responseSchema"]["required"] == ["approved"]
        assert interrupt["metadata"]["turnkit"] | {} == {
            "turnId": first.headers["x-turn-id"], "kind": "approval",
            "toolCallId": asked["tool_call_id"], "toolName": "transfer",
            "arguments": {"amount": 5, "to": "Bob"}, "summary": asked["summary"],
        }  # fmt: skip
        assert frames[-1].id == str(asked["seq"])

        # The thread takes no new message while the interrupt is open.
        blocked = await _post(http, run_input("t1", "r-other", "something else"))
        assert (blocked.status_code, blocked.json()["code"]) == (422, "invalid-input")

        # A reconnect to the interrupted run says the interrupt again, and ends.
        again = await _post(
            http, run_input("t1", "r1", "Send Bob 5 EUR"), headers={"Last-Event-ID": frames[-1].id}
        )
        assert types(parse(again.text)) == ["RUN_STARTED", "STEP_STARTED", "STEP_FINISHED",
                                            "RUN_FINISHED"]  # fmt: skip
        assert parse(again.text)[-1].event["outcome"]["interrupts"] == [interrupt]
        assert all(f.id is None for f in parse(again.text))

        resume = [{"interruptId": interrupt["id"], "status": "resolved",
                   "payload": {"approved": True}}]  # fmt: skip
        resumed = await _post(http, run_input("t1", "r2", None, resume=resume))
        assert resumed.status_code == 200, resumed.text
        assert resumed.headers["x-turn-id"] == first.headers["x-turn-id"]
        rest = parse(resumed.text)
        check_run(rest)
        assert types(rest)[:5] == ["RUN_STARTED", "STEP_STARTED",
                                   "CUSTOM:turnkit.approval.answered", "TOOL_CALL_RESULT",
                                   "STEP_FINISHED"]  # fmt: skip
        assert rest[0].event["runId"] == "r2"
        assert rest[1].event["stepName"] == "tool-loop"  # the step the pause left open
        answered = rest[2].event["value"]
        assert (answered["request_id"], answered["decision"]) == (interrupt["id"], "approve")
        assert int(rest[2].id or 0) == asked["seq"] + 1  # the same turn, the next seq
        assert rest[3].event["toolCallId"] == interrupt["toolCallId"]
        assert rest[3].event["content"] == "sent 5 EUR to Bob"
        assert rest[-1].event["outcome"] == {"type": "success"}
        assert "TOOL_CALL_START" not in types(rest)

        # Answering twice is refused; a reconnect of the resumed run carries on instead.
        twice = await _post(http, run_input("t1", "r2", None, resume=resume))
        assert (twice.status_code, twice.json()["code"]) == (409, "pause-already-answered")
        reconnect = await _post(
            http, run_input("t1", "r2", None, resume=resume), headers={"Last-Event-ID": rest[2].id}
        )
        tail = parse(reconnect.text)
        check_run(tail)
        assert [f.id for f in tail if f.id] == [f.id for f in rest if f.id][1:]


async def test_a_denied_approval_is_a_failed_tool_result(app_for: Any) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob")),
        ModelStep.text_reply("Not sent."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[transfer])) as http:
        first = parse((await _post(http, run_input("t1", "r1", "Send"))).text)
        interrupt = first[-1].event["outcome"]["interrupts"][0]
        resume = [{"interruptId": interrupt["id"], "status": "resolved",
                   "payload": {"approved": False, "note": "not today"}}]  # fmt: skip
        rest = parse((await _post(http, run_input("t1", "r2", None, resume=resume))).text)
    result = next(f.event for f in rest if f.event["type"] == "TOOL_CALL_RESULT")
    assert result["metadata"] == {"turnkit": {"isError": True, "code": "tool-denied"}}
    assert "not today" in result["content"]
    assert rest[-1].event["outcome"] == {"type": "success"}


async def test_dismissing_the_interrupt_of_a_stopped_turn_ends_its_run_cancelled(
    app_for: Any,
) -> None:
    # HttpAgent keeps an interrupt pending until a run ends: after a Stop of the paused
    # turn, the client's dismissal must end one, or the thread takes no new message.
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob")),
        ModelStep.text_reply("Next one."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[transfer])) as http:
        first = await _post(http, run_input("t1", "r1", "Send"))
        interrupt = parse(first.text)[-1].event["outcome"]["interrupts"][0]
        turn = first.headers["x-turn-id"]
        assert (await http.post(f"/api/harness/turns/{turn}/cancel")).status_code == 200
        dismiss = [{"interruptId": interrupt["id"], "status": "cancelled"}]
        ended = await _post(http, run_input("t1", "r2", None, resume=dismiss))
        assert ended.status_code == 200, ended.text
        frames = parse(ended.text)
        check_run(frames)
        assert frames[-1].event["type"] == "RUN_FINISHED"
        assert frames[-1].event.get("outcome", {}).get("type") != "interrupt"
        # An approval of it now is still refused: the turn is over.
        approve = [{"interruptId": interrupt["id"], "status": "resolved",
                    "payload": {"approved": True}}]  # fmt: skip
        again = await _post(http, run_input("t1", "r3", None, resume=approve))
        assert again.status_code == 409
        nxt = await _post(http, run_input("t1", "r4", "And now?"))
        assert nxt.status_code == 200, nxt.text
        assert parse(nxt.text)[-1].event["type"] == "RUN_FINISHED"


async def test_a_stopped_or_failed_turn_s_run_reports_its_usage(
    tmp_path: Path, db: tuple[str, str | None]
) -> None:
    """AG-UI's `usage` on every ending, so a thread's runs add up to what its turns cost."""
    from turnkit.errors import ProviderError

    paused = Agent(name="pays", model=ScriptedModel([
        ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob")),
    ]), tools=[transfer])  # fmt: skip
    fails = Agent(name="fails", model=ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=1, b=2)),
        ModelStep.fail(ProviderError("quota", status_code=400)),
    ]), tools=[add])  # fmt: skip
    app = build_app(tmp_path, [paused, fails], db=db)
    runtime: SessionRuntime = app.state.runtime
    async with runtime:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            first = await _post(http, run_input("t1", "r1", "Send"))
            assert "usage" not in parse(first.text)[-1].event  # counted when the turn ends
            interrupt = parse(first.text)[-1].event["outcome"]["interrupts"][0]
            turn = first.headers["x-turn-id"]
            assert (await http.post(f"/api/harness/turns/{turn}/cancel")).status_code == 200
            dismiss = [{"interruptId": interrupt["id"], "status": "cancelled"}]
            stopped = parse((await _post(http, run_input("t1", "r2", None, resume=dismiss))).text)
            failed = parse((await _post(
                http, run_input("t2", "r3", forwardedProps={"agent": "fails"})
            )).text)  # fmt: skip
    check_run(stopped)
    check_run(failed)
    assert stopped[-1].event["outcome"] == {"type": "cancelled"}
    assert failed[-1].event["type"] == "RUN_ERROR"
    for frames, calls in ((stopped, 1), (failed, 2)):
        [usage] = frames[-1].event["usage"]
        assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0
        account = next(
            f.event["value"] for f in frames if f.event.get("name") == "turnkit.run.finished"
        )
        assert account["model_calls"] == calls
        assert (usage["inputTokens"], usage["outputTokens"]) == (
            account["input_tokens"], account["output_tokens"],
        )  # fmt: skip


async def test_an_approval_with_edited_args_runs_the_call_with_them(app_for: Any) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("transfer", amount=500, to="Bob")),
        ModelStep.text_reply("Sent."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, tools=[transfer])) as http:
        first = parse((await _post(http, run_input("t1", "r1", "Send"))).text)
        interrupt = first[-1].event["outcome"]["interrupts"][0]
        schema = interrupt["responseSchema"]["properties"]
        edited = {"approved": True, "editedArgs": {"amount": 50, "to": "Bob"}}
        cancelled = {"approved": False, "editedArgs": {"amount": 50, "to": "Bob"}}
        refused = [{"interruptId": interrupt["id"], "status": "resolved", "payload": cancelled}]
        bad = await _post(http, run_input("t1", "r2", None, resume=refused))
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": edited}]
        rest = parse((await _post(http, run_input("t1", "r3", None, resume=resume))).text)
    assert schema["editedArgs"] == {"type": "object"}
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid-input")
    assert "editedArgs" in bad.json()["detail"]
    result = next(f.event for f in rest if f.event["type"] == "TOOL_CALL_RESULT")
    assert result["content"] == "sent 50 EUR to Bob"
    assert model.calls[1].messages[-2].tool_calls[0].arguments == '{"amount": 50, "to": "Bob"}'


async def test_a_question_is_an_input_required_interrupt_answered_by_resume(
    app_for: Any,
) -> None:
    model = ScriptedModel([
        ModelStep.tool_call_reply(call("ask_user", question="Which one?", choices=["a", "b"])),
        ModelStep.text_reply("You chose b."),
    ])  # fmt: skip
    async with app_for(Agent(model=model, clarifications=True)) as http:
        first = parse((await _post(http, run_input("t1", "r1", "Pick"))).text)
        (interrupt,) = first[-1].event["outcome"]["interrupts"]
        ask_call = next(f.event for f in first if f.event["type"] == "TOOL_CALL_START")
        assert ask_call["toolCallName"] == "ask_user"
        assert interrupt["reason"] == "input_required"
        assert interrupt["message"] == "Which one?"
        assert interrupt["toolCallId"] == ask_call["toolCallId"]
        assert interrupt["metadata"]["turnkit"]["choices"] == ["a", "b"]
        assert interrupt["responseSchema"]["properties"]["answer"]["examples"] == ["a", "b"]
        bad = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": 1}}]
        refused = await _post(http, run_input("t1", "r2", None, resume=bad))
        assert refused.status_code == 422
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"answer": "b"}}
        ]
        rest = parse((await _post(http, run_input("t1", "r2", None, resume=resume))).text)
    check_run(rest)
    result = next(f.event for f in rest if f.event["type"] == "TOOL_CALL_RESULT")
    assert result["toolCallId"] == ask_call["toolCallId"]
    assert json.loads(result["content"]) == {"answer": "b"}
    assert rest[-1].event["outcome"] == {"type": "success"}


async def test_a_failed_turn_ends_in_run_error(app_for: Any) -> None:
    from turnkit.errors import ProviderError

    model = ScriptedModel([ModelStep.fail(ProviderError("quota", status_code=400))])
    async with app_for(Agent(model=model)) as http:
        frames = parse((await _post(http, run_input("t1", "r1"))).text)
    check_run(frames)
    assert frames[-1].event["type"] == "RUN_ERROR"
    error = next(f.event["value"] for f in frames if f.event.get("name") == "turnkit.error")
    assert frames[-1].event["code"] == error["code"]
    assert frames[-1].event["message"]


async def test_a_reconnect_after_the_end_states_the_end_again(app_for: Any) -> None:
    async with app_for(Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]))) as http:
        frames = parse((await _post(http, run_input("t1", "r1"))).text)
        last_id = [f.id for f in frames if f.id][-1]
        again = parse(
            (await _post(http, run_input("t1", "r1"), headers={"Last-Event-ID": last_id})).text
        )
        middle = [f.id for f in frames if f.id][5]
        rest = parse(
            (await _post(http, run_input("t1", "r1"), headers={"Last-Event-ID": middle})).text
        )
    assert types(again) == ["RUN_STARTED", "RUN_FINISHED"]
    assert again[-1].event["outcome"] == {"type": "success"}
    check_run(rest)
    assert [f.id for f in rest if f.id] == [f.id for f in frames if f.id][6:]


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        ({"runId": "r1", "messages": []}, {}, 422, "invalid-input"),  # no threadId
        (run_input("t1", "r1", None), {}, 422, "invalid-input"),  # no user message
        (run_input("t 1", "r1"), {}, 422, "invalid-session-id"),
        (run_input("t1", "r1", [{"type": "audio", "source": {}}]), {}, 422, "invalid-input"),
        (run_input("t1", "r1", forwardedProps={"agent": "nobody"}), {}, 404, "agent-not-found"),
        (run_input("t1", "r1"), {"Last-Event-ID": "01"}, 400, "replay-cursor-invalid"),
        (run_input("t1", "nope"), {"Last-Event-ID": "1"}, 404, "turn-not-found"),
        (run_input("t1", "r1", None, resume=[]), {}, 422, "invalid-input"),  # no resume: a run
        (
            run_input("t1", "r1", None, resume=[{"interruptId": "x", "status": "resolved"}]),
            {},
            404,
            "session-not-found",
        ),
    ],
)
async def test_bad_input_answers_a_problem_body(
    app_for: Any, body: dict[str, Any], headers: dict[str, str], status: int, code: str
) -> None:
    async with app_for(Agent(model=ScriptedModel([]))) as http:
        response = await _post(http, body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code


async def test_resume_problems_answer_before_anything_is_written(app_for: Any) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hi.")], repeat_last=True)
    async with app_for(Agent(model=model)) as http:
        started = await _post(http, run_input("t1", "r1"))
        last_id = [f.id for f in parse(started.text) if f.id][-1]
        unknown = [{"interruptId": "req_nope", "status": "resolved", "payload": {}}]
        missing = await _post(http, run_input("t1", "r2", None, resume=unknown))
        ahead = await _post(
            http, run_input("t1", "r1"), headers={"Last-Event-ID": str(int(last_id) + 1)}
        )
        two = unknown + unknown
        many = await _post(http, run_input("t1", "r3", None, resume=two))
        empty = await _post(http, run_input("t1", "r4", "again", resume=[]))  # AG-UI: no resume
        image = {"type": "image", "source": {"type": "file", "value": "f_1"}}
        file = await _post(http, run_input("t1", "r5", [image]))
    assert empty.status_code == 200
    assert parse(empty.text)[-1].event["type"] == "RUN_FINISHED"
    assert (file.status_code, file.json()["code"]) == (422, "invalid-input")
    assert "source must be of type 'url' or 'data', not 'file'" in file.json()["detail"]
    assert (missing.status_code, missing.json()["code"]) == (404, "pause-not-found")
    assert (ahead.status_code, ahead.json()["code"]) == (416, "replay-cursor-invalid")
    assert (many.status_code, many.json()["code"]) == (422, "invalid-input")


# ── a real server: idle keep-alives and a reconnect mid-text ────────────────────────────


def _read_raw(url: str, body: dict[str, Any], seconds: float, **headers: str) -> str:
    """The raw body of a stream for `seconds` (or until it ends)."""
    got = ""
    deadline = time.monotonic() + seconds
    with (
        httpx.Client(base_url=url, timeout=10) as http,
        http.stream("POST", f"{API}/run", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_text():  # keep-alives come every few tenths of a second
            got += chunk
            if time.monotonic() > deadline:
                break
    return got


def test_an_idle_stream_sends_only_comment_keep_alives(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.hang("Thinking")])
    app = build_app(tmp_path, [Agent(model=model)], keepalive_s=0.2)
    with serve(app) as url:
        raw = _read_raw(url, run_input("t1", "r1"), 1.5)
        turn = httpx.get(f"{url}/api/harness/sessions/t1/history").json()[0]["turnId"]
        httpx.post(f"{url}/api/harness/turns/{turn}/cancel")
    assert raw.count(": keep-alive\n") >= 3
    assert "\n\n\n" not in raw  # no blank-data event
    assert "data: \n" not in raw
    for line in raw.split("\n"):
        assert line == "" or line.startswith(("data: {", "id: ", ": keep-alive")), line
    frames = parse(raw.rsplit("\n\n", 1)[0])  # the frames sent before the idle time
    assert types(frames)[-1] == "TEXT_MESSAGE_CONTENT"


def test_a_reconnect_mid_text_sends_the_rest_of_the_message_once(tmp_path: Path) -> None:
    model = GatedModel(ScriptedModel([ModelStep.text_reply(HOLD_TEXT, chunk_size=6)]))
    with serve(build_app(tmp_path, [Agent(model=model)])) as url:
        body = run_input("t1", "r1", "go")
        got = ""
        with (
            httpx.Client(base_url=url, timeout=10) as http,
            http.stream("POST", f"{API}/run", json=body) as response,
        ):
            for chunk in response.iter_text():
                got += chunk
                if got.count("TEXT_MESSAGE_CONTENT") == 2:
                    break  # the model holds after two pieces: drop the connection here
        before = parse(got.rsplit("\n\n", 1)[0] + "\n\n")
        held = "".join(f.event["delta"] for f in before
                       if f.event["type"] == "TEXT_MESSAGE_CONTENT")  # fmt: skip
        message_id = next(f.event["messageId"] for f in before
                          if f.event["type"] == "TEXT_MESSAGE_START")  # fmt: skip
        last_id = [f.id for f in before if f.id][-1]
        client_has = held[:7]  # the client kept only part of what was sent
        body["messages"].append({"id": message_id, "role": "assistant", "content": client_has})
        with (
            httpx.Client(base_url=url, timeout=10) as http,
            http.stream(
                "POST", f"{API}/run", json=body, headers={"Last-Event-ID": last_id}
            ) as response,
        ):
            text = ""
            for chunk in response.iter_text():
                text += chunk
                if "TEXT_MESSAGE_CONTENT" in text:
                    http.post("/test/release")  # the rest of the text may come now
                if '"RUN_FINISHED"' in text:
                    break
    after = parse(text)
    check_run(after)
    contents = [f.event for f in after if f.event["type"] == "TEXT_MESSAGE_CONTENT"]
    assert {c["messageId"] for c in contents} == {message_id}
    assert client_has + "".join(c["delta"] for c in contents) == HOLD_TEXT
    assert contents[0]["delta"] == held[7:]  # the snapshot: what the client lacked so far
    assert types(after).count("TEXT_MESSAGE_START") == 1
    assert types(after).count("TEXT_MESSAGE_END") == 1
    assert [int(f.id) for f in after if f.id][0] == int(last_id) + 1


async def test_an_asked_agents_question_names_that_agent_not_an_older_ask_user(
    app_for: Any,
) -> None:
    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("ask_user", question="Which order?")),
            ModelStep.text_reply("Refunded B2."),
        ]),
        clarifications=True,
    )  # fmt: skip
    front = Agent(
        name="desk",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("ask_user", question="Refund or exchange?")),
            ModelStep.tool_call_reply(call("refunds", message="Refund the order.")),
            ModelStep.text_reply("Done: B2 refunded."),
        ]),
        tools=[refunds.as_tool()],
        clarifications=True,
    )  # fmt: skip
    async with app_for(front) as http:
        first = parse((await _post(http, run_input("t1", "r1", "Help"))).text)
        (own,) = first[-1].event["outcome"]["interrupts"]
        assert "asked" not in own["metadata"]["turnkit"]
        resume = [{"interruptId": own["id"], "status": "resolved", "payload": {"answer": "refund"}}]
        second = parse((await _post(http, run_input("t1", "r2", None, resume=resume))).text)
        (handed,) = second[-1].event["outcome"]["interrupts"]
        assert handed["message"] == "Which order?"
        assert handed["metadata"]["turnkit"]["asked"]["agent"] == "refunds"
        # The call that asked the agent waits: not the desk's own, answered, ask_user call.
        asking = [
            f.event["toolCallId"]
            for f in second
            if f.event["type"] == "TOOL_CALL_START" and f.event["toolCallName"] == "refunds"
        ]
        assert [handed["toolCallId"]] == asking
        assert handed["toolCallId"] != own["toolCallId"]
        assert handed["metadata"]["turnkit"]["toolCallId"] == handed["toolCallId"]
        resume = [{"interruptId": handed["id"], "status": "resolved", "payload": {"answer": "B2"}}]
        rest = parse((await _post(http, run_input("t1", "r3", None, resume=resume))).text)
    check_run(rest)
    results = [f.event for f in rest if f.event["type"] == "TOOL_CALL_RESULT"]
    assert [r["content"] for r in results] == ["Refunded B2."]
    assert rest[-1].event["outcome"] == {"type": "success"}


def thinking_agent(name: str = "thinking") -> Agent:
    """An agent whose model shares its reasoning and whose utility model summarizes it."""
    model = ScriptedModel([ModelStep.text_reply("Four. " * 40, thinking="two and two make four")])
    utility = ScriptedModel(
        [ModelStep.text_reply("It added the numbers.")], name="background", repeat_last=True
    )
    return Agent(
        name=name, model=model, utility_model=utility, skip_stages=frozenset({"anchor-plan"})
    )


async def test_a_thinking_summary_is_a_reasoning_message(app_for: Any) -> None:
    """AG-UI's own reasoning events, so a client shows it; the CUSTOM event stays."""
    async with app_for(thinking_agent()) as http:
        frames = parse((await _post(http, run_input("t1", "r1"))).text)
        check_run(frames)
        reasoning = [f.event for f in frames if f.event["type"].startswith("REASONING")]
        assert [e["type"] for e in reasoning] == [
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END",
        ]
        block_id = reasoning[0]["messageId"]
        assert {e["messageId"] for e in reasoning} == {block_id}
        assert reasoning[1]["role"] == "reasoning"
        assert reasoning[2]["delta"] == "It added the numbers."
        assert "CUSTOM:turnkit.thinking.complete" in types(frames)

        # A replay from the start, the client holding part of it: only the rest.
        body = run_input("t1", "r1")
        body["messages"].append({"id": block_id, "role": "reasoning", "content": "It added"})
        again = parse((await _post(http, body, headers={"Last-Event-ID": "0"})).text)
    check_run(again)
    deltas = [f.event["delta"] for f in again if f.event["type"] == "REASONING_MESSAGE_CONTENT"]
    assert deltas == [" the numbers."]


async def test_a_replay_sends_no_call_whose_result_the_client_holds(app_for: Any) -> None:
    """`HttpAgent` lists every call started in a run and given no result as pending (a
    front end may run it): a call whose result the client holds is not started again."""
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("add", a=2, b=3)), ModelStep.text_reply("5.")]
    )
    async with app_for(Agent(model=model, tools=[add])) as http:
        first = parse((await _post(http, run_input("t1", "r1", "Add"))).text)
        [start] = [f.event for f in first if f.event["type"] == "TOOL_CALL_START"]
        [args] = [f.event for f in first if f.event["type"] == "TOOL_CALL_ARGS"]
        [result] = [f.event for f in first if f.event["type"] == "TOOL_CALL_RESULT"]
        call_id = start["toolCallId"]
        function = {"name": "add", "arguments": args["delta"]}
        held = [
            {"id": "u-r1", "role": "user", "content": "Add"},
            {"id": call_id, "role": "assistant",
             "toolCalls": [{"id": call_id, "type": "function", "function": function}]},
            {"id": result["messageId"], "role": "tool", "toolCallId": call_id, "content": "5"},
        ]  # fmt: skip
        body = {**run_input("t1", "r1"), "messages": held}
        again = parse((await _post(http, body, headers={"Last-Event-ID": "0"})).text)
    check_run(again)
    started = {f.event["toolCallId"] for f in again if f.event["type"] == "TOOL_CALL_START"}
    answered = {f.event["toolCallId"] for f in again if f.event["type"] == "TOOL_CALL_RESULT"}
    assert started - answered == set()  # nothing the client would take as pending
    assert call_id not in started
    text = "".join(f.event["delta"] for f in again if f.event["type"] == "TOOL_CALL_ARGS")
    assert text == ""
    assert again[-1].event["outcome"] == {"type": "success"}
    assert "5." in "".join(
        f.event["delta"] for f in again if f.event["type"] == "TEXT_MESSAGE_CONTENT"
    )
