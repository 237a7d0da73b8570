"""`PiiRedaction`: a guardrail that masks emails, phone numbers and card numbers.

It checks the user's message (optional), every tool result before the model reads it,
and the assistant's text before each chunk goes out and once more as a whole. A finding
is a `guardrail` event (checkpoint, kind, action; never the text) and the text goes on
masked (`[email]`, `[phone]`, `[card]`), or, with `block=True`, the turn ends
`guardrail-blocked`.

The answer is checked as it streams: the text so far before each chunk goes out, its
trailing word or run of digits held back while it may still grow into a value (so no part
of one is shown before it is masked), and the whole block once more.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from turnkit.plugins import Plugin, PluginContext, ToolCall, Verdict

__all__ = ("PiiRedaction",)

# Each pattern tries once per run of the characters it is made of (the lookbehinds), so a
# long run that is no finding (`a.a.a.a…`, a hex dump) costs its length, not its square.
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_PHONE = re.compile(
    # not inside a word or a longer number (one or two separators back); not an ISO date
    r"(?<![\w+(])(?<!\d[ ()-])(?<!\d[ ()-]{2})(?!\d{4}-\d\d-\d\d\b)"
    r"(?:\+|\(\s?)?\d(?:[ ()-]{0,2}\d){8,14}(?![ ()-]{0,2}\d)"
)
"""9 to 15 digits (as many as an international number has), at most two spaces, dashes
or brackets between each, optionally after `+` or `(`."""
_CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![ -]?\d)")
"""13 to 19 digits, one space or dash at most between each (masked only if the Luhn
checksum holds)."""
_OPEN_WORD = re.compile(r"(?<![\w.+@-])[\w.+@-]+\Z")
"""A word still streaming: it may yet become an email address."""
_OPEN_NUMBER = re.compile(r"(?<![\d+(])\(?(?:\+?\d[\d ()-]*\S*)?\Z")
"""Digits still streaming, spaces, dashes and brackets between them (a phone or card
number), a `(` that may open one, and the word just after them (a full stop does not end
the number before the next digit)."""
KINDS = ("email", "card", "phone")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch)
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _mask(text: str, kinds: Iterable[str]) -> tuple[str, list[str]]:
    found: list[str] = []
    for kind in kinds:
        if kind == "email":
            text, n = _EMAIL.subn("[email]", text)
        elif kind == "card":
            n = 0

            def card(match: re.Match[str]) -> str:
                nonlocal n
                digits = re.sub(r"\D", "", match.group(0))
                if 13 <= len(digits) <= 19 and _luhn(digits):
                    n += 1
                    return "[card]"
                return match.group(0)

            text = _CARD.sub(card, text)
        else:
            text, n = _PHONE.subn("[phone]", text)
        if n:
            found.append(kind)
    return text, found


_SETTLED_BEFORE = 64
"""Characters from the end of text already checked that may still join a finding: more
than the longest phone or card number with its separators."""
_BREAK = re.compile(r"[^\d()+\s-]\s")
"""A space after a character no number or address goes on through: a finding ends there."""


@dataclass(slots=True)
class _Checked:
    """What one answer block's text was found to hold, up to where it is settled."""

    text: str
    settled: int
    """`text[:settled]` masks to `masked` whatever follows it."""
    masked: str
    found: list[str]


