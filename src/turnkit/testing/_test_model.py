"""`TestModel`: a fake model that needs no script — it calls the tools, then answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import JsonValue
from pydantic_core import to_jsonable_python

from turnkit.agent import PLANNING_TOOL_NAMES
from turnkit.context.results import READ_RESULT_TOOL
from turnkit.models import ModelChunk, ModelMessage, ModelRequest, ToolSpec
from turnkit.pauses import CLARIFY_TOOL
from turnkit.testing._schema_example import schema_example
from turnkit.testing._scripted import ModelStep, ScriptedModel, UnexpectedModelCall, raw_call

__all__ = ("TestModel",)

_BUILT_IN = frozenset({READ_RESULT_TOOL, CLARIFY_TOOL, *PLANNING_TOOL_NAMES})
PLAN_ANSWER = '{"intent": "test", "depth": "none", "tasks": []}'


@dataclass(slots=True)
class TestModel:
    """A `ModelClient` that calls the agent's tools, then answers: no script to write.

    For each message, its first call that offers tools calls every tool the agent gave
    (`call_tools="all"`; turnkit's own, such as `read_tool_result` and `ask_user`, only
    when named) or those named, all at once, each with the simplest arguments its schema
    accepts. Once their results are in, it answers: `answer` if given, else the results
    as JSON (`{"tool_name": result, ...}`), or `"success (no tool calls)"`. A turn asking
    for a structured answer gets `output` as JSON, else the simplest value the answer's
    schema accepts. A planning call gets a plan with no tasks; other utility calls (a
    session's name, a summary) get `utility_answer`.

    Example:
        ```python
        from turnkit import Agent, tool
        from turnkit.testing import TestModel

        @tool
        async def weather(city: str, days: int = 1) -> str:
            \"\"\"The forecast.\"\"\"
            return f"sunny in {city}"

        agent = Agent(model=TestModel(), tools=[weather])
        ```
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, though its name says so

    call_tools: Literal["all"] | Sequence[str] = "all"
    answer: str | None = None
    output: Any = None
    """The structured answer to give (a pydantic model, a dataclass or plain JSON data)."""
    utility_answer: str = "Test"
    name: str = "test"
    context_window: int | None = None
    """The context window to declare (compaction triggers at 85% of it); None: none."""
    _player: ScriptedModel = field(init=False)

    def __post_init__(self) -> None:
        given: object = self.call_tools  # an untyped caller's value may be anything
        names = (
            isinstance(given, Sequence)
            and not isinstance(given, str)
            and all(isinstance(name, str) for name in given)
        )
        if given != "all" and not names:
            raise TypeError(f"call_tools is {given!r}: give 'all' or a list of tool names")
        self._player = ScriptedModel(
            [ModelStep.respond(self._decide)],
            name=self.name,
            context_window=self.context_window,
            repeat_last=True,
        )

    @property
    def model(self) -> str:
        """The model name shown in audit rows."""
        return self.name

    @property
    def provider(self) -> str:
        """Always `test`."""
        return "test"

    @property
    def calls(self) -> list[ModelRequest]:
        """Every request it received, in order."""
        return self._player.calls

    @property
    def aborted(self) -> int:
        """How many calls were cut off before their `Finish`."""
        return self._player.aborted

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Answer the call (see the class's docstring)."""
        return self._player.stream(request)

    def _decide(self, request: ModelRequest) -> ModelStep:
        if request.purpose == "plan":
            return ModelStep.text_reply(PLAN_ANSWER)
        if request.purpose == "utility":
            return ModelStep.text_reply(self.utility_answer)
        since = _since_last_user(request.messages)
        called = any(m.role == "tool" for m in since)
        if not called and request.tools and request.tool_choice != "none":
            chosen = self._chosen(request.tools)
            if chosen:
                return ModelStep.tool_call_reply(
                    *(raw_call(spec.name, _arguments(spec)) for spec in chosen)
                )
        if request.output is not None:
            value = (
                self.output if self.output is not None else schema_example(request.output.schema)
            )
            return ModelStep.text_reply(json.dumps(to_jsonable_python(value), ensure_ascii=False))
        if self.answer is not None:
            return ModelStep.text_reply(self.answer)
        if not called:
            return ModelStep.text_reply("success (no tool calls)")
        return ModelStep.text_reply(json.dumps(_results(since), ensure_ascii=False))

    def _chosen(self, offered: Sequence[ToolSpec]) -> list[ToolSpec]:
        if self.call_tools == "all":
            return [spec for spec in offered if spec.name not in _BUILT_IN]
        by_name = {spec.name: spec for spec in offered}
        missing = [name for name in self.call_tools if name not in by_name]
        if missing:
            raise UnexpectedModelCall(
                f"TestModel {self.name!r} was told to call {missing}, but this call offers "
                f"only {sorted(by_name)}"
            )
        return [by_name[name] for name in self.call_tools]


def _since_last_user(messages: Sequence[ModelMessage]) -> Sequence[ModelMessage]:
    last = max((at for at, m in enumerate(messages) if m.role == "user"), default=-1)
    return messages[last + 1 :]


def _arguments(spec: ToolSpec) -> str:
    value = schema_example(spec.parameters)
    if not isinstance(value, dict):
        raise UnexpectedModelCall(
            f"the tool {spec.name!r} takes {value!r}, not an object of arguments"
        )
    return json.dumps(value, ensure_ascii=False)


def _results(messages: Sequence[ModelMessage]) -> dict[str, JsonValue]:
    """This message's tool results by tool name (the last result of a name wins)."""
    names = {c.tool_call_id: c.name for m in messages for c in m.tool_calls}
    results: dict[str, JsonValue] = {}
    for message in messages:
        if message.role == "tool" and message.tool_call_id is not None:
            content = message.content if isinstance(message.content, str) else str(message.content)
            try:
                parsed: JsonValue = json.loads(content)
            except ValueError:
                parsed = content
            results[names.get(message.tool_call_id, message.tool_call_id)] = parsed
    return results
