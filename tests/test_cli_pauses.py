"""`turnkit pauses` and `turnkit answer`: a turn `turnkit run` left waiting, finished from the
same terminal, against a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from tests.support import openai_server as fake_openai
from tests.support.asking_agent import approving
from tests.support.openai_server import FakeOpenAIServer, Reply
from turnkit import RuntimeConfig, SessionRuntime
from turnkit.cli import main

openai_server = fake_openai.openai_server  # the fixture, visible to this module's tests

APPROVING = "tests.support.asking_agent:approving"
ASKING = "tests.support.asking_agent:asking"


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TK_PAUSES_KEY", "sk-pauses")
    return "TK_PAUSES_KEY"


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def _paused_turn(server: FakeOpenAIServer, url: str, agent: str, key: str) -> str:
    """Run one turn that pauses; its id, from the line `turnkit run` ends with."""
    code, text = _cli("run", "please", "--agent", agent, "--model", "openai/local-model",
                      "--api-base", server.base_url, "--api-key-env", key,
                      "--database-url", url)  # fmt: skip
    assert code == 1, text
    last = text.splitlines()[-1]
    assert last.startswith("⏸ turn turn_"), text
    return last.split()[2]


def _model(server: FakeOpenAIServer, key: str) -> tuple[str, ...]:
    return ("--api-base", server.base_url, "--api-key-env", key)


def test_an_approval_is_listed_answered_with_changed_arguments_and_the_turn_finishes(
    openai_server: FakeOpenAIServer, tmp_path: Path, key: str
) -> None:
    url = f"sqlite:///{tmp_path / 'paused.db'}"
    openai_server.script(
        "local-model",
        [Reply.tool_call("delete_file", {"path": "/tmp/x.txt"}), Reply.text("Deleted it.")],
    )
    turn_id = _paused_turn(openai_server, url, APPROVING, key)

    code, listed = _cli("pauses", "--database-url", url)
    assert code == 0, listed
    head, request = listed.splitlines()
    assert head.startswith(f"{turn_id}  awaiting_approval  session cli-")
    assert request.startswith("  approve or deny: delete_file(path='/tmp/x.txt') · request req_")

    code, text = _cli("answer", turn_id, "--approve", "--arguments", '{"path": "/tmp/y.txt"}',
                      "--by", "alice", "--agent", APPROVING, *_model(openai_server, key),
                      "--database-url", url)  # fmt: skip
    assert code == 0, text
    assert text.startswith("answered req_")
    assert "  ↳ approved as delete_file(path='/tmp/y.txt')" in text
    assert "    → 'deleted /tmp/y.txt'" in text  # the person's arguments ran
    assert "Deleted it." in text
    resumed = openai_server.requests[-1]["messages"]
    assert isinstance(resumed, list)
    assert "deleted /tmp/y.txt" in json.dumps(resumed)  # the model read the result
    assert _cli("pauses", "--database-url", url) == (0, "no paused turns\n")
    code, events = _cli("events", turn_id, "--json", "--database-url", url)
    assert '"type":"done","status":"succeeded"' in events.replace(" ", "")


def test_a_question_is_answered_with_a_reply(
    openai_server: FakeOpenAIServer, tmp_path: Path, key: str
) -> None:
    url = f"sqlite:///{tmp_path / 'asked.db'}"
    question = Reply.tool_call("ask_user", {"question": "Which unit?", "choices": ["EUR", "USD"]})
    openai_server.script("local-model", [question, Reply.text("EUR it is.")])
    turn_id = _paused_turn(openai_server, url, ASKING, key)
    code, listed = _cli("pauses", "--database-url", url)
    assert "  answer: Which unit? [EUR / USD] · request req_" in listed
    code, text = _cli("answer", turn_id, "--reply", "EUR", "--agent", ASKING,
                      *_model(openai_server, key), "--database-url", url)  # fmt: skip
    assert code == 0, text
    assert "EUR it is." in text
    assert "EUR" in json.dumps(openai_server.requests[-1]["messages"])


def test_a_denial_and_a_second_pause_end_the_command_at_the_next_question(
    openai_server: FakeOpenAIServer, tmp_path: Path, key: str
) -> None:
    url = f"sqlite:///{tmp_path / 'denied.db'}"
    openai_server.script(
        "local-model",
        [
            Reply.tool_call("delete_file", {"path": "/etc/passwd"}),
            Reply.tool_call("delete_file", {"path": "/tmp/x.txt"}, call_id="call_2"),
        ],
    )
    turn_id = _paused_turn(openai_server, url, APPROVING, key)
    code, text = _cli("answer", turn_id, "--deny", "--note", "not that one", "--agent",
                      APPROVING, *_model(openai_server, key), "--database-url", url)  # fmt: skip
    assert code == 1, text
    assert "  ↳ denied: not that one" in text
    assert "✗ tool-denied" in text
    assert "not that one" in json.dumps(openai_server.requests[-1]["messages"])
    assert "⏸ waits for approval: delete_file(path='/tmp/x.txt')" in text
    last = text.splitlines()[-1]
    assert last.startswith(f"⏸ turn {turn_id} waits for an answer: `turnkit answer {turn_id} --")
    code, listed = _cli("pauses", "--database-url", url)
    assert "delete_file(path='/tmp/x.txt')" in listed  # waiting again, listed again


def test_an_answer_no_one_can_give_is_one_line_and_leaves_the_turn_waiting(
    openai_server: FakeOpenAIServer,
    tmp_path: Path,
    key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    openai_server.script("local-model", [Reply.tool_call("delete_file", {"path": "/tmp/x.txt"})])
    turn_id = _paused_turn(openai_server, url, APPROVING, key)
    capsys.readouterr()
    db = ("--database-url", url)
    refused = [
        (
            ("answer", turn_id, "--reply", "yes", *db),
            "waits on an approval: answer it with --approve",
        ),
        (("answer", "turn_nope", "--approve", *db), "no turn 'turn_nope'"),
        (
            ("answer", turn_id, "--approve", "--request", "req_nope", "--agent", APPROVING, *db),
            "pause-not-found",
        ),
        (("answer", turn_id, "--approve", "--agent", ASKING, *db), "agent-not-found"),
        (("answer", turn_id, "--approve", *db), "the turn started with, or --queue"),
    ]
    for argv, said in refused:
        assert _cli(*argv)[0] == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("turnkit: "), err
        assert said in err
        assert err.count("\n") == 1, err
    misused = [
        (("answer", turn_id, "--deny", "--arguments", "{}", *db), "--arguments goes with"),
        (("answer", turn_id, "--approve", "--arguments", "[1]", *db), "not a JSON object"),
        (("answer", turn_id, "--approve", "--arguments", "{x", *db), "is not JSON"),
        (("answer", turn_id, "--reply", "x", "--note", "n", *db), "--note goes with"),
        (("answer", turn_id, "--approve", "--deny", *db), "not allowed with argument"),
        (("answer", turn_id, *db), "one of the arguments --approve --deny --reply is required"),
    ]
    for argv, said in misused:
        with pytest.raises(SystemExit) as exited:
            main(list(argv), out=io.StringIO())
        assert exited.value.code == 2
        assert said in capsys.readouterr().err
    code, listed = _cli("pauses", *db)
    assert f"{turn_id}  awaiting_approval" in listed  # nothing was answered
    code, _ = _cli("answer", turn_id, "--approve", "--agent", APPROVING, *db)
    assert _cli("answer", turn_id, "--approve", *db)[0] == 2  # answered already
    assert "pause-already-answered" in capsys.readouterr().err


def test_answer_and_pauses_refuse_a_database_that_is_not_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.db"
    for argv in (("pauses",), ("answer", "turn_x", "--approve")):
        assert _cli(*argv, "--database-url", f"sqlite:///{missing}")[0] == 2
        assert "turnkit: " in capsys.readouterr().err
    assert not missing.exists()  # a mistyped path is not created empty


def test_queue_only_records_the_answer_for_a_worker(
    openai_server: FakeOpenAIServer, tmp_path: Path, key: str
) -> None:
    url = f"sqlite:///{tmp_path / 'queued.db'}"
    openai_server.script("local-model", [Reply.tool_call("delete_file", {"path": "/tmp/x.txt"})])
    turn_id = _paused_turn(openai_server, url, APPROVING, key)
    requests = len(openai_server.requests)
    code, text = _cli("answer", turn_id, "--approve", "--queue", "--database-url", url)
    assert code == 0, text
    assert text.splitlines()[-1] == f"turn {turn_id} is queued: a worker drives it on"
    assert len(openai_server.requests) == requests  # nothing ran here
    code, turns = _cli("turns", "--session", turns_session(url, turn_id), "--database-url", url)
    assert f"{turn_id}  running" in turns


def turns_session(url: str, turn_id: str) -> str:
    async def read() -> str:
        async with SessionRuntime(agent=approving, config=RuntimeConfig(database_url=url)) as rt:
            return str((await rt.turn(turn_id)).session_id)

    return asyncio.run(read())


def test_a_pause_listed_per_session_and_a_budget_pause_says_it_resumes_by_itself(
    openai_server: FakeOpenAIServer, tmp_path: Path, key: str
) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    openai_server.script("local-model", [Reply.tool_call("delete_file", {"path": "/tmp/x.txt"})])
    turn_id = _paused_turn(openai_server, url, APPROVING, key)
    session = turns_session(url, turn_id)
    assert turn_id in _cli("pauses", "--session", session, "--database-url", url)[1]
    assert _cli("pauses", "--session", "other", "--database-url", url) == (
        0,
        "no paused turns in session other\n",
    )
