"""`HeldTranscripts`: each recent session's transcript, held so its next turn reads only news.

A turn's starting transcript is every earlier turn's kept part, in order. Read whole from
the Store, that costs a long session more on every turn. So the runtime holds what the
last turn it started was given, and the next turn asks the Store only for the turns after
it (`Store.kept_transcript(after=...)`). The Store decides whether what is held still
holds: a session deleted and begun again gets its whole kept history instead, and one
whose history a later turn replaced (compaction) gets it from that turn on.

Held messages are sealed (`turnkit.context._sealed`): they cannot change in place, so
every turn's list shares them, and so does what is derived from each (its digest, its
`ModelMessage`). The hold is bounded by an estimate of the memory it takes, least
recently used sessions going first: each string at its own size (`sys.getsizeof`: text
outside Latin-1 takes two or four bytes a character), a picture's base64 data and the
bytes its `ModelMessage` decodes, and what a message keeps beside its strings (its dict,
its `ModelMessage`, its digest, the keys decoded with it), measured with
`benchmarks/held_size.py`.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from turnkit.context._known import KnownHistory
from turnkit.context.transcript import TranscriptMessage
from turnkit.ids import SessionId, TurnId

__all__ = ("DEFAULT_HELD_BYTES", "Held", "HeldTranscripts", "size_of")

DEFAULT_HELD_BYTES: Final = 64 * 2**20
"""About how much memory one runtime's held transcripts take (`held_transcript_bytes`)."""
_MESSAGE_OVERHEAD: Final = 550
"""What a held message keeps beside its strings: the sealed dict, the keys decoded with
it, its `ModelMessage`, its digest and its places in the history's tuples (measured)."""
_CALL_OVERHEAD: Final = 380
"""What a tool call keeps beside its strings: its sealed list and dict, its `ToolCallPart`."""
_PART_OVERHEAD: Final = 250
"""What a part of a message with pictures keeps beside its strings."""


def size_of(messages: Iterable[TranscriptMessage]) -> int:
    """About how many bytes `messages` hold, held (within a quarter of what they take)."""
    sized = sys.getsizeof  # it runs on every message a turn adds, and on a history read whole
    size = 0
    count = 0
    for message in messages:
        count += 1
        content = message["content"]
        if isinstance(content, str):
            size += sized(content)
        else:
            for part in content:
                size += _PART_OVERHEAD + sum(sized(value) for value in part.values())
                if data := part.get("data"):  # base64: its `ModelMessage` holds the bytes
                    size += len(data) * 3 // 4
        if len(message) > 2:  # beyond its role and content
            for call in message.get("tool_calls", ()):
                size += _CALL_OVERHEAD + sized(call["arguments"]) + sized(call["id"])
            if (answers := message.get("tool_call_id")) is not None:
                size += sized(answers)
    return size + count * _MESSAGE_OVERHEAD


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """A session's transcript through one turn, without its system message."""

    through: TurnId
    """The newest turn the messages include."""
    input_seq: int
    known: KnownHistory
    """The messages, with what each request derives from them (their digests)."""
    last_request: dict[str, JsonValue] | None
    """The newest last request the Store kept up to `through`."""
    size: int
    """About how many bytes the messages hold (`size_of`)."""
    guarded: bool = False
    """Built with input guardrails in play (turns with no stored transcript withheld)."""


class HeldTranscripts:
    """Recent sessions' transcripts, least recently used dropped past `max_bytes`."""

    def __init__(self, *, max_bytes: int = DEFAULT_HELD_BYTES) -> None:
        self.max_bytes = max_bytes
        self._held: OrderedDict[SessionId, Held] = OrderedDict()
        self._size = 0

    @property
    def size(self) -> int:
        """About how many bytes are held."""
        return self._size

    def get(self, session_id: SessionId) -> Held | None:
        """What is held for `session_id` (None: nothing)."""
        held = self._held.get(session_id)
        if held is not None:
            self._held.move_to_end(session_id)
        return held

    def hold(self, session_id: SessionId, held: Held) -> None:
        """Hold `held` for the session in place of what was held."""
        self.forget(session_id)
        if held.size > self.max_bytes:
            return
        self._held[session_id] = held
        self._size += held.size
        while self._size > self.max_bytes:
            _, dropped = self._held.popitem(last=False)
            self._size -= dropped.size

    def forget(self, session_id: SessionId) -> None:
        """Drop what is held for the session."""
        dropped = self._held.pop(session_id, None)
        if dropped is not None:
            self._size -= dropped.size
