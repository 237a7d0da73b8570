"""Structured answers: the shape an agent's answer must have, and the check of it.

An agent with `output_type` asks its provider for an answer in that JSON shape (a
`response_format` of `json_schema`), checks the answer against the type, and asks again
with what was wrong, up to `output_retries` times, before the answer is final.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast, get_args, get_origin

from pydantic import JsonValue, PydanticUserError, TypeAdapter, ValidationError, create_model

from turnkit.errors import ConfigurationError, typed_message
from turnkit.tenancy import Principal

__all__ = (
    "MAX_PROBLEMS",
    "AnswerContext",
    "OutputCheck",
    "OutputShape",
    "ToolCallMade",
    "check_retries",
    "repair_request",
)

MAX_PROBLEMS: Final = 5
"""The most problems an answer's check reports (to the model and in the audit)."""

_PROBLEM_CHARS: Final = 300


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputShape:
    """The JSON shape a model call asks its provider for: a name and a JSON schema."""

    name: str
    schema: Mapping[str, Any]

    def response_format(self) -> dict[str, object]:
        """The OpenAI-style `response_format` that asks for this shape."""
        return {
            "type": "json_schema",
            "json_schema": {"name": self.name, "schema": dict(self.schema)},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallMade:
    """A tool call the turn made before its answer, with its result."""

    name: str
    arguments: Mapping[str, JsonValue]
    """The arguments it ran with (empty when the model's were not a JSON object)."""
    output: JsonValue = None
    """What the tool returned (None when it failed)."""
    error: str | None = None
    """Why it failed (it raised, was denied, or its arguments did not fit); None: it ran."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerContext:
    """What validators of an agent's `output_type` find in pydantic's `info.context`.

    A validator that raises `ValueError` makes the answer fail its check; the model is
    told the message. Outside a turn (`Triage.model_validate_json(answer)` in your app)
    `info.context` is None, so a validator that needs it returns early then.
    """

    caller: Principal | None
    """Who sent the message (None: anonymous)."""
    deps: object
    """The app's dependencies for this turn, as tools see them in `ToolContext.deps`."""
    tool_calls: tuple[ToolCallMade, ...]
    """This turn's tool calls that have a result, in the order their results came in."""

    def called(self, name: str) -> bool:
        """Whether the turn called the tool `name` and it ran (did not fail)."""
        return any(c.name == name and c.error is None for c in self.tool_calls)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputCheck:
    """An agent's `output_type`: the shape asked for, how to check it, how often to retry.

    A type whose JSON is not an object (a union, a list, a number) is asked for wrapped,
    as `{"response": ...}` (providers take only an object at the top of a schema);
    `parse` unwraps it.
    """

    shape: OutputShape
    retries: int
    adapter: TypeAdapter[Any]
    """Validates the answer's JSON (the wrapper, for a type that is not an object)."""
    wrapped: bool
    """The answer is `{"response": <the type's JSON>}`."""
    type_name: str
    """The type as `type_key` writes it (the same in every process)."""

    @classmethod
    def of(cls, output_type: object, retries: int) -> OutputCheck:
        """The check for `output_type`; `ConfigurationError` when it has no JSON schema."""
        check_retries(retries)
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(cast(Any, output_type))
            schema = adapter.json_schema()
            wrapped = _top(schema).get("type") != "object"
            if wrapped:
                wrapper = create_model("Answer", response=(cast(Any, output_type), ...))
                adapter = TypeAdapter(wrapper)
                schema = adapter.json_schema()
        except (PydanticUserError, TypeError) as exc:
            raise ConfigurationError(
                f"`output_type` {output_type!r} has no JSON schema: use a pydantic model, "
                f"a dataclass, a TypedDict, or a union or list of them ({exc})"
            ) from exc
        title = "answer"
        if not wrapped:
            title = str(getattr(output_type, "__name__", "") or _top(schema).get("title") or "")
        return cls(
            shape=OutputShape(name=_schema_name(title), schema=schema),
            retries=retries,
            adapter=adapter,
            wrapped=wrapped,
            type_name=type_key(output_type),
        )

    def problems(self, text: str, context: AnswerContext | None = None) -> tuple[str, ...]:
        """What is wrong with `text` as this type's JSON (empty when it is right)."""
        if not text.strip():  # said plainly, not as a JSON parser's end-of-input error
            return ("the answer was empty",)
        try:
            self.adapter.validate_json(text, context=context)
        except ValidationError as exc:
            return tuple(_problem(e) for e in exc.errors(include_url=False)[:MAX_PROBLEMS])
        except Exception as exc:  # noqa: BLE001 - a validator of the app's that did not expect it
            return (typed_message(exc)[:_PROBLEM_CHARS],)
        return ()

    def parse(self, answer: str) -> Any:
        """The answer as the type (unwrapped); pydantic's `ValidationError` if it is not.

        Validators run with no context (`info.context` is None), as outside any turn.
        """
        value = self.adapter.validate_json(answer)
        return value.response if self.wrapped else value

    def describe(self) -> dict[str, object]:
        """The check as the agent's version sees it: the type's name, schema and retries.

        The name stands for its validators, which the schema does not show: renaming or
        replacing the type makes a new version; changing a validator's code does not.
        """
        return {
            "type": self.type_name,
            "schema": dict(self.shape.schema),
            "retries": self.retries,
        }


def type_key(tp: object) -> str:
    """A type as the same text in every process.

    Classes by module and qualified name; generic forms (unions, `list[...]`,
    `Annotated`, `Literal`) by their parts; anything else by its `repr` without addresses.
    """
    args = get_args(tp)
    origin = get_origin(tp)
    if origin is not None:
        name = getattr(origin, "__qualname__", None) or _addressless(repr(origin))
        return f"{name}[{', '.join(type_key(a) for a in args)}]"
    if isinstance(tp, type):
        return f"{tp.__module__}.{tp.__qualname__}"
    return _addressless(repr(tp))


def _addressless(text: str) -> str:
    """`repr` without memory addresses (`<function f at 0x7f…>` → `<function f>`)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def check_retries(retries: object) -> None:
    """`ConfigurationError` unless `retries` is a whole number of 0 or more."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(
            f"`output_retries` must be a whole number of 0 or more, not {retries!r}"
        )


def _top(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The schema's top level, following a `$ref` into `$defs` (a model that nests itself)."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        if isinstance(found, Mapping):
            return found
    return schema


def repair_request(problems: tuple[str, ...]) -> str:
    """The message that asks the model to write its answer again, with what was wrong."""
    listed = "\n".join(f"- {p}" for p in problems)
    return (
        "Your answer was not accepted:\n"
        f"{listed}\n"
        "Fix this and answer again with only the JSON object the schema describes."
    )


def _schema_name(title: str) -> str:
    """A `json_schema` name providers take: letters, digits, `_` and `-`, at most 64."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", title)[:64] or "answer"


def _problem(error: Mapping[str, Any]) -> str:
    """One validation error as a line a model (and an auditor) reads."""
    message = str(error.get("msg", "invalid"))
    loc = error.get("loc", ())
    if not loc:  # the whole answer: a model validator's own message, or JSON that does not parse
        return message[:_PROBLEM_CHARS]
    where = ".".join(str(p) for p in loc)
    given = error.get("input")
    shown = ""
    if error.get("type") != "missing" and given is not None:
        given_json = json.dumps(given, default=str, ensure_ascii=False)
        shown = f" (got {given_json if len(given_json) <= 80 else given_json[:79] + '…'})"
    return f"{where}: {message}{shown}"[:_PROBLEM_CHARS]
