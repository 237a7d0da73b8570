"""The AI SDK UI message stream adapter in-process: mapping, approvals, resume, bad input.

`build_app` and `GatedModel` are shared with `test_ai_sdk_node.py`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from fastapi import FastAPI, Header

from tests.helpers import WrappedModel, WriteRecorder, report
from tests.support.server import serve
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.events import (
    ApprovalAnsweredEvent,
    ApprovalRequestedEvent,
    DoneEvent,
    ErrorEvent,
    MessageCitationsEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    MessageSnapshotEvent,
    ProviderCascadeEvent,
    RunFinishedEvent,
    StepEndEvent,
    StepStartEvent,
    ThinkingCompleteEvent,
    ThinkingDeltaEvent,
    ToolCompletedEvent,
    ToolDeltaEvent,
    ToolFailedEvent,
    ToolStartedEvent,
    TurnRecoveringEvent,
    UsageEvent,
)
from turnkit.http import install_problem_handlers
from turnkit.ids import SessionId
from turnkit.models import ModelChunk, ModelRequest, TextDelta
from turnkit.models.family import ModelFamily
from turnkit.plugins import Plugin, PluginContext, ToolCall
from turnkit.protocols import _ai_sdk_stream as wire
from turnkit.protocols.ai_sdk import (
    ENDED_REPLAY_S,
    UIMessageStreamTranslator,
    _farewell,
    _resumable,
    create_ai_sdk_router,
)
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/chat"
HOLD_TEXT = "The answer is forty-two, after a careful look at every number."


# ── shared helpers ──────────────────────────────────────────────────────────────────────


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(approval="always")
async def delete_file(path: str) -> str:
    """Delete a file (needs approval)."""
    return f"deleted {path}"


@tool
async def slow(x: int) -> int:
    """Take a while."""
    await asyncio.sleep(0.4)
    return x


@dataclass
class GatedModel(WrappedModel):
    """ScriptedModel cannot hold a reply between two of its chunks until the test says so.

    This one plays the scripted steps, and in the step number `gated_call` (0-based) stops
    after `hold_after` text chunks until `gate` is set (by `POST /test/release`).
    """

    inner: ScriptedModel
    gated_call: int
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
    model: ScriptedModel | GatedModel | ModelFamily,
    *,
    tools: Sequence[Any] = (add, delete_file),
    keepalive_s: float = 10.0,
    max_frame_bytes: int = 1_000_000,
    plugins: Sequence[Plugin] = (),
    **agent_options: Any,
) -> FastAPI:
    """An app serving the AI SDK routes for one scripted agent (runtime opened by lifespan)."""
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=list(tools), plugins=list(plugins), **agent_options),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'ai_sdk.db'}"),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with runtime:
            yield

    app = FastAPI(lifespan=lifespan)
    app.include_router(
        create_ai_sdk_router(runtime, keepalive_s=keepalive_s, max_frame_bytes=max_frame_bytes)
    )
    install_problem_handlers(app)
    app.state.runtime = runtime

    @app.post("/test/release")
    async def release() -> dict[str, bool]:
        if isinstance(model, GatedModel):
            model.gate.set()
        return {"released": True}

    @app.post("/test/cancel/{turn_id}")
    async def cancel(turn_id: str) -> dict[str, str]:  # the harness route's Stop
        return {"status": await runtime.cancel(turn_id)}

    return app


class NoDeletes(Plugin):
    """Denies every file deletion, also one a person approved (it runs after approvals)."""

    name: ClassVar[str] = "no-deletes"

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        return "deletions are frozen today" if call.name == "delete_file" else None


def user(text: str, message_id: str = "m1") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def chunks_of(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of a UI message stream body (checks the framing on the way)."""
    assert "\r" not in text
    out: list[dict[str, Any]] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            assert line.startswith(("data: ", ":")), line
            if line == "data: [DONE]":
                out.append({"type": "[DONE]"})
            elif line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def types(chunks: Sequence[dict[str, Any]]) -> list[str]:
    """Chunk types, runs of deltas of one block collapsed to one."""
    out: list[str] = []
    for chunk in chunks:
        kind = chunk["type"]
        if kind.endswith("-delta") and out and out[-1] == kind:
            continue
        out.append(kind)
    return out


