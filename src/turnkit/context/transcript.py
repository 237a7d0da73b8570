"""The model-facing transcript as plain JSON: what checkpoints and the Store keep.

A turn's messages are kept exactly as they were sent, so the next request can start with
the same bytes (the provider's prompt cache matches on that prefix).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final, Generic, Literal, NotRequired, TypedDict, TypeVar, cast

from pydantic import TypeAdapter

from turnkit.blocks import ContentPart
from turnkit.context._sealed import sealed, sealed_types
from turnkit.models import Content, ModelMessage, ToolCallPart

__all__ = (
    "DerivedCache",
    "PRIVATE_KEYS",
    "MessageKey",
    "PartJson",
    "TranscriptMessage",
    "TranscriptToolCall",
    "content_json",
    "current_opening",
    "from_transcript",
    "message_key",
    "picture_parts",
    "sent_bytes",
    "to_transcript",
)

_T = TypeVar("_T")

PartJson = dict[str, str]
"""A content part as JSON: `{"kind": "text", "text": …}` or `{"kind": "image", …}`."""

_PART: TypeAdapter[ContentPart] = TypeAdapter(ContentPart)


class TranscriptToolCall(TypedDict):
    """A tool call inside an assistant message, as plain JSON."""

    id: str
    name: str
    arguments: str


class TranscriptMessage(TypedDict):
    """A model message as plain JSON, so checkpoints need no custom serializer."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[PartJson]
    tool_calls: NotRequired[list[TranscriptToolCall]]
    tool_call_id: NotRequired[str]
    input_seq: NotRequired[int]
    """Set on a user message: the input it came from (never sent to the model)."""
    opens_turn: NotRequired[bool]
    """Set on the user message that opened a turn (never sent to the model)."""
    standing: NotRequired[bool]
    """Set on a note the turn works by (its plan, a skill): compaction keeps it (never sent)."""


PRIVATE_KEYS = frozenset({"input_seq", "opens_turn", "standing"})
"""Transcript keys turnkit keeps for itself; they never reach the model."""


def content_json(content: Content) -> str | list[PartJson]:
    """Message content as JSON (text stays a plain string)."""
    if isinstance(content, str):
        return content
    return [
        {k: str(v) for k, v in part.model_dump(mode="json", exclude_none=True).items()}
        for part in content
    ]


def _content(value: str | list[PartJson]) -> Content:
    if isinstance(value, str):
        return value
    return tuple(_PART.validate_python(part) for part in value)


