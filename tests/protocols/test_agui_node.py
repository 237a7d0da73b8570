"""The official AG-UI client (`@ag-ui/client` on npm) against a real server of the AG-UI route.

`node --test tests/node/agui/agui.test.mjs` drives uvicorn on 127.0.0.1 with HttpAgent: a
tool-using turn, an approval round trip, a reconnect mid-text, what asked agents spent
and an answer a content filter cut. Nothing is installed at
test time: run `npm ci --prefix tests/node/agui` first (CI does). Without `node` the test
skips, except under `CI=true`, where it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import report
from tests.protocols.test_agui import (
    HOLD_TEXT,
    GatedModel,
    add,
    build_app,
    thinking_agent,
    transfer,
)
from tests.support.server import serve
from turnkit import Agent
from turnkit.errors import ProviderError
from turnkit.models import Usage
from turnkit.models.family import ModelFamily
from turnkit.testing import ModelStep, ScriptedModel, call

ROOT = Path(__file__).parent.parent.parent
PACKAGE = ROOT / "tests" / "node" / "agui"
pytestmark = pytest.mark.slow


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is not installed: the AG-UI client test needs it under CI")
        pytest.skip("node is not installed")
    if not (PACKAGE / "node_modules" / "@ag-ui" / "client" / "package.json").exists():
        pytest.fail("the AG-UI client is not installed: run `npm ci --prefix tests/node/agui`")
    return node


def _agents() -> list[Agent]:
    return [
        Agent(
            name="tools",
            model=ScriptedModel([
                ModelStep.tool_call_reply(call("add", a=2, b=3), text="Adding."),
                ModelStep.text_reply("The sum is 5."),
            ]),
            tools=[add],
        ),
        Agent(
            name="approval",
            model=ScriptedModel([
                ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob")),
                ModelStep.text_reply("Sent."),
            ]),
            tools=[transfer],
        ),
        Agent(
            name="approval-edit",
            model=ScriptedModel([
                ModelStep.tool_call_reply(call("transfer", amount=500, to="Bob")),
                ModelStep.text_reply("Sent 50."),
            ]),
            tools=[transfer],
        ),
        Agent(
            name="reconnect",
            model=GatedModel(ScriptedModel([ModelStep.text_reply(HOLD_TEXT, chunk_size=6)])),
        ),
        Agent(name="steady", model=ScriptedModel([ModelStep.text_reply(HOLD_TEXT, chunk_size=6)])),
        Agent(
            name="cascade",
            model=ModelFamily("f", [
                ScriptedModel([ModelStep.cut("Partial text before ", ProviderError(
                    "overloaded", status_code=503, is_retriable=True))], name="first"),
                ScriptedModel([ModelStep.text_reply("Hello from the second rung.")], name="second"),
            ]),
        ),
        thinking_agent(),
        Agent(
            name="approval-usage",
            model=ScriptedModel([
                ModelStep.tool_call_reply(call("transfer", amount=5, to="Bob")),
                ModelStep.text_reply("Sent."),
            ]),
            tools=[transfer],
        ),
        Agent(
            name="question",
            model=ScriptedModel([
                ModelStep.tool_call_reply(
                    call("ask_user", question="Which colour?", choices=["red", "blue"])
                ),
                ModelStep.text_reply("Blue it is."),
            ]),
            clarifications=True,
        ),
        Agent(
            name="fails-after-tool",
            model=ScriptedModel([
                ModelStep.tool_call_reply(call("add", a=2, b=3)),
                ModelStep.cut("The sum ", ProviderError("bad request", status_code=400)),
            ]),
            tools=[add],
        ),
        Agent(
            name="asks",
            model=ScriptedModel([
                ModelStep(tool_calls=(call("shipping", message="Where is A7?"),),
                          usage=Usage(input_tokens=5, output_tokens=1, cost_usd=0.0625)),
                ModelStep(text="It arrives today.",
                          usage=Usage(input_tokens=6, output_tokens=2, cost_usd=0.0625)),
            ]),
            tools=[Agent(name="shipping", model=ScriptedModel([
                ModelStep(text="A7 arrives today.",
                          usage=Usage(input_tokens=12, output_tokens=3, cost_usd=0.25)),
            ])).as_tool()],
        ),
        Agent(name="filtered", model=ScriptedModel([ModelStep.filtered("Here is the first ")])),
        Agent(
            name="oversized",
            model=ScriptedModel([
                ModelStep.tool_call_reply(call("report", pages=5)),  # 60,000 characters
                ModelStep.text_reply("The report is written."),
            ]),
            tools=[report],
        ),
    ]  # fmt: skip


def test_the_ag_ui_client_reads_turnkit_runs(tmp_path: Path) -> None:
    node = _node()
    with serve(build_app(tmp_path, _agents(), max_frame_bytes=50_000)) as url:
        done = subprocess.run(
            [node, "--test", "--test-reporter=spec", "agui.test.mjs"],
            cwd=PACKAGE, capture_output=True, text=True, timeout=90,
            env={**os.environ, "AGUI_URL": url, "AGUI_HOLD_TEXT": HOLD_TEXT},
        )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "pass 12" in done.stdout, done.stdout
    assert "error" not in done.stderr.lower(), done.stderr  # e.g. "Subscriber error: ..."