def fold(chunks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A tiny reader of the stream into message parts (the Node tests use the real one)."""
    parts: list[dict[str, Any]] = []
    open_text: dict[str, dict[str, Any]] = {}
    tools: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        kind = chunk["type"]
        if kind == "start-step":
            parts.append({"type": "step-start"})
        elif kind == "text-start":
            assert chunk["id"] not in open_text, f"text {chunk['id']} started twice"
            open_text[chunk["id"]] = {"type": "text", "text": ""}
            parts.append(open_text[chunk["id"]])
        elif kind == "text-delta":
            open_text[chunk["id"]]["text"] += chunk["delta"]
        elif kind == "text-end":
            del open_text[chunk["id"]]
        elif kind == "tool-input-start":
            tools[chunk["toolCallId"]] = {"type": f"tool-{chunk['toolName']}", "state": "input"}
            parts.append(tools[chunk["toolCallId"]])
        elif kind == "tool-input-available":
            tools[chunk["toolCallId"]].update(state="input-available", input=chunk["input"])
        elif kind == "tool-approval-request":
            tools[chunk["toolCallId"]].update(state="approval-requested", id=chunk["approvalId"])
        elif kind == "tool-output-available":
            tools[chunk["toolCallId"]].update(state="output-available", output=chunk["output"])
        elif kind == "tool-output-denied":
            tools[chunk["toolCallId"]].update(state="output-denied")
    return parts


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=2, b=3), text="Adding."),
        ModelStep.text_reply("The sum is 5."),
    ])  # fmt: skip
    app = build_app(tmp_path, script)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield app, http


async def test_an_oversized_chunk_is_replaced_and_the_stream_goes_on(tmp_path: Path) -> None:
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("report", pages=2)),
        ModelStep.text_reply("The report is written."),
    ])  # fmt: skip
    app = build_app(tmp_path, script, tools=[report], max_frame_bytes=5_000)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            body = {"id": "big", "messages": [user("Write the report")]}
            response = await http.post(API, json=body)
    assert response.status_code == 200, response.text
    assert max(len(line) for line in response.text.split("\n")) < 5_000
    chunks = chunks_of(response.text)
    assert "data-turnkit-frame-dropped" not in types(chunks)
    [error] = [c for c in chunks if c["type"] == "tool-output-error"]  # the part ends
    assert "too large to stream" in error["errorText"]
    assert types(chunks)[-2:] == ["finish", "[DONE]"]
    [answer] = [p for p in fold(chunks) if p["type"] == "text"]
    assert answer["text"] == "The report is written."


async def test_a_replayed_text_longer_than_the_bound_comes_in_several_deltas(
    tmp_path: Path,
) -> None:
    # A replay sends a finished block as one delta with its whole text: cut, not dropped.
    text = "Línea 👍 שלום\n" * 1_500  # about 24,000 characters, beyond the 5,000-byte bound
    app = build_app(tmp_path, ScriptedModel([ModelStep.text_reply(text, chunk_size=100)]),
                    max_frame_bytes=5_000)  # fmt: skip
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            live = await http.post(API, json={"id": "long", "messages": [user("Write")]})
            replayed = await http.get(f"{API}/long/stream")
    for response in (live, replayed):
        assert response.status_code == 200, response.text
        assert max(len(line.encode()) for line in response.text.split("\n")) < 5_000
        chunks = chunks_of(response.text)
        assert "data-turnkit-frame-dropped" not in types(chunks)
        [answer] = [p for p in fold(chunks) if p["type"] == "text"]
        assert answer["text"] == text


# ── mapping ─────────────────────────────────────────────────────────────────────────────


async def test_a_tool_using_turn_maps_to_ui_message_chunks(
    app_client: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, http = app_client
    runtime: SessionRuntime = app.state.runtime
    body = {"id": "chat1", "messages": [user("2+3?")], "trigger": "submit-message"}
    response = await http.post(API, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert response.headers["content-type"].startswith("text/event-stream")
    turn_id = response.headers["x-turn-id"]
    chunks = chunks_of(response.text)
    assert types(chunks) == [
        "start",
        "start-step",
        "text-start", "text-delta",  # narration
        "tool-input-start",  # from tool.delta, while the call is written
        "text-end",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start", "text-delta",  # the answer streams in the loop ...
        "text-end",  # ... and completes in synthesize
        "finish-step",
        "data-turnkit-usage",
        "data-turnkit-checkpoint.created",
        "data-turnkit-run.finished",
        "finish",
        "[DONE]",
    ]  # fmt: skip
    assert chunks[0] == {
        "type": "start",
        "messageId": turn_id,
        "messageMetadata": {"turnId": turn_id, "sessionId": "chat1"},
    }
    assert fold(chunks) == [
        {"type": "step-start"},
        {"type": "text", "text": "Adding."},
        {"type": "tool-add", "state": "output-available", "input": {"a": 2, "b": 3}, "output": 5},
        {"type": "step-start"},
        {"type": "text", "text": "The sum is 5."},
    ]
    finish = chunks[-2]
    assert finish["finishReason"] == "stop"
    assert finish["messageMetadata"]["status"] == "succeeded"
    assert set(finish["messageMetadata"]["usage"]) == {
        "modelCalls", "inputTokens", "outputTokens", "cachedTokens", "costUsd",
    }  # fmt: skip
    usage = next(c for c in chunks if c["type"] == "data-turnkit-usage")
    assert usage["data"]["type"] == "usage"
    assert usage["data"]["turn_id"] == turn_id

    # The same user message id again is the same request: the turn replays, none starts.
    again = await http.post(API, json=body)
    assert again.headers["x-turn-id"] == turn_id
    assert fold(chunks_of(again.text)) == fold(chunks)
    # Just ended: a client resuming now (it answered a pause elsewhere, say) gets it whole.
    resumed = await http.get(f"{API}/chat1/stream")
    assert resumed.headers["x-turn-id"] == turn_id
    assert fold(chunks_of(resumed.text)) == fold(chunks)
    # Later, nothing is being written: no stream to resume.
    turns = await runtime.store.list_turns(SessionId("chat1"))
    later = turns[-1].updated_at + timedelta(seconds=ENDED_REPLAY_S + 1)
    assert _resumable(turns, later) is None


async def test_narration_of_only_white_space_is_no_text_part(tmp_path: Path) -> None:
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=1, b=2), text="  \n \t\n"),
        ModelStep.text_reply("It is 3."),
    ])  # fmt: skip
    app = build_app(tmp_path, script)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            body = {"id": "chat1", "messages": [user("Add")], "trigger": "submit-message"}
            response = await http.post(API, json=body)
    assert response.status_code == 200, response.text
    parts = fold(chunks_of(response.text))
    assert [p["text"] for p in parts if p["type"] == "text"] == ["It is 3."]
    assert [p["type"] for p in parts if p["type"] != "step-start"] == ["tool-add", "text"]


async def test_a_fast_turn_streams_in_far_fewer_writes_than_chunks(tmp_path: Path) -> None:
    """The chunks of events ready together go out in one write, all of them, in order."""
    text = "abcdefghij" * 30
    app = build_app(tmp_path, ScriptedModel([ModelStep.text_reply(text, chunk_size=1)]))
    recording = WriteRecorder(app)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=recording)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            response = await http.post(API, json={"id": "fast", "messages": [user("go")]})
    chunks = chunks_of(response.text)
    assert fold(chunks)[-1] == {"type": "text", "text": text}
    assert chunks[-2]["type"] == "finish"
    assert len(recording.writes) < len(chunks) / 4


def _event(kind: type[Any], **fields: Any) -> Any:
    envelope = {"session_id": "s", "turn_id": "t", "stage_id": "tool-loop", "ts": datetime.now(UTC)}
    return kind(**envelope, **fields)


def _stage(kind: type[Any], stage_id: str, **fields: Any) -> Any:
    envelope = {"session_id": "s", "turn_id": "t", "stage_id": stage_id, "ts": datetime.now(UTC)}
    return kind(**envelope, **fields)


def test_a_recovered_attempt_that_goes_another_way_keeps_its_steps() -> None:
    """The first attempt streamed an answer and ended the loop's step, then died before
    synthesize committed it; the attempt that took over used a tool instead. The dead
    text ends before the tool call, and the call and the answer are steps of their own."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    out += tr.translate(_event(StepStartEvent, seq=2, step="tool-loop", iteration=1))
    out += tr.translate(_event(MessageDeltaEvent, block_id="a", text="It is 5"))
    out += tr.translate(_event(StepEndEvent, seq=3, step="tool-loop", iteration=1, duration_ms=1))
    out += tr.translate(
        _event(
            TurnRecoveringEvent,
            seq=4,
            attempt=2,
            cause="lease-expired",
            resumed_from="checkpoint",
            last_seq=3,
        )
    )
    use = {"tool_call_id": "c1", "tool_name": "add", "arguments": {"a": 2, "b": 3}}
    out += tr.translate(
        _event(ToolStartedEvent, seq=5, generation_id="g1", idempotency_key="k", block=use)
    )
    result = {"tool_call_id": "c1", "tool_name": "add", "output": 5}
    out += tr.translate(
        _event(
            ToolCompletedEvent,
            seq=6,
            tool_call_id="c1",
            tool_name="add",
            duration_ms=1,
            result=result,
        )
    )
    out += tr.translate(_event(StepStartEvent, seq=7, step="tool-loop", iteration=2))
    out += tr.translate(_event(MessageDeltaEvent, block_id="b", text="5"))
    out += tr.translate(_event(StepEndEvent, seq=8, step="tool-loop", iteration=2, duration_ms=1))
    out += tr.translate(_stage(StepStartEvent, "synthesize", seq=9, step="synthesize"))
    answer = {"block_id": "b", "text": "5", "is_answer": True}
    out += tr.translate(_stage(MessageCompleteEvent, "synthesize", seq=10, block=answer))
    out += tr.translate(
        _stage(StepEndEvent, "synthesize", seq=11, step="synthesize", duration_ms=1)
    )
    out += tr.translate(_event(DoneEvent, seq=12, status="succeeded"))
    out += tr.finish()
    kinds = [
        (c["type"], c.get("id") or c.get("toolCallId"))
        for c in out
        if not c["type"].startswith("data-")
    ]
    assert kinds.index(("text-end", "a")) < kinds.index(("tool-input-start", "c1"))
    assert [k for k, _ in kinds].count("start-step") == 2


def test_translator_steps_reasoning_snapshots_and_sources() -> None:
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    out += tr.translate(_event(StepStartEvent, seq=1, step="tool-loop", iteration=1))
    out += tr.translate(_event(MessageDeltaEvent, block_id="a", text="Hel"))
    # a rung failed mid-stream: its block never completes, the next rung writes a new one
    cascade = _event(ProviderCascadeEvent, seq=2, family="f", from_rung=0, from_model="m1",
                     to_rung=1, to_model="m2", reason="429")  # fmt: skip
    out += tr.translate(cascade)
    out += tr.translate(_event(MessageSnapshotEvent, block_id="b", text="Hello"))
    out += tr.translate(_event(MessageSnapshotEvent, block_id="b", text="Hello, wor"))
    out += tr.translate(_event(MessageDeltaEvent, block_id="b", text="ld"))
    out += tr.translate(_event(StepEndEvent, seq=3, step="tool-loop", iteration=1, duration_ms=1))
    out += tr.translate(_event(StepStartEvent, seq=4, step="synthesize"))
    out += tr.translate(
        _event(ThinkingCompleteEvent, seq=5, block={"block_id": "b", "summary": "Greeted."})
    )
    out += tr.translate(
        _event(MessageCompleteEvent, seq=6, block={"block_id": "b", "text": "Hello, world!"})
    )
    out += tr.translate(_event(MessageDeltaEvent, block_id="b", text="late"))  # ignored
    out += tr.translate(
        _event(MessageCitationsEvent, seq=7, block_id="b",
               citations=[{"source": "doc", "url": "https://example.org", "title": "Ex"},
                          {"source": "memo"}])
    )  # fmt: skip
    out += tr.translate(_event(DoneEvent, seq=8, status="cancelled"))
    out += tr.finish()
    assert [(c["type"], c.get("id"), c.get("delta")) for c in out] == [
        ("start", None, None),
        ("start-step", None, None),
        ("text-start", "a", None),
        ("text-delta", "a", "Hel"),
        ("text-end", "a", None),  # the failed rung's block ends where it stopped
        ("data-turnkit-provider.cascade", None, None),
        ("text-start", "b", None),
        ("text-delta", "b", "Hello"),
        ("text-delta", "b", ", wor"),  # only what the snapshot adds
        ("text-delta", "b", "ld"),
        ("reasoning-start", "b", None),  # the same call: no new step
        ("reasoning-delta", "b", "Greeted."),
        ("reasoning-end", "b", None),
        ("text-delta", "b", "!"),  # the rest of the block, from message.complete
        ("text-end", "b", None),
        ("finish-step", None, None),  # the step ends once its text completes
        ("source-url", None, None),
        ("data-turnkit-message.citations", None, None),
        ("abort", None, None),
        ("finish", None, None),
    ]
    assert out[-1]["finishReason"] == "other"
    # The failed rung's part is marked, so a client can leave its text out; no other is.
    marked = [(c["id"], c["providerMetadata"]) for c in out if "providerMetadata" in c]
    assert marked == [("a", {"turnkit": {"discarded": True}})]
    source = next(c for c in out if c["type"] == "source-url")
    assert source == {"type": "source-url", "sourceId": "b:0", "url": "https://example.org",
                      "title": "Ex"}  # fmt: skip


@pytest.mark.parametrize(
    ("again", "shown"),
    [
        (["Hel", "lo, wor", "ld!"], "Hello, world!"),  # the same text: only what is new
        (["Goodbye", " now"], "Hello, wor"),  # other text: the client keeps what it has
    ],
    ids=["same", "different"],
)
def test_a_block_a_recovering_attempt_writes_again_is_not_shown_twice(
    again: list[str], shown: str
) -> None:
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    for text in ("Hel", "lo, wor"):
        out += tr.translate(_event(ThinkingDeltaEvent, block_id="a", text=text))
        out += tr.translate(_event(MessageDeltaEvent, block_id="a", text=text))
    out += tr.translate(_event(TurnRecoveringEvent, seq=3, attempt=2, cause="lease-expired",
                               resumed_from="checkpoint", last_seq=2))  # fmt: skip
    for text in again:
        out += tr.translate(_event(ThinkingDeltaEvent, block_id="a", text=text))
        out += tr.translate(_event(MessageDeltaEvent, block_id="a", text=text))
    whole = "".join(again)
    out += tr.translate(
        _event(ThinkingCompleteEvent, seq=4, block={"block_id": "a", "summary": whole})
    )
    out += tr.translate(_event(MessageCompleteEvent, seq=5, block={"block_id": "a", "text": whole}))
    for kind in ("text", "reasoning"):
        deltas = "".join(c["delta"] for c in out if c["type"] == f"{kind}-delta")
        assert deltas == shown, kind
        assert [c["type"] for c in out].count(f"{kind}-end") == 1


def test_a_plugin_s_denial_is_an_error_part_and_a_failure_sends_its_ending_first() -> None:
    """The SDK's denied part needs an approval; and it stops reading at `error`."""
    tr = UIMessageStreamTranslator(message_id="t", asked=["asked"])
    out = tr.start()
    for call_id in ("plugin", "asked"):
        block = {"tool_call_id": call_id, "tool_name": "add", "arguments": {}}
        out += tr.translate(_event(ToolStartedEvent, seq=1, block=block, idempotency_key=call_id))
        result = {"tool_call_id": call_id, "tool_name": "add", "is_error": True,
                  "error": f"denied by {call_id}: no"}  # fmt: skip
        out += tr.translate(_event(ToolFailedEvent, seq=2, tool_call_id=call_id, result=result,
                                   duration_ms=0, code="tool-denied"))  # fmt: skip
    out += tr.translate(_event(UsageEvent, seq=3, model_calls=1, input_tokens=5, output_tokens=2))
    out += tr.translate(_event(ErrorEvent, seq=4, code="family-exhausted", message="all failed"))
    ends = [c for c in out if c["type"] in ("tool-output-error", "tool-output-denied")]
    assert ends == [
        {"type": "tool-output-error", "toolCallId": "plugin", "errorText": "denied by plugin: no"},
        {"type": "tool-output-denied", "toolCallId": "asked"},
    ]
    assert out[-1]["type"] != "error"  # the totals come next, with `run.finished`
    totals = {"model_calls": 2, "input_tokens": 9, "output_tokens": 3}
    out += tr.translate(_event(RunFinishedEvent, seq=5, status="failed", attempt=1, model="m",
                               duration_ms=1.0, **totals))  # fmt: skip
    assert [c["type"] for c in out[-4:]] == [
        "data-turnkit-run.finished",
        "finish-step",  # the step the calls opened ends before the error
        "message-metadata",
        "error",
    ]
    ending = out[-2]["messageMetadata"]
    assert (ending["status"], ending["errorCode"]) == ("failed", "family-exhausted")
    assert ending["usage"]["inputTokens"] == 9  # the turn's totals, as `finish` would say
    assert tr.translate(_event(DoneEvent, seq=6, status="failed")) == []  # sent once

    # An ending with no `run.finished` (a sweep's): the error goes out with `done`.
    swept = UIMessageStreamTranslator(message_id="s")
    assert (
        swept.translate(_event(ErrorEvent, seq=2, code="deadline-exceeded", message="late")) == []
    )
    late = swept.translate(_event(DoneEvent, seq=3, status="timed_out"))
    assert [c["type"] for c in late] == ["message-metadata", "error"]
    assert late[0]["messageMetadata"]["status"] == "timed_out"


# ── approvals ───────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("approved", [True, False], ids=["approve", "deny"])
async def test_an_approval_round_trip_continues_the_same_turn(
    tmp_path: Path, approved: bool
) -> None:
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("delete_file", path="/tmp/x", tool_call_id="c1")),
        ModelStep.text_reply("Deleted." if approved else "I left it."),
    ])  # fmt: skip
    app = build_app(tmp_path, script)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            first_body = {"id": "ops", "messages": [user("delete /tmp/x")]}
            first = await http.post(API, json=first_body)
            chunks = chunks_of(first.text)
            turn_id = first.headers["x-turn-id"]
            asked = next(c for c in chunks if c["type"] == "tool-approval-request")
            assert asked["toolCallId"] == "c1"
            assert types(chunks)[-5:] == [
                "data-turnkit-approval.requested", "tool-approval-request",
                "finish-step", "finish", "[DONE]",
            ]  # fmt: skip
            assert chunks[-2]["finishReason"] == "tool-calls"
            assert chunks[-2]["messageMetadata"]["status"] == "awaiting_approval"

            # A new message while the turn waits: answer the approval first.
            blocked = await http.post(API, json={"id": "ops", "messages": [user("hi", "m2")]})
            assert blocked.status_code == 422
            assert blocked.headers["content-type"] == "application/problem+json"
            assert "answer it first" in blocked.json()["detail"]

            # What `addToolApprovalResponse` leaves in the message, sent back as is.
            part = {
                "type": "tool-delete_file", "toolCallId": "c1", "state": "approval-responded",
                "input": {"path": "/tmp/x"},
                "approval": {"id": asked["approvalId"], "approved": approved, "reason": "ok"},
            }  # fmt: skip
            assistant = {
                "id": turn_id,
                "role": "assistant",
                "parts": [{"type": "step-start"}, part],
            }
            body = {"id": "ops", "messages": [user("delete /tmp/x"), assistant],
                    "trigger": "submit-message", "messageId": turn_id}  # fmt: skip
            if not approved:  # a denial's note is at most 4,000 characters
                long = {**part, "approval": {**part["approval"], "reason": "x" * 4001}}
                too_long = {**assistant, "parts": [long]}
                refused = await http.post(API, json={**body, "messages": [user("x"), too_long]})
                assert refused.status_code == 422
                assert refused.json()["code"] == "invalid-input"
            # A reloaded page asks for the chat's stream: the paused message, request and all.
            reloaded = await http.get(f"{API}/ops/stream")
            assert reloaded.status_code == 200
            again = chunks_of(reloaded.text)
            assert again[0]["messageId"] == turn_id
            [request] = [c for c in again if c["type"] == "tool-approval-request"]
            assert request["approvalId"] == asked["approvalId"]
            assert again[-2]["messageMetadata"]["status"] == "awaiting_approval"
            second = await http.post(API, json=body)
            assert second.status_code == 200, second.text
            assert second.headers["x-turn-id"] == turn_id
            more = chunks_of(second.text)
            assert more[0]["messageId"] == turn_id
            outcome = "tool-output-available" if approved else "tool-output-denied"
            assert types(more)[:4] == [
                "start", "data-turnkit-approval.answered", outcome, "start-step"
            ]  # fmt: skip
            decision = "approve" if approved else "deny"
            assert (more[1]["data"]["tool_call_id"], more[1]["data"]["decision"]) == (
                "c1",
                decision,
            )
            assert more[2]["toolCallId"] == "c1"
            assert more[-2]["finishReason"] == "stop"
            answer = "".join(c["delta"] for c in more if c["type"] == "text-delta")
            assert answer == ("Deleted." if approved else "I left it.")

            # The same answer again: the pause is gone.
            twice = await http.post(API, json=body)
            assert twice.status_code == 409
            assert twice.json()["code"] == "pause-already-answered"
    script.assert_complete()


