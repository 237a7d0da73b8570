"""What every request of a turn derives from the session's history, worked out once.

A turn's requests all start with the same history (the sealed messages earlier turns
left), and a long session's history is thousands of messages. Each request needs a digest
per message, the pictures they carry and the hash of the shared prefix; walked message by
message, that costs a late turn more than an early one. `KnownHistory` keeps them for the
history, extended by each turn's own messages as the next turn starts, so a request pays
for the messages after the history only (and one identity check of the rest).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING

from turnkit.context.transcript import DerivedCache, TranscriptMessage, picture_parts, sent_bytes

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = ("KnownHistory", "digests_of", "joined_sha256", "message_digest")


def _digest(message: TranscriptMessage) -> str:
    return hashlib.sha256(sent_bytes(message)).hexdigest()[:32]


message_digest: DerivedCache[str] = DerivedCache("digest", _digest)
"""A digest of the bytes the model receives for a message.

Every request of a session digests every message it carries, so a long session's digests
are kept: on a sealed message, else by the message's values (see `DerivedCache`).
"""


class KnownHistory:
    """A session's history as its turn starts from it: the messages after the system message.

    Only sealed messages (which cannot change in place), so a list that holds these very
    objects after its system message sends their bytes, and what is kept for them holds.
    """

    __slots__ = ("messages", "digests", "pictures", "_hashed")

    def __init__(
        self,
        messages: tuple[TranscriptMessage, ...] = (),
        digests: tuple[str, ...] | None = None,
        pictures: int | None = None,
    ) -> None:
        self.messages = messages
        self.digests = digests if digests is not None else tuple(map(message_digest, messages))
        self.pictures = pictures if pictures is not None else sum(map(picture_parts, messages))
        self._hashed: tuple[str, _Hash] | None = None
        """A system message's digest, and the running hash of it and `digests`."""

    def extended(self, added: Sequence[TranscriptMessage]) -> KnownHistory:
        """This history with `added` (sealed) after it."""
        digests = tuple(map(message_digest, added))
        out = KnownHistory(
            self.messages + tuple(added),
            self.digests + digests,
            self.pictures + sum(map(picture_parts, added)),
        )
        if self._hashed is not None:
            first, hashed = self._hashed
            hashed = hashed.copy()
            hashed.update("".join(digests).encode())
            out._hashed = (first, hashed)
        return out

    def leads(self, transcript: Sequence[TranscriptMessage]) -> bool:
        """Whether `transcript` holds these very messages right after its first."""
        count = len(self.messages)
        if not count or len(transcript) <= count or transcript[1] is not self.messages[0]:
            return False
        return all(map(operator.is_, islice(transcript, 1, count + 1), self.messages))

    def hashed(self, first: str) -> _Hash:
        """The running hash of `first` and this history's digests (a copy to extend)."""
        if self._hashed is None or self._hashed[0] != first:
            hashed = hashlib.sha256(first.encode())
            hashed.update("".join(self.digests).encode())
            self._hashed = (first, hashed)
        return self._hashed[1].copy()


def digests_of(
    messages: Sequence[TranscriptMessage], known: KnownHistory | None = None
) -> tuple[str, ...]:
    """Each message's digest, in order (`known`: the history `messages` may start with)."""
    if known is not None and known.leads(messages):
        rest = islice(messages, len(known.messages) + 1, None)
        return (message_digest(messages[0]), *known.digests, *map(message_digest, rest))
    return tuple(map(message_digest, messages))


def joined_sha256(digests: Sequence[str], known: KnownHistory | None = None) -> str:
    """The hash of `digests` joined (`known`: the history whose digests they may start with)."""
    count = len(known.digests) if known is not None else 0
    if (
        known is not None
        and count
        and len(digests) > count
        and tuple(islice(digests, 1, count + 1)) == known.digests
    ):
        hashed = known.hashed(digests[0])
        hashed.update("".join(islice(digests, count + 1, None)).encode())
        return hashed.hexdigest()
    return hashlib.sha256("".join(digests).encode()).hexdigest()
