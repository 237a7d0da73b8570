"""Pause for approval on one server, stop it, approve over HTTP on a new one: same turn."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse
from tests.support.server import serve

from turnkit import Agent, RuntimeConfig, SessionRuntime, ToolContext, tool
from turnkit.quickstart import create_app
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"
KEYS: list[str] = []


@tool(approval="always")
async def delete_file(path: str, ctx: ToolContext) -> str:
    """Delete a file (needs approval)."""
    KEYS.append(ctx.idempotency_key)
    return f"deleted {path}"


def _app(db: Path, model: ScriptedModel) -> object:
    runtime = SessionRuntime(
        agent=Agent(model=model, tools=[delete_file]),
        config=RuntimeConfig(database_url=f"sqlite:///{db}"),
    )
    return create_app(runtime)


async def _read(
    http: httpx.AsyncClient, method: str, url: str, until: str, **kw: object
) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    async with aconnect_sse(http, method, url, **kw) as source:  # type: ignore[arg-type]
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            event = json.loads(sse.data)
            if "seq" in event:
                out.append(event)
                if event["type"] == until:
                    break
    return out


async def test_approve_over_http_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "approve.db"
    before = ScriptedModel([ModelStep.tool_call_reply(call("delete_file", path="/tmp/x"))])
    with serve(_app(db, before)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            first = await _read(
                http, "POST", f"{API}/sessions/ops/execute", "approval.requested",
                json={"content": "delete /tmp/x"},
            )  # fmt: skip
    asked = first[-1]
    turn_id, request_id = str(asked["turn_id"]), str(asked["request_id"])
    assert KEYS == []

    after = ScriptedModel([ModelStep.text_reply("Done.")])
    with serve(_app(db, after)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            waiting = (await http.get(f"{API}/turns/{turn_id}")).json()
            assert waiting["status"] == "awaiting_approval"
            other = await http.post(
                f"{API}/turns/{turn_id}/approvals/req_nope", json={"decision": "approve"}
            )
            assert other.status_code == 404
            assert other.json()["code"] == "pause-not-found"
            bad = await http.post(
                f"{API}/turns/{turn_id}/approvals/{request_id}", json={"decision": "maybe"}
            )
            assert bad.status_code == 422
            ok = await http.post(
                f"{API}/turns/{turn_id}/approvals/{request_id}", json={"decision": "approve"}
            )
            assert ok.status_code == 202, ok.text
            rest = await _read(
                http, "GET", f"{API}/turns/{turn_id}/stream", "done",
                headers={"Last-Event-ID": str(asked["seq"])},
            )  # fmt: skip
            again = await http.post(
                f"{API}/turns/{turn_id}/approvals/{request_id}", json={"decision": "deny"}
            )
            assert again.status_code == 409
            assert again.json()["code"] == "pause-already-answered"
    union = first + rest
    assert [e["seq"] for e in union] == list(range(1, len(union) + 1))
    assert {e["turn_id"] for e in union} == {turn_id}
    assert rest[-1]["status"] == "succeeded"
    assert len(KEYS) == 1
    assert len(before.calls) == 1
    assert len(after.calls) == 1


async def test_pending_decisions_come_from_a_route_after_a_reload(tmp_path: Path) -> None:
    """A page that reloads finds the card without replaying any stream."""
    db = tmp_path / "pending.db"
    asking = ScriptedModel([ModelStep.tool_call_reply(call("delete_file", path="/tmp/y"))])
    with serve(_app(db, asking)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            first = await _read(
                http, "POST", f"{API}/sessions/ops/execute", "approval.requested",
                json={"content": "delete /tmp/y"},
            )  # fmt: skip
            asked = first[-1]
            # A message sent now waits behind the paused turn: it is queued, not started.
            async with http.stream(
                "POST", f"{API}/sessions/ops/execute", json={"content": "then tidy up"}
            ) as sent:
                later = sent.headers["x-turn-id"]
            queue = (await http.get(f"{API}/sessions/ops/queue")).json()
            by_session = (await http.get(f"{API}/sessions/ops/pending")).json()
            by_turn = (await http.get(f"{API}/turns/{asked['turn_id']}/pending")).json()
            history = (await http.get(f"{API}/sessions/ops/history")).json()
            none_yet = (await http.get(f"{API}/sessions/other/pending")).status_code
    [card] = by_session["pending"]
    assert card == by_turn["pending"][0]
    assert card["kind"] == "approval"
    assert card["sessionId"] == "ops"  # the same card as in `GET /pauses`, whole
    assert card["requestId"] == asked["request_id"]
    assert card["toolName"] == "delete_file"
    assert card["arguments"] == {"path": "/tmp/y"}
    assert card["summary"]
    assert history[0]["pending"]["requestId"] == asked["request_id"]
    assert [t["turnId"] for t in history][1] == later  # listed as `running`: it waits
    [queued] = queue["queue"]
    assert (queued["turnId"], queued["content"]) == (later, "then tidy up")
    assert (queued["delivery"], queued["inputSeq"]) == ("queue", 2)
    assert none_yet == 404  # no such session


async def test_an_approval_over_http_may_change_the_arguments(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("delete_file", path="/")),
            ModelStep.text_reply("Deleted the temp file."),
        ]
    )
    KEYS.clear()
    with serve(_app(tmp_path / "edit.db", model)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            first = await _read(
                http, "POST", f"{API}/sessions/ops/execute", "approval.requested",
                json={"content": "clean up"},
            )  # fmt: skip
            asked = first[-1]
            where = f"{API}/turns/{asked['turn_id']}/approvals/{asked['request_id']}"
            denied = await http.post(
                where, json={"decision": "deny", "arguments": {"path": "/tmp/z"}}
            )
            fixed = await http.post(
                where, json={"decision": "approve", "arguments": {"path": "/tmp/z"}}
            )
            rest = await _read(
                http, "GET", f"{API}/turns/{asked['turn_id']}/stream", "done",
                headers={"Last-Event-ID": str(asked["seq"])},
            )  # fmt: skip
            rows = (await http.get(f"{API}/turns/{asked['turn_id']}/audit")).json()["rows"]
    answers = [r["payloads"]["pauseAnswer"] for r in rows if r["payloads"].get("pauseAnswer")]
    assert [(a["decision"], a["arguments_changed"], a["by"]) for a in answers] == [
        ("approve", True, None)  # an anonymous caller is nobody known
    ]
    assert denied.status_code == 422  # arguments go with an approval only; nothing answered
    assert fixed.status_code == 202, fixed.text
    [completed] = [e for e in rest if e["type"] == "tool.completed"]
    assert completed["result"]["output"] == "deleted /tmp/z"
    assert completed["result"]["arguments"] == {"path": "/tmp/z"}
    assert len(KEYS) == 1