async def test_an_approved_call_a_plugin_then_denies_is_an_error_part(tmp_path: Path) -> None:
    """The SDK's denied part needs a denied approval: this one was granted."""
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("delete_file", path="/tmp/x", tool_call_id="c1")),
        ModelStep.text_reply("It is frozen."),
    ])  # fmt: skip
    app = build_app(tmp_path, script, plugins=[NoDeletes()])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            first = await http.post(API, json={"id": "ops", "messages": [user("delete /tmp/x")]})
            turn_id = first.headers["x-turn-id"]
            asked = next(c for c in chunks_of(first.text) if c["type"] == "tool-approval-request")
            part = {
                "type": "tool-delete_file", "toolCallId": "c1", "state": "approval-responded",
                "input": {"path": "/tmp/x"},
                "approval": {"id": asked["approvalId"], "approved": True},
            }  # fmt: skip
            assistant = {"id": turn_id, "role": "assistant", "parts": [part]}
            body = {"id": "ops", "messages": [user("delete /tmp/x"), assistant],
                    "trigger": "submit-message", "messageId": turn_id}  # fmt: skip
            second = await http.post(API, json=body)
            assert second.status_code == 200, second.text
            more = chunks_of(second.text)
    assert more[1]["type"] == "data-turnkit-approval.answered"  # the person approved ...
    assert more[2] == {  # ... and the plugin refused it
        "type": "tool-output-error",
        "toolCallId": "c1",
        "errorText": "denied by no-deletes: deletions are frozen today. Do not retry it as is",
    }
    assert more[-2]["messageMetadata"]["status"] == "succeeded"
    script.assert_complete()


