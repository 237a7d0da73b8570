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

import json
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from pydantic import JsonValue

from turnkit.errors import ConfigurationError
from turnkit.plugins import Plugin, PluginContext, ToolCall, Verdict

__all__ = ("PiiRedaction",)

# Each pattern tries once per run of the characters it is made of (the lookbehinds), so a
# long run that is no finding (`a.a.a.a…`, a hex dump) costs its length, not its square.
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_SPACES = " \u00a0\u2007\u2009\u202f"
"""The spaces a number is written with: plain, no-break, figure, thin, narrow no-break."""
_DASHES = "\u2010\u2011\u2012\u2013"
"""Dashes a number is written with besides `-`: hyphen, no-break hyphen, figure, en dash."""
_NUMBER = re.compile(
    rf"(?<![\w./{_DASHES}-])(?:\([{_SPACES}]?)?\+?\(?\d(?:[{_SPACES}(){_DASHES}-]{{0,3}}\d)*"
)
"""A run of digits with at most three spaces, dashes or brackets between each, after an
optional `+` or `(`: a phone or card number, several side by side (a table's columns), or
a number that is neither."""
_DATE = re.compile(r"(\d{4}-\d\d-\d\d)(?!\d)")
"""An ISO date inside a run: never a phone number, nor part of one."""
KINDS = ("email", "card", "phone")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch)  # a decimal digit of any script
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _mask(text: str, kinds: Iterable[str]) -> tuple[str, list[str]]:
    wanted = tuple(kinds)
    found: set[str] = set()
    if "email" in wanted:
        text, n = _EMAIL.subn("[email]", text)
        if n:
            found.add("email")
    if "card" in wanted or "phone" in wanted:

        def number(match: re.Match[str]) -> str:
            return "".join(
                _masked_number(part, wanted, found) if index % 2 == 0 else part
                for index, part in enumerate(_DATE.split(match.group(0)))
            )

        text = _NUMBER.sub(number, text)
    return text, [kind for kind in wanted if kind in found]


def _masked_number(run: str, kinds: tuple[str, ...], found: set[str]) -> str:
    """A run of digits as masked: fail closed, the whole run or nothing.

    A run holding a card (13 to 19 digits of whole groups that pass the Luhn checksum)
    is a card; any other run of 9 digits or more is a phone number (or several, or a
    longer number: all of it goes).
    """
    groups = re.findall(r"\d+", run)
    if "card" in kinds and _holds_card(groups):
        found.add("card")
        return _keep_edges(run, "[card]")
    if "phone" in kinds and sum(map(len, groups)) >= 9:
        found.add("phone")
        return _keep_edges(run, "[phone]")
    return run


def _holds_card(groups: list[str]) -> bool:
    """Whether consecutive digit groups make 13 to 19 digits passing the Luhn checksum.

    Only groups of four digits or more: a card is written `4111 1111 …`, `3782 822463
    10005` or in one piece.
    """
    for first in range(len(groups)):
        digits = ""
        for group in groups[first:]:
            digits += group
            if len(group) < 4 or len(digits) > 19:
                break
            if len(digits) >= 13 and _luhn(digits):
                return True
    return False


def _keep_edges(run: str, mask: str) -> str:
    """`mask` in place of the number, the white space around it kept.

    A run split around a date leaves some at its pieces' ends.
    """
    stripped = run.strip()
    start = run.index(stripped) if stripped else 0
    return run[:start] + mask + run[start + len(stripped) :]


_SETTLED_BEFORE = 64
"""Characters from the end of text already checked that may still join a finding: more
than the longest phone or card number with its separators."""
_BREAK = re.compile(rf"[^\w.+@()\s{_DASHES}-]|[^\S{_SPACES}]|(?<=[^\d()+\s{_DASHES}-])\s")
"""A character no finding is made of (`,` `;` `/` `。`, a line break or a tab), or white
space after a character no number goes on through: no finding reaches across either."""
_LAST_BREAK = re.compile(rf"(?s:.*)({_BREAK.pattern})")
"""The last `_BREAK` in a text: found from the end, not by listing every one."""


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
        if last is None or not _agrees(text, last):
            last = _Checked(text="", settled=0, masked="", found=[])
        # Masked in two pieces split at a break: the same as masking them together.
        settled = _settled_end(text, last.settled)
        head, head_found = _mask(text[last.settled : settled], kinds)
        rest, rest_found = _mask(text[settled:], kinds)
        checked = _Checked(
            text, settled, last.masked + head, _ordered(kinds, last.found, head_found)
        )
        self._blocks[key] = checked
        while len(self._blocks) > self._limit:
            self._blocks.popitem(last=False)
        return checked.masked + rest, _ordered(kinds, checked.found, rest_found)


def _ordered(kinds: tuple[str, ...], *found: list[str]) -> list[str]:
    """The kinds found in any of `found`, in `kinds`' order (as `_mask` lists them)."""
    return [kind for kind in kinds if any(kind in each for each in found)]


