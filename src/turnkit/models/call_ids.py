"""Tool-call ids every provider takes back.

Anthropic refuses an id with characters other than letters, digits, `_` and `-`, and a
request that carries one id twice; OpenAI refuses one over 40 characters. Both the tool
loop (naming a new call) and the request encoder (sending a call an older turnkit stored)
name ids with `fresh_call_id`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container

__all__ = ("MAX_CALL_ID_CHARS", "fresh_call_id")

MAX_CALL_ID_CHARS = 40
"""The longest id any provider takes back (OpenAI's limit; Anthropic's is longer)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def fresh_call_id(given: str, used: Container[str], tag: str = "") -> str:
    """`given` made safe, or, when `used` holds that, `<safe>_<tag><n>` for the first free n.

    Safe: other characters become `_`, and an id over 40 characters is cut to 40 ending in a
    digest of the whole. A safe id `used` does not hold comes back as it is.
    """
    safe = _fit(_UNSAFE.sub("_", given) or "call")
    new_id, n = safe, 1
    while new_id in used:
        new_id, n = _fit(f"{safe}_{tag}{n}"), n + 1
    return new_id


def _fit(call_id: str) -> str:
    """`call_id`, or a 40-character one made from its start and a digest of the whole."""
    if len(call_id) <= MAX_CALL_ID_CHARS:
        return call_id
    digest = hashlib.blake2b(call_id.encode(), digest_size=6).hexdigest()  # 12 characters
    return f"{call_id[: MAX_CALL_ID_CHARS - len(digest) - 1]}_{digest}"