async def test_a_question_is_answered_with_the_ask_user_tool_output(tmp_path: Path) -> None:
    script = ScriptedModel([
        ModelStep.tool_call_reply(
            call("ask_user", question="Which colour?", choices=["red", "blue"], tool_call_id="q1")
        ),
        ModelStep.text_reply("Blue it is."),
    ])  # fmt: skip
    runtime = SessionRuntime(
        agent=Agent(model=script, clarifications=True),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'ask.db'}"),
    )
    app = FastAPI()
    app.include_router(create_ai_sdk_router(runtime))
    install_problem_handlers(app)
    async with runtime:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            first = await http.post(API, json={"id": "ask", "messages": [user("paint it")]})
            chunks = chunks_of(first.text)
            turn_id = first.headers["x-turn-id"]
            asked = next(c for c in chunks if c["type"] == "tool-input-available")
            assert asked["toolName"] == "ask_user"
            data = {c["type"]: c["data"] for c in chunks if c["type"].startswith("data-")}
            assert data["data-turnkit-clarification.requested"]["question"] == "Which colour?"
            assert chunks[-2]["messageMetadata"]["status"] == "awaiting_input"
            assert chunks[-2]["finishReason"] == "tool-calls"

            # What `addToolOutput` leaves in the message.
            part = {"type": "tool-ask_user", "toolCallId": "q1", "state": "output-available",
                    "input": asked["input"], "output": "blue"}  # fmt: skip
            assistant = {"id": turn_id, "role": "assistant", "parts": [part]}
            empty = {**assistant, "parts": [{**part, "output": ""}]}
            refused = await http.post(API, json={"id": "ask", "messages": [user("x"), empty]})
            assert refused.status_code == 422
            body = {"id": "ask", "messages": [user("paint it"), assistant]}
            second = await http.post(API, json=body)
            assert second.status_code == 200, second.text
            more = chunks_of(second.text)
            assert more[1] == {
                "type": "tool-output-available", "toolCallId": "q1", "output": {"answer": "blue"},
            }  # fmt: skip
            answer = "".join(c["delta"] for c in more if c["type"] == "text-delta")
            assert answer == "Blue it is."
    script.assert_complete()


