"""A server that shuts down mid-turn ends its AI SDK and AG-UI streams saying so.

Their clients take a stream that simply ends for a finished answer; a rolling restart must
instead leave them an `error` part or a `RUN_ERROR` that says to resume, while the turn
goes on (here: on the second process, which the client then resumes from).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.http.test_multiprocess import Servers, servers  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

TIMEOUT = httpx.Timeout(30.0)


def _data_lines(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line.removeprefix("data: ")


def _after_sigterm(
    url: str, proc: Any, path: str, body: dict[str, Any], started: str
) -> tuple[list[str], str]:
    """POST `body`, read until a data line holds `started`, SIGTERM the server, read the rest."""
    lines: list[str] = []
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        turn_id = response.headers["x-turn-id"]
        for data in _data_lines(response):
            lines.append(data)
            if started in data and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the tool sleeps a minute: mid-turn
    proc.wait(timeout=30)
    return lines, turn_id


def test_an_ai_sdk_stream_ends_with_an_error_part_when_its_server_stops(
    servers: Servers,  # noqa: F811 - the fixture
) -> None:
    url_a, proc_a = servers.start(TK_TOOL_SLEEP="3")
    url_b, _ = servers.start()
    body = {
        "id": "chat-stop",
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "x=4"}]}],
        "trigger": "submit-message",
    }
    lines, _ = _after_sigterm(url_a, proc_a, "/api/chat", body, '"tool-input-available"')
    assert lines[-1] == "[DONE]"
    last = json.loads(lines[-2])
    assert last["type"] == "error"
    assert "server-shutting-down" in last["errorText"]
    assert not any(json.loads(x).get("type") == "finish" for x in lines[:-1])
    # The turn went on elsewhere: the other server's resume reads the whole message.
    with httpx.stream("GET", f"{url_b}/api/chat/chat-stop/stream", timeout=TIMEOUT) as again:
        resumed = list(_data_lines(again))
    parts = [json.loads(x) for x in resumed if x != "[DONE]"]
    assert parts[-1]["type"] == "finish"
    assert parts[-1]["messageMetadata"]["status"] == "succeeded"
    assert any(p["type"] == "tool-output-available" for p in parts)


def test_an_agui_stream_ends_with_run_error_when_its_server_stops(
    servers: Servers,  # noqa: F811 - the fixture
) -> None:
    url_a, proc_a = servers.start(TK_TOOL_SLEEP="3")
    url_b, _ = servers.start()
    body = {
        "threadId": "thread-stop",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "x=4"}],
    }
    lines, turn_id = _after_sigterm(url_a, proc_a, "/api/agui/run", body, '"TOOL_CALL_END"')
    events = [json.loads(x) for x in lines]
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "server-shutting-down"
    assert "Last-Event-ID" in events[-1]["message"]
    assert not any(e["type"] == "RUN_FINISHED" for e in events)
    # The run went on in the other server, where the client picks it up again.
    deadline = time.monotonic() + 30
    while (
        httpx.get(f"{url_b}/api/harness/turns/{turn_id}", timeout=TIMEOUT).json()["status"]
        == "running"
    ):
        assert time.monotonic() < deadline, "the turn never finished on the other server"
        time.sleep(0.1)
    again = httpx.post(
        f"{url_b}/api/agui/run", json=body, headers={"Last-Event-ID": "0"}, timeout=TIMEOUT
    )
    replayed = [
        json.loads(x.removeprefix("data: "))
        for x in again.text.splitlines()
        if x.startswith("data: ")
    ]
    assert replayed[-1]["type"] == "RUN_FINISHED"
