"""`turnkit sessions export ID`: one session's rows as JSON lines, to stdout or a new file."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import db_flags
from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.cli import main
from turnkit.ids import SessionId
from turnkit.testing import ModelStep, ScriptedModel, call


@tool
async def lookup(country: str) -> str:
    """The capital of a country."""
    return "Paris"


async def _seed(url: str, schema: str | None) -> dict[str, Any]:
    """Session `s-1`: a turn with a tool call, a second turn, a workspace file; `s-2` beside."""
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("lookup", country="France")),
            ModelStep.text_reply("Paris is the capital of France."),
            ModelStep.text_reply("Berlin."),
            ModelStep.text_reply("Rome."),
        ]
    )
    config = RuntimeConfig(database_url=url, database_schema=schema)
    agent = Agent(model=model, tools=[lookup], skip_stages=frozenset({"anchor-plan"}))
    async with SessionRuntime(agent=agent, config=config) as rt:
        turns = []
        for session, text in (("s-1", "Capital of France?"), ("s-1", "Germany?"), ("s-2", "It?")):
            submission = await rt.start(session, text)
            async for _ in rt.reader().follow(submission.turn_id):
                pass
            turns.append(submission.turn_id)
        await rt.store.write_file(SessionId("s-1"), "notes/plan.md", "# Plan\n- ask ✓\n")
        mine = turns[:2]
        return {
            "turns": mine,
            "events": {t: [e.model_dump(mode="json") async for e in rt.events(t)] for t in mine},
            "audit": {t: [r.model_dump(mode="json") for r in await rt.audit(t)] for t in mine},
        }


def _export(*argv: str, url: str, schema: str | None) -> tuple[int, str]:
    out = io.StringIO()
    flags = db_flags(url, schema)
    return main(["sessions", "export", *argv, *flags], out=out), out.getvalue()


def test_an_export_holds_the_session_its_turns_their_events_and_audit_and_its_files(
    db: tuple[str, str | None],
) -> None:
    url, schema = db
    seeded = asyncio.run(_seed(url, schema))
    code, out = _export("s-1", url=url, schema=schema)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]

    assert [line["kind"] for line in lines if line["kind"] != "event"] == [
        "session",
        "turn",
        *["audit"] * len(seeded["audit"][seeded["turns"][0]]),
        "turn",
        *["audit"] * len(seeded["audit"][seeded["turns"][1]]),
        "file",
        "end",
    ]
    session = lines[0]
    assert (session["session_id"], session["title"], session["messages"]) == (
        "s-1",
        "Capital of France?",
        2,
    )
    assert session["parent_session"] is None  # a conversation of its own (no asking session)
    turns = [line for line in lines if line["kind"] == "turn"]
    assert [t["turn_id"] for t in turns] == seeded["turns"]  # s-2's turn is not in it
    assert [(t["content"], t["status"]) for t in turns] == [
        ("Capital of France?", "succeeded"),
        ("Germany?", "succeeded"),
    ]
    assert turns[0]["summary"]["model_calls"] == 2
    for turn_id in seeded["turns"]:
        events = [e["event"] for e in lines if e["kind"] == "event" and e["turn_id"] == turn_id]
        assert events == seeded["events"][turn_id]  # as `runtime.events` reads them, in seq order
        audit = [a["row"] for a in lines if a["kind"] == "audit" and a["turn_id"] == turn_id]
        assert audit == seeded["audit"][turn_id]
    tool_results = [
        e["event"]["result"]["output"]
        for e in lines
        if e["kind"] == "event" and e["event"]["type"] == "tool.completed"
    ]
    assert tool_results == ["Paris"]
    file = next(line for line in lines if line["kind"] == "file")
    assert (file["path"], file["content"], file["media_type"], file["version"]) == (
        "notes/plan.md",
        "# Plan\n- ask ✓\n",
        "text/markdown",
        1,
    )
    # Every time in one form, the events' (ISO 8601, UTC as Z).
    times = [session["created_at"], session["updated_at"], file["updated_at"]]
    times += [t[k] for t in turns for k in ("created_at", "started_at", "updated_at")]
    times += [e["event"]["ts"] for e in lines if e["kind"] == "event"]
    assert all(isinstance(t, str) and t.endswith("Z") for t in times), times
    events = sum(len(v) for v in seeded["events"].values())
    audit_rows = sum(len(v) for v in seeded["audit"].values())
    assert lines[-1] == {
        "kind": "end",
        "session_id": "s-1",
        "turns": 2,
        "events": events,
        "audit_rows": audit_rows,
        "files": 1,
        "unreadable_events": 0,
    }


def test_an_export_to_a_file_is_whole_or_absent_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    asyncio.run(_seed(url, None))
    code, printed = _export("s-2", url=url, schema=None)
    assert code == 0

    target = tmp_path / "s-2.jsonl"
    assert _export("s-2", "--output", str(target), url=url, schema=None) == (0, "")
    assert target.read_text() == printed  # the same lines as on stdout
    assert target.stat().st_mode & 0o777 == 0o600  # it holds conversations: its owner's only
    assert sorted(p.name for p in tmp_path.iterdir() if "s-2" in p.name) == ["s-2.jsonl"]

    target.write_text("an earlier export\n")
    assert _export("s-2", "--output", str(target), url=url, schema=None)[0] == 2
    assert "exists: name a new file" in capsys.readouterr().err
    assert target.read_text() == "an earlier export\n"  # left as it was

    missing = tmp_path / "missing.jsonl"
    assert _export("nope", "--output", str(missing), url=url, schema=None)[0] == 2
    assert "no session 'nope'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if "missing" in p.name) == []  # no partial

    assert (
        _export("s-2", "--output", str(tmp_path / "no" / "dir.jsonl"), url=url, schema=None)[0] == 2
    )
    assert "cannot write" in capsys.readouterr().err


def test_an_event_damaged_in_the_database_is_named_not_copied(tmp_path: Path) -> None:
    db = tmp_path / "turnkit.db"
    url = f"sqlite:///{db}"
    seeded = asyncio.run(_seed(url, None))
    turn_id = seeded["turns"][0]
    with sqlite3.connect(db) as conn:
        for seq, data in ((2, b"\x00\xff torn page"), (3, b'{"type": "step.start", "cut')):
            conn.execute(
                "UPDATE tk_events SET data = ? WHERE turn_id = ? AND seq = ?", (data, turn_id, seq)
            )
    code, out = _export("s-1", url=url, schema=None)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]  # every line is JSON still
    damaged = [line for line in lines if line["kind"] == "unreadable_event"]
    assert [(d["turn_id"], d["seq"]) for d in damaged] == [(turn_id, 2), (turn_id, 3)]
    assert lines[-1]["unreadable_events"] == 2
    assert lines[-1]["events"] == sum(len(v) for v in seeded["events"].values()) - 2