@asynccontextmanager
async def _desk_asking(
    tmp_path: Path, refunds: Agent, says: str
) -> AsyncIterator[tuple[httpx.AsyncClient, ScriptedModel]]:
    """The AI SDK route over a desk whose one call (`d1`) asks `refunds`, then says `says`."""
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("refunds", message="Refund A1.", tool_call_id="d1")),
        ModelStep.text_reply(says),
    ])  # fmt: skip
    runtime = SessionRuntime(
        agent=Agent(name="desk", model=script, tools=[refunds.as_tool()]),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'asked.db'}"),
    )
    app = FastAPI()
    app.include_router(create_ai_sdk_router(runtime))
    install_problem_handlers(app)
    async with runtime:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http, script


async def test_a_question_an_asked_agent_hands_over_is_answered_on_its_call(
    tmp_path: Path,
) -> None:
    """The asking turn waits with the specialist's question; `addToolOutput` on the call
    that asked the specialist answers it, and the same turn finishes."""
    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("ask_user", question="Which order?")),
            ModelStep.text_reply("Refunded A1."),
        ]),
        clarifications=True,
    )  # fmt: skip
    async with _desk_asking(tmp_path, refunds, "Your refund is on its way.") as (http, script):
        first = await http.post(API, json={"id": "desk", "messages": [user("refund")]})
        chunks = chunks_of(first.text)
        turn_id = first.headers["x-turn-id"]
        asked = next(c for c in chunks if c["type"] == "tool-input-available")
        assert asked["toolName"] == "refunds"
        data = {c["type"]: c["data"] for c in chunks if c["type"].startswith("data-")}
        assert data["data-turnkit-clarification.requested"]["question"] == "Which order?"
        assert chunks[-2]["messageMetadata"]["status"] == "awaiting_input"

        # What `addToolOutput` on the `refunds` call leaves in the message: the answer and
        # the question it answers (one call may hand over several).
        request_id = data["data-turnkit-clarification.requested"]["request_id"]
        output = {"answer": "A1", "requestId": request_id}
        part = {"type": "tool-refunds", "toolCallId": "d1", "state": "output-available",
                "input": asked["input"], "output": output}  # fmt: skip
        assistant = {"id": turn_id, "role": "assistant", "parts": [part]}
        body = {"id": "desk", "messages": [user("refund"), assistant]}
        second = await http.post(API, json=body)
        assert second.status_code == 200, second.text
        more = chunks_of(second.text)
        done = next(c for c in more if c["type"] == "tool-output-available")
        assert done == {"type": "tool-output-available", "toolCallId": "d1",
                        "output": "Refunded A1."}  # fmt: skip
        answer = "".join(c["delta"] for c in more if c["type"] == "text-delta")
        assert answer == "Your refund is on its way."
        assert more[-2]["messageMetadata"]["status"] == "succeeded"
    script.assert_complete()


