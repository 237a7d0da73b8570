"""The public API as a user's `mypy --strict` sees it: the documented idioms check clean.

The event stream is the union of event classes (narrowed by `type`), and closable; `@tool`
with options is a `FunctionTool`, as bare `@tool` is. A check that cannot fail would prove
nothing, so the same run must reject a field read on an event not narrowed yet.

tests/typing_usage/ holds a user's modules (tools, events, audit, errors, a plugin, the
routes, the testing helpers), checked in one run: `assert_type` pins what the public types
give, and each `# type: ignore[...]` there marks a call they must refuse (`--strict` warns
of an ignore that is not needed, so a type widened to `Any` fails the run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

USAGE = Path(__file__).parent / "typing_usage"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module's mypy runs: the second reuses turnkit's analysis."""
    return tmp_path_factory.mktemp("mypy_cache")


def _mypy(cache: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache),
         *map(str, paths)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


USER_MODULE = '''
import asyncio

from turnkit import Agent, SessionRuntime, tool
from turnkit.events import DurableStreamEvent
from turnkit.plugins import Plugin, PluginContext
from turnkit.testing import ModelStep, ScriptedModel, collect_events
from turnkit.tools import FunctionTool, ToolClass


class Watch(Plugin):
    name = "watch"

    async def on_event(self, ctx: PluginContext, event: DurableStreamEvent) -> None:
        if event.type == "tool.completed":  # a durable event narrows on its type
            print(event.seq, event.result.output)


@tool(approval="always", name="pay")
async def pay(to: str) -> str:
    """Pay someone."""
    return to


async def main() -> None:
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]), tools=[pay])
    async with SessionRuntime(agent=agent) as runtime:
        stream = runtime.execute_message("s1", "hi")
        async for event in stream:
            if event.type == "message.delta":
                print(event.text)
            elif event.type == "tool.completed":
                print(event.result.output)
        await stream.aclose()
        async for stored in runtime.events("turn_x"):
            if stored.type == "done":
                print(stored.seq, stored.status)
        events = await collect_events(runtime.execute_message("s1", "again"))
        last = events[-1]
        if last.type == "done":
            print(last.status)
        print(last.status)  # not narrowed: most events have no status


tool_: FunctionTool = pay


@tool(fallbacks=[pay])
async def pay_first(to: str) -> str:
    """Pay someone, another way when this fails."""
    return to


cascade: ToolClass = pay_first  # `@tool(fallbacks=...)` is a ToolClass, as documented
asyncio.run(main())
'''


def test_a_users_module_type_checks_where_it_should_and_only_there(
    tmp_path: Path, mypy_cache: Path
) -> None:
    module = tmp_path / "user_app.py"
    module.write_text(USER_MODULE)
    done = _mypy(mypy_cache, module)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    last_line = (
        USER_MODULE.splitlines().index(
            "        print(last.status)  # not narrowed: most events have no status"
        )
        + 1
    )
    assert len(errors) >= 1, done.stdout
    assert all(f"user_app.py:{last_line}:" in line for line in errors), done.stdout
    assert any('has no attribute "status"' in line for line in errors), done.stdout


def test_the_documented_idioms_keep_their_types_under_mypy_strict(mypy_cache: Path) -> None:
    """`tool.fn` keeps its function's signature, a sync reconcile hook is taken, and the
    attributes docs/errors.md lists are typed (not `Any`, not missing)."""
    modules = sorted(USAGE.glob("*.py"))
    assert len(modules) >= 4, modules
    done = _mypy(mypy_cache, *modules)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"no issues found in {len(modules)} source files" in done.stdout, done.stdout
