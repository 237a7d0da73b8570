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
from collections.abc import Iterable
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
_OPEN_WORD = re.compile(r"(?<![\w.+@-])[\w.+@-]+$")
"""A word still streaming: it may yet become an email address."""
_OPEN_NUMBER = re.compile(r"(?<![\d+(])\(?(?:\+?\d[\d ()-]*\S*)?$")
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

    def _verdict(self, text: str, subject: str) -> Verdict | None:
        masked, found = _mask(text, self.kinds)
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
        return self._verdict(text, "assistant text")

    def answer_hold(self, text: str) -> int:
        """The trailing word (a possible email) or run of digits (a possible number)."""
        patterns = []
        if "email" in self.kinds:
            patterns.append(_OPEN_WORD)
        if "phone" in self.kinds or "card" in self.kinds:
            patterns.append(_OPEN_NUMBER)
        found = (p.search(text) for p in patterns)
        return max((len(m.group(0)) for m in found if m), default=0)
