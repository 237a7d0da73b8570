"""A valid JSON value for a JSON schema: what `TestModel` writes as a tool's arguments.

Deterministic and minimal: an object gets its required properties only, an array its
fewest items (at least one), a number the value nearest zero within its bounds, a string
the shortest run of letters its length allows (or an example of its `format`). Schemas
come from pydantic (`$ref`/`$defs`, `anyOf` for optional and union types, `allOf`), so
that is what is covered; a `pattern` is not followed, and a date-time carries its zone.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

__all__ = ("schema_example",)

_FORMATS: Mapping[str, str] = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00",
    "duration": "P1D",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "uuid1": "00000000-0000-1000-8000-000000000000",
    "uuid3": "00000000-0000-3000-8000-000000000000",
    "uuid4": "00000000-0000-4000-8000-000000000000",
    "uuid5": "00000000-0000-5000-8000-000000000000",
    "ipvanyaddress": "127.0.0.1",
    "ipv4network": "127.0.0.0/8",
    "ipv6network": "::/128",
    "ipvanynetwork": "127.0.0.0/8",
    "ipv4interface": "127.0.0.1/8",
    "ipv6interface": "::1/128",
    "ipvanyinterface": "127.0.0.1/8",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}
_MAX_DEPTH = 24


def schema_example(schema: Mapping[str, Any]) -> JsonValue:
    """A value `schema` accepts (see the module's docstring for what is covered)."""
    return _Maker(schema).value(schema, 0, 0)


class _Maker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self._defs: Mapping[str, Any] = {
            **(root.get("definitions") or {}),
            **(root.get("$defs") or {}),
        }

    def value(self, schema: Mapping[str, Any], nth: int, depth: int) -> JsonValue:
        """A value for `schema`; `nth` varies it among siblings (distinct array items)."""
        if depth > _MAX_DEPTH:
            raise ValueError("the schema nests too deeply (a recursive type with no way out)")
        schema = self._resolved(schema)
        if "const" in schema:
            return schema["const"]  # type: ignore[no-any-return]
        if "enum" in schema:
            choices = schema["enum"]
            return choices[nth % len(choices)]  # type: ignore[no-any-return]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.value(_branch(schema[key]), nth, depth + 1)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(self._resolved(part))
            merged.update({k: v for k, v in schema.items() if k != "allOf"})
            return self.value(merged, nth, depth + 1)
        return self._typed(schema, nth, depth)

    def _typed(self, schema: Mapping[str, Any], nth: int, depth: int) -> JsonValue:
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return _number(schema, nth, integer=kind == "integer")
        if kind == "boolean":
            return nth % 2 == 1
        if kind == "null":
            return None
        return _string(schema, nth)

    def _resolved(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        seen = 0
        while "$ref" in schema:
            ref = str(schema["$ref"])
            name = ref.rsplit("/", 1)[-1]
            if not ref.startswith("#/") or name not in self._defs or seen > _MAX_DEPTH:
                raise ValueError(f"the schema's reference {ref!r} names no definition in it")
            schema = {**self._defs[name], **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema

    def _object(self, schema: Mapping[str, Any], depth: int) -> JsonValue:
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = schema.get("required") or ()
        made = {name: self.value(properties.get(name, {}), 0, depth + 1) for name in required}
        extra = schema.get("additionalProperties")
        extra = extra if isinstance(extra, Mapping) else {}
        for at in range(int(schema.get("minProperties", 0)) - len(made)):
            made[f"{string.ascii_lowercase[at % 26]}{at // 26 or ''}"] = self.value(
                extra, at, depth + 1
            )
        return made

    def _array(self, schema: Mapping[str, Any], depth: int) -> JsonValue:
        prefix = schema.get("prefixItems") or ()
        items: Mapping[str, Any] = schema.get("items") or {}
        least = max(int(schema.get("minItems", 1)), len(prefix))
        count = min(least, int(schema.get("maxItems", least)))
        return [
            self.value(prefix[at] if at < len(prefix) else items, at, depth + 1)
            for at in range(count)
        ]


def _branch(branches: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The first branch that is not `null` (an optional value gets one)."""
    return next((b for b in branches if b.get("type") != "null"), branches[0])


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "properties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return "string"
    return str(kind)


def _number(schema: Mapping[str, Any], nth: int, *, integer: bool) -> int | float:
    step = 1 if integer else 0.5
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + step
    if "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - step
    value: float = nth
    if low is not None and value < low:
        value = low + nth
    if high is not None and value > high:
        value = high
    if low is not None and value < low:  # bounds tighter than a step: their middle
        value = (schema.get("exclusiveMinimum", low) + schema.get("exclusiveMaximum", high)) / 2
    multiple = schema.get("multipleOf")
    if multiple:
        value = math.ceil(value / multiple) * multiple
        if high is not None and value > high:  # rounded up past the maximum: round down
            value = math.floor(high / multiple) * multiple
    return math.ceil(value) if integer else float(value)


def _string(schema: Mapping[str, Any], nth: int) -> str:
    shown = _FORMATS.get(str(schema.get("format", "")))
    if shown is not None:
        return shown
    least = int(schema.get("minLength", 1))
    most = int(schema.get("maxLength", max(least, 1)))
    letter = string.ascii_lowercase[nth % 26]
    return letter * max(min(max(least, 1), most), 0)