def to_transcript(message: ModelMessage) -> TranscriptMessage:
    """A `ModelMessage` as plain JSON."""
    out: TranscriptMessage = {"role": message.role, "content": content_json(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.tool_call_id, "name": c.name, "arguments": c.arguments}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def from_transcript(messages: list[TranscriptMessage]) -> tuple[ModelMessage, ...]:
    """Plain JSON back into `ModelMessage`s.

    `ModelMessage`s are immutable, so one is kept per message value and shared by every
    request that carries it: a long session's requests stop rebuilding (and the garbage
    collector stops tracing) thousands of new objects per call.
    """
    return tuple([_model_message(m) for m in messages])


class DerivedCache(Generic[_T]):
    """Something worked out from a message, kept so it is worked out once.

    On a sealed message (earlier turns' history, which cannot change) it is kept on the
    message itself (`attr`, one of `SealedMessage`'s slots); on any other message it is
    kept by the message's values in a bounded dict (never by identity: a hook that
    rewrote a message in place must still get a fresh one).

    `shared`: a sealed message takes what an equal message left by value, if any. Off for
    what holds the message's text (its `ModelMessage`): a sealed message is decoded from
    the Store, so an equal one's would keep a second copy of the text for as long as the
    session is held; built from the sealed message, it holds the same strings.
    """

    def __init__(
        self, attr: str, build: Callable[[TranscriptMessage], _T], *, shared: bool = True
    ) -> None:
        self.attr = attr
        self.build = build
        self.shared = shared
        self.by_value: dict[MessageKey, _T] = {}
        self._chars = 0
        """The characters the kept keys hold (`_key_chars`)."""

    def __call__(self, message: TranscriptMessage) -> _T:
        """What `build` gives for `message`."""
        kept = sealed(message)
        if kept is None:
            return self._by_value(message)
        try:
            return cast(_T, getattr(kept, self.attr))
        except AttributeError:
            found = self._by_value(message) if self.shared else self.build(message)
            setattr(kept, self.attr, found)
            return found

    def _by_value(self, message: TranscriptMessage) -> _T:
        key = message_key(message)
        if key is None:
            return self.build(message)
        found = self.by_value.get(key)
        if found is None:
            found = self.build(message)
            chars = _key_chars(key)
            if len(self.by_value) >= _CACHE_SIZE or self._chars + chars > _CACHE_CHARS:
                self.by_value.clear()
                self._chars = 0
            self.by_value[key] = found
            self._chars += chars
        return found


def _key_chars(key: MessageKey) -> int:
    """About what a key keeps alive: its content and its calls' arguments."""
    return len(key[1]) + sum(len(arguments) for _, _, arguments in key[3] or ())


def _build(message: TranscriptMessage) -> ModelMessage:
    return ModelMessage(
        role=message["role"],
        content=_content(message["content"]),
        tool_calls=tuple(
            ToolCallPart(tool_call_id=c["id"], name=c["name"], arguments=c["arguments"])
            for c in message.get("tool_calls", [])
        ),
        tool_call_id=message.get("tool_call_id"),
    )


_model_message: DerivedCache[ModelMessage] = DerivedCache("model", _build, shared=False)


MessageKey = tuple[str, str, object, tuple[tuple[str, str, str], ...] | None]
"""What `message_key` returns: role, content, tool call id (or absent), tool calls."""

_CACHE_SIZE: Final = 16_384
_CACHE_CHARS: Final = 8 * 2**20
"""The most characters a `DerivedCache` keeps by value. What it keeps outlives the turns
that made it (their messages are sealed history from then on), so a bound by count alone
would keep thousands of long tool results and pasted documents of ended turns."""


def message_key(message: TranscriptMessage) -> MessageKey | None:
    """The values `sent_bytes` encodes, as a key (None: a shape no cache keeps).

    Two messages with equal keys are sent as the same bytes. Every request of a long
    session looks up every message it carries (its digest, its `ModelMessage`), so this
    is kept lean: exact types only (`type(x) is str`: a subclass may compare equal to another
    value that encodes differently), and a count of the known keys instead of a key set.
    """
    content: object = message.get("content")
    role: object = message.get("role")
    if type(content) is not str or type(role) is not str:
        return None
    known = 2
    call_id: object = message.get("tool_call_id", _ABSENT)
    if call_id is not _ABSENT:
        if type(call_id) is not str:
            return None
        known += 1
    calls: tuple[tuple[str, str, str], ...] | None = None
    raw: object = message.get("tool_calls", _ABSENT)
    if raw is not _ABSENT:
        calls = _calls_key(raw)
        if calls is None:
            return None
        known += 1
    known += ("input_seq" in message) + ("opens_turn" in message)  # never sent
    if len(message) != known:  # a key `sent_bytes` would encode that the key leaves out
        return None
    return (role, content, call_id, calls)


def _calls_key(raw: object) -> tuple[tuple[str, str, str], ...] | None:
    if not isinstance(raw, list) or type(raw) not in _LISTS:  # exact types, as above
        return None
    found: list[tuple[str, str, str]] = []
    for call in cast("list[object]", raw):
        if not isinstance(call, dict) or type(call) not in _DICTS or len(call) != 3:
            return None
        values = cast("dict[str, object]", call)
        id_, name, arguments = values.get("id"), values.get("name"), values.get("arguments")
        if type(id_) is not str or type(name) is not str or type(arguments) is not str:
            return None
        found.append((id_, name, arguments))
    return tuple(found)


_ABSENT: Final = object()
_LISTS: Final = frozenset({list, sealed_types[1]})
_DICTS: Final = frozenset({dict, sealed_types[0]})


def sent_bytes(message: TranscriptMessage) -> bytes:
    """The bytes of a message as the model receives it (turnkit's own keys left out)."""
    public = {k: v for k, v in message.items() if k not in PRIVATE_KEYS}
    return json.dumps(public, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def current_opening(transcript: list[TranscriptMessage]) -> int:
    """The index of the current turn's opening message (the list's length if none)."""
    return max(
        (i for i, m in enumerate(transcript) if m.get("opens_turn")), default=len(transcript)
    )


def picture_parts(message: TranscriptMessage) -> int:
    """How many pictures the message carries."""
    content = message["content"]
    return 0 if isinstance(content, str) else sum(1 for p in content if p.get("kind") == "image")
