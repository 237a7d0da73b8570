"""The values the command line's flags take (argparse `type=` functions): one line each when bad."""

from __future__ import annotations

import argparse
import json
import re
from datetime import timedelta

from pydantic import JsonValue

__all__ = (
    "a_second_or_more",
    "at_least_one",
    "duration",
    "json_object",
    "port",
    "positive_seconds",
    "seconds",
)


_MOST_SECONDS = 100 * 365.25 * 86_400
"""A century: a longer span reaches back before the year 1 from now."""

_MOST_COUNT = 2**31 - 1
"""The largest count a flag takes: a database's integer column holds it."""


def seconds(value: str) -> float:
    """A number of seconds, 0 or more (at most a century), for argparse."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (0 or more)")
    if number > _MOST_SECONDS:
        raise argparse.ArgumentTypeError(f"{value!r} is more seconds than a century holds")
    return number


def positive_seconds(value: str) -> float:
    """A number of seconds above 0, for argparse."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds above 0")
    return seconds(value)  # at most a century


def a_second_or_more(value: str) -> float:
    """A number of seconds of 1 or more (a lease or idle window: less ends every turn)."""
    number = positive_seconds(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is below 1 s: every turn would end at once")
    return number


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def duration(value: str) -> timedelta:
    """A duration such as `90d`, `12h` or `1d12h` (s, m, h, d, w), above 0, for argparse.

    A bare number is refused: seconds, as the other flags read it, would make
    `--idle-for 90` delete nearly every session.
    """
    text = value.strip().lower()
    if text.startswith("-") and _DURATION.fullmatch(text[1:]):
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration above 0")
    parts = _DURATION.findall(text)
    if not text or "".join(n + unit for n, unit in parts) != text:
        hint = f": write {text}d for days" if _DURATION.fullmatch(text + "d") else ""
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration such as 90d, 12h or 30m (units: s, m, h, d, w){hint}"
        )
    total = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in parts)
    if not 0 < total < timedelta.max.total_seconds():
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration above 0")
    return timedelta(seconds=total)


def at_least_one(value: str) -> int:
    """A whole number of 1 or more (at most 2,147,483,647), for argparse."""
    if not value.strip().isascii() or not value.strip().isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of 1 or more")
    if int(value) > _MOST_COUNT:
        raise argparse.ArgumentTypeError(f"{value!r} is larger than {_MOST_COUNT:,}")
    return int(value)


def port(value: str) -> int:
    """A TCP port number, for argparse."""
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (0-65535)")
    return int(value)


def json_object(value: str) -> dict[str, JsonValue]:
    """A JSON object (a tool call's arguments), for argparse."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"{value!r} is not a JSON object ({{...}})")
    return parsed