class _Streaming:
    """The settled part of each streaming block, masked once.

    A check of the text so far then masks only what arrived since the settled part:
    linear in the answer's length, not quadratic.
    """

    def __init__(self, limit: int = 64) -> None:
        self._limit = limit
        self._blocks: OrderedDict[str, _Checked] = OrderedDict()

    def mask(self, key: str, text: str, kinds: tuple[str, ...]) -> tuple[str, list[str]]:
        """`_mask(text, kinds)`, reusing the settled part of `key`'s last text.

        Only when `text` goes on from that text; otherwise it is masked whole.
        """
        last = self._blocks.pop(key, None)
        if last is None or not text.startswith(last.text):
            last = _Checked(text="", settled=0, masked="", found=[])
        rest, found = _mask(text[last.settled :], kinds)
        masked = last.masked + rest
        found = [kind for kind in kinds if kind in last.found or kind in found]
        settled = _settled_end(text, last.settled)
        if settled > last.settled:
            head, head_found = _mask(text[last.settled : settled], kinds)
            last = _Checked(
                text=text,
                settled=settled,
                masked=last.masked + head,
                found=[kind for kind in kinds if kind in last.found or kind in head_found],
            )
        else:
            last = _Checked(text=text, settled=last.settled, masked=last.masked, found=last.found)
        self._blocks[key] = last
        while len(self._blocks) > self._limit:
            self._blocks.popitem(last=False)
        return masked, found


def _settled_end(text: str, start: int) -> int:
    """The last break at least `_SETTLED_BEFORE` characters from the end, else `start`.

    No finding reaches across a break, so what precedes it masks the same whatever follows.
    """
    window = text[start : max(start, len(text) - _SETTLED_BEFORE)]
    ends = [found.end() for found in _BREAK.finditer(window)]
    return start + ends[-1] - 1 if ends else start


def _held(text: str, *, word: bool, number: bool) -> int:
    """How many trailing characters `_OPEN_WORD` and `_OPEN_NUMBER` match.

    Searched from where such a match can begin, not from the start of the text: a word is
    inside the last run without white space, a number in the run of digits, spaces,
    brackets, dashes and `+` before it.
    """
    j = len(text)
    while j > 0 and not text[j - 1].isspace():
        j -= 1
    held = 0
    if word:
        found = _OPEN_WORD.search(text, j)
        held = len(found.group(0)) if found is not None else 0
    if number:
        i = j
        while i > 0 and text[i - 1] in _NUMBERISH:
            i -= 1
        found = _OPEN_NUMBER.search(text, i)
        held = max(held, len(found.group(0)) if found is not None else 0)
    return held


_NUMBERISH = frozenset("0123456789 ()-+")


class PiiRedaction(Plugin):
    """Mask (or block) personal data in tool results and answers.

    Args:
        kinds: What to look for, of `email`, `card`, `phone`.
        block: End the turn `guardrail-blocked` instead of masking.
        check_input: Also check the user's own message (off by default: people may
            share their own details with the agent).
    """

    name: ClassVar[str] = "pii-redaction"
    order: ClassVar[int] = -100  # guardrails first

    def __init__(
        self, *, kinds: Iterable[str] = KINDS, block: bool = False, check_input: bool = False
    ) -> None:
        self.kinds = tuple(kinds)
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}; choose from {list(KINDS)}")
        self.block = block
        self.check_user_input = check_input
        self._streaming = _Streaming()

    def _verdict(self, text: str, subject: str, *, block: str | None = None) -> Verdict | None:
        if block is None:
            masked, found = _mask(text, self.kinds)
        else:
            masked, found = self._streaming.mask(block, text, self.kinds)
        if not found:
            return None
        if self.block:
            return Verdict(action="block", kind="+".join(found), subject=subject)
        return Verdict(action="redact", kind="+".join(found), subject=subject, replacement=masked)

    async def check_input(self, ctx: PluginContext, text: str) -> Verdict | None:
        """The user's message, when `check_input=True`."""
        return self._verdict(text, "user message") if self.check_user_input else None

    async def check_tool_result(
        self, ctx: PluginContext, call: ToolCall, text: str
    ) -> Verdict | None:
        """A tool's result, before the model reads it."""
        return self._verdict(text, f"result of {call.name}")

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        """Assistant text: each chunk, then the whole block."""
        return self._verdict(text, "assistant text", block=f"{ctx.turn_id}")

    def answer_hold(self, text: str) -> int:
        """The trailing word (a possible email) or run of digits (a possible number)."""
        numbers = "phone" in self.kinds or "card" in self.kinds
        return _held(text, word="email" in self.kinds, number=numbers)
