"""`Entities`: the emails, links, amounts, percentages and dates the answer mentions.

Post-turn, no model call, by pattern. They arrive as `message.entities`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.events import Entity
from turnkit.plugins import Enrichment, Plugin, PluginContext

__all__ = ("Entities",)

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("url", re.compile(r"\bhttps?://[^\s)>\]]+")),
    ("money", re.compile(r"[$€£]\s?\d[\d,]*(?:\.\d+)?|\b\d[\d,]*(?:\.\d+)?\s?(?:USD|EUR|GBP)\b")),
    ("percent", re.compile(r"\b\d+(?:\.\d+)?\s?%")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b")),
)


class Entities(Plugin):
    """Name the entities of the answer by pattern: email, url, money, percent, date."""

    name: ClassVar[str] = "entities"
    order: ClassVar[int] = 110

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        """The entities the answer mentions."""
        found = [
            Entity(name=match.group(0).rstrip(".,"), kind=kind)
            for kind, pattern in _PATTERNS
            for match in pattern.finditer(answer.text)
        ]
        return Enrichment(entities=tuple(dict.fromkeys(found))) if found else None
