"""The official AI SDK client (`ai` on npm) against a real server of the AI SDK routes.

Node runs `tests/node/ai_sdk/scenarios.mjs` against uvicorn on 127.0.0.1, once with each
tested major version of `ai`: 6 (`tests/node/ai_sdk`) and 7 (`tests/node/ai_sdk7`), each
pinned by its package-lock.json. Nothing is installed at test time: run
`npm ci --prefix tests/node/ai_sdk` and `npm ci --prefix tests/node/ai_sdk7` first (CI
does). Without `node` the tests skip, except under `CI=true`, where they fail.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import report
from tests.protocols.test_ai_sdk import HOLD_TEXT, GatedModel, NoDeletes, build_app
from tests.support.server import serve
from turnkit import Agent
from turnkit.errors import ProviderError
from turnkit.models import Usage
from turnkit.models.family import ModelFamily
from turnkit.testing import ModelStep, ScriptedModel, call

ROOT = Path(__file__).parent.parent.parent
SCENARIOS = ROOT / "tests" / "node" / "ai_sdk" / "scenarios.mjs"
# One installed client per tested major version of `ai` (scenarios.mjs imports its ai.mjs).
PACKAGES = {"ai6": "ai_sdk", "ai7": "ai_sdk7"}
pytestmark = pytest.mark.slow


def _node(package: Path) -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is not installed: the AI SDK client tests need it under CI")
        pytest.skip("node is not installed")
    install = f"run `npm ci --prefix tests/node/{package.name}`"
    installed = package / "node_modules" / "ai" / "package.json"
    if not installed.exists():
        pytest.fail(f"the AI SDK is not installed: {install}")
    pinned = json.loads((package / "package.json").read_text())["dependencies"]["ai"]
    version = json.loads(installed.read_text())["version"]
    if version != pinned:
        pytest.fail(f"ai {version} is installed where {pinned} is pinned: {install}")
    return node


def _scripts() -> dict[str, ScriptedModel | GatedModel | ModelFamily]:
    return {
        "tool-turn": ScriptedModel([
            ModelStep.tool_call_reply(call("add", a=2, b=3), text="Adding."),
            ModelStep.text_reply("The sum is 5."),
        ]),
        "approval": ScriptedModel([
            ModelStep.tool_call_reply(call("delete_file", path="/tmp/x")),
            ModelStep.text_reply("Deleted."),
        ]),
        "reload-paused": ScriptedModel([
            ModelStep.tool_call_reply(call("delete_file", path="/tmp/x")),
            ModelStep.text_reply("Deleted."),
        ]),
        "approved-then-denied": ScriptedModel([
            ModelStep.tool_call_reply(call("delete_file", path="/tmp/x")),
            ModelStep.text_reply("It is frozen."),
        ]),
        "two-approvals": ScriptedModel([
            ModelStep.tool_call_reply(
                call("delete_file", path="/tmp/x"), call("delete_file", path="/tmp/y")
            ),
            ModelStep.text_reply("Deleted both."),
        ]),
        "approved-then-reloaded": ScriptedModel([
            ModelStep.tool_call_reply(call("delete_file", path="/tmp/x")),
            ModelStep.text_reply("Deleted."),
        ]),
        "two-approvals-reloaded": ScriptedModel([
            ModelStep.tool_call_reply(
                call("delete_file", path="/tmp/x"), call("delete_file", path="/tmp/y")
            ),
            ModelStep.text_reply("Deleted both."),
        ]),
        "reconnect": GatedModel(
            ScriptedModel([
                ModelStep.tool_call_reply(call("add", a=40, b=2), text="Adding."),
                ModelStep.text_reply(
                    "The answer is forty-two, after a careful look at every number."
                ),
            ]),
            gated_call=1,
            hold_after=2,
        ),
        "cascade": ModelFamily("f", [
            ScriptedModel([ModelStep.cut("Partial text before ", ProviderError(
                "overloaded", status_code=503, is_retriable=True))], name="first"),
            ScriptedModel([ModelStep.text_reply("Hello from the second rung.")], name="second"),
        ]),
        "fails-mid-text": ScriptedModel([
            ModelStep.cut("Partial answer that ", ProviderError("bad request", status_code=400)),
        ]),
        "stopped": GatedModel(
            ScriptedModel([ModelStep.text_reply(HOLD_TEXT)]), gated_call=0, hold_after=2
        ),
        "two-tools": ScriptedModel([
            ModelStep.tool_call_reply(call("add", a=1, b=2), call("add", a=3, b=4)),
            ModelStep.text_reply("3 and 7."),
        ]),
        "thinking": ScriptedModel([
            ModelStep.text_reply("Four. " * 40, thinking="two and two make four")
        ]),
        "question": ScriptedModel([
            ModelStep.tool_call_reply(
                call("ask_user", question="Which colour?", choices=["red", "blue"])
            ),
            ModelStep.text_reply("Blue it is."),
        ]),
        "oversized": ScriptedModel([
            ModelStep.tool_call_reply(call("report", pages=5)),  # a 60,000-character result
            ModelStep.text_reply("The report is written."),
        ]),
        "asked": ScriptedModel([
            ModelStep(tool_calls=(call("shipping", message="Where is A7?"),),
                      usage=Usage(input_tokens=5, output_tokens=1, cost_usd=0.0625)),
            ModelStep(text="It arrives today.",
                      usage=Usage(input_tokens=6, output_tokens=2, cost_usd=0.0625)),
        ]),
    }  # fmt: skip


def _shipping() -> Agent:
    """The agent the "asked" scenario asks as a tool (costs are binary fractions)."""
    step = ModelStep(
        text="A7 arrives today.", usage=Usage(input_tokens=12, output_tokens=3, cost_usd=0.25)
    )
    return Agent(name="shipping", model=ScriptedModel([step]))


@pytest.mark.parametrize(
    "scenario",
    [
        "tool-turn",
        "approval",
        "two-approvals",
        "approved-then-denied",
        "reload-paused",
        "reconnect",
        "oversized",
        "cascade",
        "fails-mid-text",
        "stopped",
        "two-tools",
        "approved-then-reloaded",
        "two-approvals-reloaded",
        "thinking",
        "question",
        "asked",
    ],
)
@pytest.mark.parametrize("client", list(PACKAGES))
def test_the_ai_sdk_client_reads_turnkit_streams(
    client: str, scenario: str, tmp_path: Path
) -> None:
    package = ROOT / "tests" / "node" / PACKAGES[client]
    node = _node(package)
    model = _scripts()[scenario]
    options: dict[str, Any] = {
        "oversized": {"tools": [report], "max_frame_bytes": 50_000},
        "approved-then-denied": {"plugins": [NoDeletes()]},
        "thinking": {
            "utility_model": ScriptedModel(
                [ModelStep.text_reply("It added the numbers.")], name="background", repeat_last=True
            ),
            "skip_stages": frozenset({"anchor-plan"}),
        },
        "question": {"clarifications": True},
        "asked": {"tools": [_shipping().as_tool()]},
    }.get(scenario, {})
    with serve(build_app(tmp_path, model, **options)) as url:
        done = subprocess.run(
            [node, str(SCENARIOS), scenario, url, str(package)],
            cwd=package, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0, f"{client} {scenario}:\n{done.stdout}\n{done.stderr}"
    assert f"ok {scenario}" in done.stdout