async def test_a_chat_of_another_principal_is_not_found(tmp_path: Path) -> None:
    async def principal(x_user: str | None = Header(default=None)) -> str | None:
        return x_user

    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'auth.db'}"),
    )
    app = FastAPI()
    app.include_router(create_ai_sdk_router(runtime, auth=principal))
    install_problem_handlers(app)
    async with runtime:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            body = {"id": "mine", "messages": [user("hello")]}
            ok = await http.post(API, json=body, headers={"x-user": "alice"})
            assert chunks_of(ok.text)[-2]["messageMetadata"]["status"] == "succeeded"
            other = await http.post(API, json=body, headers={"x-user": "bob"})
            assert other.status_code == 404
            assert other.json()["code"] == "session-not-found"
            gone = await http.get(f"{API}/mine/stream", headers={"x-user": "bob"})
            assert gone.status_code == 204


# ── resume ──────────────────────────────────────────────────────────────────────────────


async def _read_until(
    lines: AsyncIterator[str], seen: list[dict[str, Any]], stop: Any, timeout_s: float = 15
) -> None:
    deadline = time.monotonic() + timeout_s
    async for line in lines:
        assert time.monotonic() < deadline, f"timed out; seen {types(seen)}"
        if line.startswith("data: "):
            seen.append({"type": "[DONE]"} if line == "data: [DONE]" else json.loads(line[6:]))
            if stop(seen):
                return


def test_resume_rebuilds_the_running_message_without_duplicates(tmp_path: Path) -> None:
    script = ScriptedModel([
        ModelStep.tool_call_reply(call("add", a=1, b=1, tool_call_id="c1"), text="Adding."),
        ModelStep.text_reply(HOLD_TEXT),
        ModelStep.text_reply("And 4."),
    ])  # fmt: skip
    gated = GatedModel(script, gated_call=1, hold_after=2)
    body = {"id": "r1", "messages": [user("1+1?")]}
    held = HOLD_TEXT[:16]  # two chunks of eight characters

    async def run(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            live: list[dict[str, Any]] = []
            rebuilt: list[dict[str, Any]] = []
            async with http.stream("POST", API, json=body) as first:
                lines = first.aiter_lines()

                def held_text(seen: list[dict[str, Any]]) -> bool:
                    text = "".join(c.get("delta", "") for c in seen if c["type"] == "text-delta")
                    return text.endswith(held)

                await _read_until(lines, live, held_text)
                # Another tab's message waits behind the reply being written: resuming
                # still gets the reply being written, not the one waiting.
                second = {"id": "r1", "messages": [user("1+1?"), user("and 2+2?", "m2")]}
                async with http.stream("POST", API, json=second) as waiting:
                    assert waiting.status_code == 200, await waiting.aread()
                    assert waiting.headers["x-turn-id"] != live[0]["messageId"]
                async with http.stream("GET", f"{API}/r1/stream") as again:
                    assert again.status_code == 200
                    assert again.headers["x-turn-id"] == live[0]["messageId"]
                    assert again.headers["x-vercel-ai-ui-message-stream"] == "v1"
                    more = again.aiter_lines()
                    await _read_until(more, rebuilt, held_text)
                    assert (await http.post("/test/release")).status_code == 200
                    await _read_until(more, rebuilt, lambda s: s[-1]["type"] == "[DONE]")
                await _read_until(lines, live, lambda s: s[-1]["type"] == "[DONE]")
            return live, rebuilt

    with serve(build_app(tmp_path, gated)) as url:
        live, rebuilt = asyncio.run(run(url))
    assert fold(rebuilt) == fold(live)
    assert fold(live)[-1] == {"type": "text", "text": HOLD_TEXT}
    assert rebuilt[0]["messageId"] == live[0]["messageId"]
    answer_id = next(c["id"] for c in reversed(live) if c["type"] == "text-end")
    deltas = [c["delta"] for c in rebuilt if c.get("id") == answer_id and "delta" in c]
    assert deltas[0] == held  # the text so far in one piece, then live deltas
    assert "".join(deltas) == HOLD_TEXT
    assert types(rebuilt)[:8] == [
        "start", "start-step", "text-start", "text-delta", "text-end",  # "Adding."
        "tool-input-start", "tool-input-available", "tool-output-available",
    ]  # fmt: skip
    assert types(rebuilt)[-2:] == ["finish", "[DONE]"]


# ── bad input and keep-alives ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 422, "invalid-input"),
        ({"id": "c", "messages": []}, 422, "invalid-input"),
        ({"id": "c", "messages": [user("x")], "trigger": "resume"}, 422, "invalid-input"),
        ({"id": "bad id!", "messages": [user("x")]}, 422, "invalid-session-id"),
        ({"id": "c", "messages": [user("")]}, 422, "empty-content"),
        (
            {"id": "c", "messages": [{"id": "m", "role": "user", "parts": [
                {"type": "file", "url": "data:application/pdf;base64,AA==",
                 "mediaType": "application/pdf"}]}]},
            422,
            "invalid-input",
        ),
        (
            {"id": "c", "messages": [{"id": "m", "role": "user", "parts": [
                {"type": "file", "url": "data:image/png;base64,!!!",
                 "mediaType": "image/png"}]}]},
            422,
            "invalid-input",
        ),
        (
            {"id": "c", "messages": [user("x"), {"id": "a", "role": "assistant", "parts": []}]},
            422,
            "invalid-input",
        ),
    ],
    ids=[
        "empty", "no-messages", "trigger", "chat-id", "no-text", "pdf", "not-base64",
        "assistant-last",
    ],
)  # fmt: skip
async def test_bad_input_answers_a_problem_body(
    app_client: tuple[FastAPI, httpx.AsyncClient], body: dict[str, Any], status: int, code: str
) -> None:
    _, http = app_client
    response = await http.post(API, json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code
    assert (await http.get(f"{API}/never-seen/stream")).status_code == 204
    bad_id = await http.get(f"{API}/a%20b/stream")
    assert bad_id.status_code == 422
    assert bad_id.json()["code"] == "invalid-session-id"


async def test_idle_stream_sends_comment_keepalives(tmp_path: Path) -> None:
    script = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow", x=1)), ModelStep.text_reply("1")]
    )
    app = build_app(tmp_path, script, tools=[slow], keepalive_s=0.05)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            response = await http.post(API, json={"id": "ka", "messages": [user("go")]})
    text = response.text
    assert text.count(": keep-alive\n") >= 3  # the slow tool left room for several
    assert "\n: keep-alive\n\n" not in text  # a comment never ends an event of its own
    chunks = chunks_of(text)
    assert chunks[-1] == {"type": "[DONE]"}
    assert chunks[-2]["type"] == "finish"