def _settled_end(text: str, start: int) -> int:
    """The last break at least `_SETTLED_BEFORE` characters from the end, else `start`.

    No finding reaches across a break, so what precedes it masks the same whatever follows.
    """
    window = text[start : max(start, len(text) - _SETTLED_BEFORE)]
    found = _LAST_BREAK.match(window)
    return start + found.start(1) if found else start


def _agrees(text: str, last: _Checked) -> bool:
    """Whether `text` holds `last`'s settled part unchanged.

    It goes on from `last.text`, or is shorter (the runtime held back more of the end
    this time) but not shorter than that part.
    """
    if len(text) >= len(last.text):
        return text.startswith(last.text)
    return len(text) >= last.settled and last.text.startswith(text)


def _held(text: str, *, numbers: bool) -> int:
    """How many trailing characters may still become (part of) a finding.

    The last word (letters, digits and `_ . + @ ( ) -`: an address or a number in the
    making) and, with `numbers`, the run of digits, spaces, brackets and dashes before it
    when that run has a digit (or a `(` or `+` that may open one), the digits that end a
    word left out; again, while a word and a number run join. Counted back from the end:
    a check per chunk costs the length of the text's last word and number, not of the text.
    """
    cut = len(text)
    while True:  # a word and a number may join (`a@b.com.０９０`): until neither grows
        before = cut
        while cut > 0 and (text[cut - 1].isalnum() or text[cut - 1] in _WORDISH):
            cut -= 1
        if numbers:
            i = cut
            while i > 0 and (text[i - 1].isdecimal() or text[i - 1] in _NUMBERISH):
                i -= 1
            if 0 < i < cut and text[i - 1].isalpha():  # digits that end a word (`e4`,
                while i < cut and text[i].isdecimal():  # `A10`) start no number
                    i += 1
            run = text[i:cut]
            if any(ch.isdecimal() for ch in run):
                cut = i
            elif "(" in run or "+" in run:
                cut = i + min(run.index(ch) for ch in "(+" if ch in run)
        if cut == before:
            return len(text) - cut


_WORDISH = frozenset("_.+@()-")
_NUMBERISH = frozenset(f"{_SPACES}{_DASHES}()+-")


def _mask_json(value: object, kinds: tuple[str, ...], found: list[str]) -> object:
    """`value` with every string masked, keys too (two keys masked alike both stay)."""
    if isinstance(value, str):
        masked, kinds_found = _mask(value, kinds)
        found.extend(k for k in kinds_found if k not in found)
        return masked
    if isinstance(value, list):
        return [_mask_json(item, kinds, found) for item in value]
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, item in value.items():
            name = str(_mask_json(key, kinds, found))
            while name in out:  # `{"a@x.com": 1, "b@y.com": 2}`: keep both
                name += "'"
            out[name] = _mask_json(item, kinds, found)
        return out
    return value


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
        if isinstance(kinds, str):  # one kind: a string would be taken letter by letter
            raise ConfigurationError(f"`kinds` is a list of kinds, such as [{kinds!r}]")
        self.kinds = tuple(kinds)
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ConfigurationError(f"unknown kinds {sorted(unknown)}; choose from {list(KINDS)}")
        for name, value in (("block", block), ("check_input", check_input)):
            if not isinstance(value, bool):
                raise ConfigurationError(f"`{name}` is True or False, not {value!r}")
        self.block = block
        self.check_user_input = check_input
        self._streaming = _Streaming()

    def settings(self) -> dict[str, JsonValue]:
        """The settings that differ from the defaults (they count in the agent's version)."""
        changed: dict[str, JsonValue] = {}
        if set(self.kinds) != set(KINDS):
            changed["kinds"] = [*sorted(set(self.kinds))]  # any order: one version
        if self.block:
            changed["block"] = True
        if self.check_user_input:
            changed["check_input"] = True
        return changed

    def _verdict(self, text: str, subject: str, *, block: str | None = None) -> Verdict | None:
        if block is None:
            masked, found = _mask(text, self.kinds)
        else:
            masked, found = self._streaming.mask(block, text, self.kinds)
        return self._decided(masked, found, subject)

    def _decided(self, masked: str, found: list[str], subject: str) -> Verdict | None:
        """Block or redact what was `found` (kinds, in `self.kinds`' order); None if nothing."""
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
        """A tool's result, before the model reads it.

        A structured result (JSON text) is masked string by string, keys included, so an
        escaped line break before a number hides nothing and the result stays JSON.
        """
        subject = f"result of {call.name}"
        try:
            value = json.loads(text)
        except ValueError:
            return self._verdict(text, subject)
        if not isinstance(value, dict | list):
            return self._verdict(text, subject)
        found: list[str] = []
        masked = _mask_json(value, self.kinds, found)
        if not found:  # nothing to write back
            return None
        replacement = json.dumps(masked, ensure_ascii=False)
        return self._decided(replacement, [k for k in self.kinds if k in found], subject)

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        """Assistant text: each chunk, then the whole block."""
        return self._verdict(text, "assistant text", block=f"{ctx.turn_id}")

    def answer_hold(self, text: str) -> int:
        """The trailing word (a possible email) or run of digits (a possible number)."""
        return _held(text, numbers="phone" in self.kinds or "card" in self.kinds)
