"""`Citations`: link the answer's sentences to the tool results they came from.

Post-turn, no model call: a sentence of the answer cites a tool result when they share a
number (a figure, a price, a date) or at least two distinctive words. Each citation names
the result's tool call (`source`), its tool (`title`), a `url` when the result carries one,
and the sentence it supports (`quote`). They arrive as `message.citations` and are kept
with the answer in `history`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from pydantic import JsonValue

from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.errors import ConfigurationError
from turnkit.events import Citation
from turnkit.plugins import Enrichment, Plugin, PluginContext

__all__ = ("Citations",)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])\s*|\n+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[^\W\d_](?:[^\W_]|['-]){3,}")
"""A word of four letters or more, in any script (`Zürich`, `Москва`)."""
_COMMON = frozenset(
    [
        "this",
        "that",
        "with",
        "from",
        "have",
        "were",
        "been",
        "will",
        "would",
        "could",
        "should",
        "about",
        "there",
        "their",
        "which",
        "what",
        "when",
        "where",
        "your",
        "they",
        "them",
        "then",
        "than",
        "also",
        "into",
        "over",
        "only",
        "some",
        "such",
        "more",
        "most",
        "very",
        "just",
        "here",
    ]
)


_MIN_SHARED_WORDS = 2
"""The default: a sentence cites a result it shares a figure or this many words with."""


class Citations(Plugin):
    """Cite the tool results an answer relies on (deterministic, no model call)."""

    name: ClassVar[str] = "citations"
    order: ClassVar[int] = 100

    def __init__(self, *, min_shared_words: int = _MIN_SHARED_WORDS) -> None:
        if isinstance(min_shared_words, bool) or not isinstance(min_shared_words, int):
            raise ConfigurationError(
                f"`min_shared_words` is a whole number, not {min_shared_words!r}"
            )
        if min_shared_words < 1:
            raise ConfigurationError(f"`min_shared_words` is at least 1, not {min_shared_words}")
        self.min_shared_words = min_shared_words

    def settings(self) -> dict[str, JsonValue]:
        """`min_shared_words` when it is not the default (it counts in the agent's version)."""
        if self.min_shared_words == _MIN_SHARED_WORDS:
            return {}
        return {"min_shared_words": self.min_shared_words}

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        """Citations for the answer's sentences that share figures or words with a result."""
        usable = [s for s in sources if not s.is_error and s.output is not None]
        found: list[Citation] = []
        for sentence in filter(None, map(str.strip, _SENTENCE_END.split(answer.text))):
            numbers, words = _marks(sentence)
            for source in usable:
                text = _flatten(source.output)
                src_numbers, src_words = _marks(text)
                if numbers & src_numbers or len(words & src_words) >= self.min_shared_words:
                    found.append(
                        Citation(
                            source=source.tool_call_id,
                            title=source.tool_name,
                            url=_url(source.output),
                            quote=sentence[:300],
                        )
                    )
        return Enrichment(citations=tuple(dict.fromkeys(found))) if found else None


def _marks(text: str) -> tuple[set[str], set[str]]:
    numbers = {n.replace(",", "") for n in _NUMBER.findall(text) if len(n) >= 2}
    words = {w.lower() for w in _WORD.findall(text)} - _COMMON
    return numbers, words


def _flatten(value: JsonValue) -> str:
    if isinstance(value, dict):
        return " ".join(_flatten(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(_flatten(v) for v in value)
    return "" if value is None else str(value)


def _url(value: JsonValue) -> str | None:
    if isinstance(value, dict):
        found = value.get("url")
        return found if isinstance(found, str) else None
    return None
