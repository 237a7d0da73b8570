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
from typing import Any, Final, cast

from pydantic import PydanticUserError, TypeAdapter, ValidationError

from turnkit.errors import ConfigurationError

__all__ = ("MAX_PROBLEMS", "OutputCheck", "OutputShape", "repair_request")

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
class OutputCheck:
    """An agent's `output_type`: the shape asked for, how to check it, how often to retry."""

    shape: OutputShape
    retries: int
    adapter: TypeAdapter[Any]

    @classmethod
    def of(cls, output_type: object, retries: object) -> OutputCheck:
        """The check for `output_type`; `ConfigurationError` when it has no object schema."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigurationError(
                f"`output_retries` must be a whole number of 0 or more, not {retries!r}"
            )
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(cast(Any, output_type))
            schema = adapter.json_schema()
        except (PydanticUserError, TypeError) as exc:
            raise ConfigurationError(
                f"`output_type` {output_type!r} has no JSON schema: use a pydantic model, "
                f"a dataclass or a TypedDict ({exc})"
            ) from exc
        if schema.get("type") != "object":
            raise ConfigurationError(
                f"`output_type` must describe a JSON object (a pydantic model, a dataclass "
                f"or a TypedDict), not {output_type!r}: wrap it in a model with one field"
            )
        name = _schema_name(str(schema.get("title") or getattr(output_type, "__name__", "")))
        return cls(shape=OutputShape(name=name, schema=schema), retries=retries, adapter=adapter)

    def problems(self, text: str) -> tuple[str, ...]:
        """What is wrong with `text` as this type's JSON (empty when it is right)."""
        try:
            self.adapter.validate_json(text)
        except ValidationError as exc:
            return tuple(_problem(e) for e in exc.errors(include_url=False)[:MAX_PROBLEMS])
        return ()

    def describe(self) -> dict[str, object]:
        """The check as the agent's version sees it: the schema and the retries."""
        return {"schema": dict(self.shape.schema), "retries": self.retries}


def repair_request(problems: tuple[str, ...]) -> str:
    """The message that asks the model to write its answer again, with what was wrong."""
    listed = "\n".join(f"- {p}" for p in problems)
    return (
        "Your answer does not match the required JSON schema:\n"
        f"{listed}\n"
        "Write the whole answer again as one JSON object that matches the schema, "
        "and nothing else."
    )


def _schema_name(title: str) -> str:
    """A `json_schema` name providers take: letters, digits, `_` and `-`, at most 64."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", title)[:64] or "answer"


def _problem(error: Mapping[str, Any]) -> str:
    """One validation error as a line a model (and an auditor) reads."""
    where = ".".join(str(p) for p in error.get("loc", ())) or "the answer"
    given = error.get("input")
    shown = ""
    if error.get("type") not in ("missing", "json_invalid") and given is not None:
        shown = f" (got {json.dumps(given, default=str)[:80]})"
    return f"{where}: {error.get('msg', 'invalid')}{shown}"[:_PROBLEM_CHARS]