def test_a_stream_whose_finish_went_out_says_no_error_at_shutdown() -> None:
    finish = wire.line({"type": "finish", "messageMetadata": {"status": "succeeded"}})
    assert _farewell(wire.DONE_LINE) == ()
    assert _farewell(finish) == (wire.DONE_LINE,)
    [error] = _farewell(wire.line({"type": "text-delta", "id": "t", "delta": "half"}))
    assert b'"type":"error"' in error
    assert b"server-shutting-down" in error
    assert error.endswith(wire.DONE_LINE)
    assert _farewell(None) == _farewell(wire.line({"type": "start"}))


async def test_a_denied_approval_an_asked_agent_handed_over_ends_its_call_denied(
    tmp_path: Path,
) -> None:
    """The SDK's part of a denied approval must end denied (an output after a denial does
    not validate): the call that asked the agent ends `tool-output-denied`, though the
    agent's own answer (that it could not) reached the asking model."""

    @tool(approval="always")
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("refund", order_id="A1")),
            ModelStep.text_reply("A person said no: nothing refunded."),
        ]),
        tools=[refund],
    )  # fmt: skip
    async with _desk_asking(tmp_path, refunds, "No refund, then.") as (http, script):
        first = await http.post(API, json={"id": "desk", "messages": [user("refund")]})
        turn_id = first.headers["x-turn-id"]
        asked = next(c for c in chunks_of(first.text) if c["type"] == "tool-approval-request")
        assert asked["toolCallId"] == "d1"
        part = {
            "type": "tool-refunds", "toolCallId": "d1", "state": "approval-responded",
            "input": {"message": "Refund A1."},
            "approval": {"id": asked["approvalId"], "approved": False},
        }  # fmt: skip
        assistant = {"id": turn_id, "role": "assistant", "parts": [part]}
        body = {"id": "desk", "messages": [user("refund"), assistant],
                "trigger": "submit-message", "messageId": turn_id}  # fmt: skip
        second = await http.post(API, json=body)
        assert second.status_code == 200, second.text
        more = chunks_of(second.text)
    ends = [c for c in more if c.get("toolCallId") == "d1"]
    assert ends == [{"type": "tool-output-denied", "toolCallId": "d1"}]
    answer = "".join(c["delta"] for c in more if c["type"] == "text-delta")
    assert answer == "No refund, then."
    assert more[-2]["messageMetadata"]["status"] == "succeeded"
    script.assert_complete()


async def test_a_second_handed_question_is_not_answered_with_the_first_answer(
    tmp_path: Path,
) -> None:
    """Nothing on the stream empties the asking call's part between two questions: the
    first answer, posted again, names the first question and answers nothing."""
    refunds = Agent(
        name="refunds",
        model=ScriptedModel([
            ModelStep.tool_call_reply(call("ask_user", question="Which order?")),
            ModelStep.tool_call_reply(call("ask_user", question="Refund to which card?")),
            ModelStep.text_reply("Refunded A1 to the Visa."),
        ]),
        clarifications=True,
    )  # fmt: skip

    def answered(turn_id: str, text: str, request_id: str) -> dict[str, object]:
        part = {"type": "tool-refunds", "toolCallId": "d1", "state": "output-available",
                "input": {"message": "Refund A1."},
                "output": {"answer": text, "requestId": request_id}}  # fmt: skip
        assistant = {"id": turn_id, "role": "assistant", "parts": [part]}
        return {"id": "desk", "messages": [user("refund"), assistant]}

    def question(chunks: list[dict[str, Any]]) -> dict[str, Any]:
        [data] = [c["data"] for c in chunks if c["type"] == "data-turnkit-clarification.requested"]
        return dict(data)

    async with _desk_asking(tmp_path, refunds, "Done.") as (http, script):
        first = await http.post(API, json={"id": "desk", "messages": [user("refund")]})
        turn_id = first.headers["x-turn-id"]
        which_order = question(chunks_of(first.text))
        stale = answered(turn_id, "A1", which_order["request_id"])
        second = await http.post(API, json=stale)
        which_card = question(chunks_of(second.text))
        assert which_card["question"] == "Refund to which card?"

        again = await http.post(API, json=stale)  # the first answer, posted again
        assert again.status_code == 422
        assert which_card["request_id"] in again.json()["detail"]
        third = await http.post(API, json=answered(turn_id, "the Visa", which_card["request_id"]))
        assert third.status_code == 200, third.text
        more = chunks_of(third.text)
    done = next(c for c in more if c["type"] == "tool-output-available")
    assert done["output"] == "Refunded A1 to the Visa."
    assert more[-2]["messageMetadata"]["status"] == "succeeded"
    script.assert_complete()


def _started(tr: UIMessageStreamTranslator, call_id: str, seq: int) -> list[Any]:
    block = {"tool_call_id": call_id, "tool_name": "add", "arguments": {"a": 1, "b": 2}}
    return tr.translate(_event(ToolStartedEvent, seq=seq, block=block, idempotency_key=call_id))


