"""A tool's result as JSON every store and every reader can take."""

from __future__ import annotations

import math
import re
from typing import Final

from pydantic import JsonValue

__all__ = ("storable",)

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def storable(value: JsonValue) -> JsonValue:
    """`value` with each lone surrogate replaced by U+FFFD and each NaN or infinity by None.

    A surrogate (a file name decoded with `surrogateescape`) has no UTF-8 form, so no event
    holding it could be written; JSON has no NaN, so the stored result would read `null`
    while the model read `NaN`. Values without either come back as they are.
    """
    match value:
        case str():
            return value if value.isascii() else _SURROGATE.sub("\ufffd", value)
        case float():
            return value if math.isfinite(value) else None
        case list():
            return [storable(item) for item in value]
        case dict():
            return {storable(key): storable(item) for key, item in value.items()}  # type: ignore[misc]
        case _:
            return value
