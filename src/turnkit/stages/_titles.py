"""A session's first name, read off its opening message (before any model is asked)."""

from __future__ import annotations

import re
from typing import Final

__all__ = ("TITLE_CHARS", "opening_title")

TITLE_CHARS: Final = 60

_SLUG: Final = re.compile(r"^/[a-z0-9][a-z0-9-]{0,63}(?:\s+|$)")
"""A `/slug` as a message picks a skill with it (`turnkit.skills`): a whole first word."""


def opening_title(text: str) -> str:
    """A name read off a message: its first line, at most 60 characters, cut at a word."""
    line = next((part for part in text.splitlines() if part.strip()), text)
    # A leading `/slug` (a skill's pick: a whole first word) is dropped; a path is kept.
    line = re.sub(r"\s+", " ", _SLUG.sub("", line.strip())).strip()
    line = line or text.strip() or "New chat"
    if len(line) <= TITLE_CHARS:
        return line
    cut = line[:TITLE_CHARS].rsplit(" ", 1)[0].rstrip(",;:.-")
    return (cut or line[:TITLE_CHARS]) + "…"