def test_a_stopped_turn_ends_the_parts_of_calls_that_were_running() -> None:
    """A reloaded page must not draw a stopped turn's call as still running."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start() + _started(tr, "c1", 1) + _started(tr, "c2", 2)
    result = {"tool_call_id": "c1", "tool_name": "add", "output": 3}
    out += tr.translate(_event(ToolCompletedEvent, seq=3, tool_call_id="c1", tool_name="add",
                               result=result, duration_ms=1))  # fmt: skip
    out += tr.translate(_event(DoneEvent, seq=4, status="cancelled"))
    out += tr.finish()
    ends = [(c["type"], c.get("toolCallId")) for c in out if c["type"].startswith("tool-output")]
    assert ends == [("tool-output-available", "c1"), ("tool-output-error", "c2")]
    kinds = [c["type"] for c in out]
    assert kinds.index("tool-output-error") < kinds.index("abort") < kinds.index("finish")
    # `abort` alone, as AI SDK 6 clients before 6.0.15 accept it (their chunk schemas are
    # strict, and no client reads a reason: `finish` says the turn was cancelled).
    assert out[kinds.index("abort")] == {"type": "abort"}
    assert out[-1]["messageMetadata"]["status"] == "cancelled"


def test_a_failed_turn_ends_a_call_the_model_never_finished_writing() -> None:
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    out += tr.translate(_event(ToolDeltaEvent, tool_call_id="c9", tool_name="add",
                               arguments_delta='{"a": ', chars=6))  # fmt: skip
    out += tr.translate(_event(ErrorEvent, seq=1, code="family-exhausted", message="all failed"))
    out += tr.translate(_event(DoneEvent, seq=2, status="failed"))
    [draft] = [c for c in out if c.get("toolCallId") == "c9" and c["type"] != "tool-input-start"]
    assert draft["type"] == "tool-input-error"
    assert "never ran" in draft["errorText"]
    assert out[-1]["type"] == "error"


def test_a_call_whose_approval_nobody_answered_keeps_its_request_when_stopped() -> None:
    """The SDK's error part needs a granted approval: an unanswered one stays asked."""
    tr = UIMessageStreamTranslator(message_id="t", asked=["c1"])
    out = tr.start() + _started(tr, "c1", 1)
    out += tr.translate(_event(DoneEvent, seq=2, status="cancelled"))
    out += tr.finish()
    assert not [c for c in out if c["type"] == "tool-output-error"]


def test_a_failure_ends_the_open_text_before_its_error() -> None:
    """`useChat` stops reading at `error`: a part still open there is drawn streaming."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    out += tr.translate(_event(MessageDeltaEvent, block_id="b", text="Partial"))
    out += tr.translate(_event(ErrorEvent, seq=1, code="provider-error", message="bad"))
    out += tr.translate(_event(RunFinishedEvent, seq=2, status="failed", attempt=1, model="m",
                               duration_ms=1.0, model_calls=1, input_tokens=5,
                               output_tokens=2))  # fmt: skip
    kinds = [c["type"] for c in out]
    assert kinds[-4:] == ["text-end", "finish-step", "message-metadata", "error"]
    assert [c["type"] for c in tr.finish()] == ["finish"]  # nothing is ended twice


@pytest.mark.parametrize(
    ("code", "reason"),
    [("content-filtered", "content-filter"), ("agent_output_limit_exceeded", "length"),
     ("provider-error", "error")],
)  # fmt: skip
def test_a_refused_or_cut_answer_finishes_with_the_sdks_own_reason(code: str, reason: str) -> None:
    """`finishReason` tells a content filter's refusal and the output limit from any error."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    out += tr.translate(_event(ErrorEvent, seq=1, code=code, message="no answer"))
    out += tr.translate(_event(DoneEvent, seq=2, status="failed", error_code=code))
    out += tr.finish()
    assert out[-1]["type"] == "finish"
    assert out[-1]["finishReason"] == reason


def test_an_answer_the_content_filter_cut_finishes_with_the_sdks_own_reason() -> None:
    """The turn succeeded, but its answer is what the provider's filter let through: the
    UI says `content-filter`, not `stop`, so it can show the answer as incomplete."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start()
    block = {"block_id": "b", "text": "Here is part", "is_answer": True, "filtered": True}
    out += tr.translate(_stage(MessageCompleteEvent, "synthesize", seq=1, block=block))
    out += tr.translate(_stage(DoneEvent, "post-turn", seq=2, status="succeeded"))
    out += tr.finish()
    assert out[-1]["type"] == "finish"
    assert out[-1]["finishReason"] == "content-filter"
    assert out[-1]["messageMetadata"]["status"] == "succeeded"


def test_an_approval_answered_before_the_stream_ends_sends_no_request() -> None:
    """A rebuilt message replays the answer: a request would ask again, or leave an output
    part whose approval lacks the decision (`validateUIMessages` refuses it)."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start() + _started(tr, "c1", 1) + _started(tr, "c2", 2)
    for seq, call_id in ((3, "c1"), (6, "c2")):
        request_id = f"req_{call_id}"
        out += tr.translate(_event(ApprovalRequestedEvent, seq=seq, request_id=request_id,
                                   tool_call_id=call_id, tool_name="add", arguments={},
                                   summary="Run add"))  # fmt: skip
        if call_id == "c1":
            out += tr.translate(_event(ApprovalAnsweredEvent, seq=4, request_id=request_id,
                                       tool_call_id=call_id, tool_name="add", decision="deny",
                                       note="not this one"))  # fmt: skip
            result = {"tool_call_id": "c1", "tool_name": "add", "is_error": True,
                      "error": "denied: not this one"}  # fmt: skip
            out += tr.translate(_event(ToolFailedEvent, seq=5, tool_call_id="c1", result=result,
                                       duration_ms=0, code="tool-denied"))  # fmt: skip
    out += tr.finish()  # the stream ends at the second pause
    requests = [c["toolCallId"] for c in out if c["type"] == "tool-approval-request"]
    assert requests == ["c2"]
    [denied] = [c for c in out if c.get("toolCallId") == "c1" and c["type"].startswith("tool-o")]
    assert denied == {"type": "tool-output-error", "toolCallId": "c1",
                      "errorText": "denied: not this one"}  # fmt: skip
    assert out[-1]["finishReason"] == "tool-calls"
    assert out[-1]["messageMetadata"]["status"] == "awaiting_approval"


def test_a_rebuilt_message_of_a_turn_stopped_at_its_pause_ends_the_call() -> None:
    """No approval card for a request nobody can answer any more: the call ends unfinished."""
    tr = UIMessageStreamTranslator(message_id="t")
    out = tr.start() + _started(tr, "c1", 1)
    out += tr.translate(_event(ApprovalRequestedEvent, seq=2, request_id="req_c1",
                               tool_call_id="c1", tool_name="add", arguments={},
                               summary="Run add"))  # fmt: skip
    out += tr.translate(_event(DoneEvent, seq=3, status="cancelled"))
    out += tr.finish()
    assert not [c for c in out if c["type"] == "tool-approval-request"]
    [ended] = [c for c in out if c["type"] == "tool-output-error"]
    assert ended["toolCallId"] == "c1"
    assert "stopped" in ended["errorText"]
