"""Sealed messages: the transcript earlier turns left, which no hook may change in place.

A long session's every request carries its whole history, and the prefix check digests
every message of it. A sealed message cannot change (each way of changing a dict or
list in place raises `TypeError`), so its digest and its `ModelMessage` are worked out
once and kept on it, and that stays sound: a hook can only build a new message
(`{**message, "content": …}`), which is checked by value like any other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn, cast

if TYPE_CHECKING:
    from turnkit.context.transcript import TranscriptMessage
    from turnkit.models import ModelMessage

__all__ = ("SealedMessage", "seal", "sealed", "sealed_types")


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        "a message of an earlier turn never changes in place; build a new one instead "
        "(`{**message, 'content': ...}`), so the change is seen and audited"
    )


class _SealedDict(dict[str, Any]):
    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles rebuild it whole
        return (type(self), (dict(self),))


class _SealedList(list[Any]):
    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self),))


class SealedMessage(_SealedDict):
    """A transcript message that never changes: what is derived from it is kept on it."""

    __slots__ = ("digest", "model")
    digest: str
    """Its digest, once the prefix check has worked it out."""
    model: ModelMessage
    """Its `ModelMessage`, once a request has carried it."""


_DICT_CHANGES = ("__setitem__", "__delitem__", "__ior__", "clear", "pop", "popitem", "setdefault")
_LIST_CHANGES = ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend")
for _name in (*_DICT_CHANGES, "update"):
    setattr(_SealedDict, _name, _refuse)
for _name in (*_LIST_CHANGES, "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(_SealedList, _name, _refuse)


sealed_types: tuple[type[dict[str, Any]], type[list[Any]]] = (_SealedDict, _SealedList)
"""The sealed containers (a message's nested dicts and lists), for exact type checks."""


def seal(message: TranscriptMessage) -> TranscriptMessage:
    """`message` as a sealed copy (a sealed message is returned as it is)."""
    if sealed(message) is not None:
        return message
    copy = SealedMessage(message)  # a session's whole history may be sealed at once: the
    for key, value in message.items():  # usual message holds only text, copied in C
        if isinstance(value, list | dict):
            dict.__setitem__(copy, key, _value(value))
    return cast("TranscriptMessage", copy)


def _value(value: object) -> object:
    if isinstance(value, list):
        return _SealedList(_value(v) for v in cast("Iterable[object]", value))
    if isinstance(value, dict):
        return _SealedDict({k: _value(v) for k, v in cast("dict[str, object]", value).items()})
    return value


def sealed(message: TranscriptMessage) -> SealedMessage | None:
    """`message` itself if it is sealed, else None."""
    found: object = message
    return found if type(found) is SealedMessage else None
