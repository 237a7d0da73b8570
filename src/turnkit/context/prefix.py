"""The prefix rule: a model request adds messages and never rewrites what an earlier one sent.

Every request of a session's reasoning model is compared with the one before it (across
turns too). The shared prefix is what the provider's prompt cache can match. Two
rewrites are deliberate and audited as such: compaction (history replaced by a summary)
and picture release. A change of the agent's instructions or tools between turns breaks
the prefix too; that is the app's choice and is recorded, not refused. Any other rewrite
is a bug in a hook: it fails the turn when `STRICT` is set (tests), and is logged and
audited otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from turnkit.context.transcript import DerivedCache, TranscriptMessage, sent_bytes
from turnkit.errors import PrefixRewriteError
from turnkit.models import ToolSpec

__all__ = (
    "STRICT",
    "BreakReason",
    "PrefixReport",
    "PreviousRequest",
    "Region",
    "RequestView",
    "check_prefix",
    "message_digest",
    "stored",
    "tools_digest",
    "view_of",
)

log = logging.getLogger("turnkit.context")

STRICT = False
"""Raise `PrefixRewriteError` on an unexpected rewrite (turnkit's own tests set this)."""

Region = Literal["system", "tools", "history", "pictures"]
BreakReason = Literal["compaction", "picture-release", "agent-changed", "unexpected-rewrite"]


def tools_digest(tools: Sequence[ToolSpec]) -> str:
    """A hash of the tools as offered (names, descriptions, schemas, in order)."""
    data = [[t.name, t.description, t.parameters] for t in tools]
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()


def _digest(message: TranscriptMessage) -> str:
    return hashlib.sha256(sent_bytes(message)).hexdigest()[:32]


message_digest: DerivedCache[str] = DerivedCache("digest", _digest)
"""A digest of the bytes the model receives for a message.

Every request of a session digests every message it carries, so a long session's digests
are kept: on a sealed message, else by the message's values (see `DerivedCache`).
"""


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a request sent, as the prefix check sees it: a digest per message, in order."""

    messages: tuple[str, ...]
    tools_sha256: str

    @classmethod
    def of(cls, messages: Sequence[TranscriptMessage], tools_sha256: str) -> RequestView:
        """The view of a request made of `messages` with tools hashed to `tools_sha256`."""
        return cls(tuple([message_digest(m) for m in messages]), tools_sha256)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixReport:
    """How a request relates to the one before it."""

    shared: int
    """Leading messages that repeat the previous request's messages byte for byte."""
    prefix_sha256: str
    """Hash of the shared messages (empty prefix: the hash of nothing)."""
    broken: Region | None = None
    """Where the prefix broke, if it did."""
    reason: BreakReason | None = None


def check_prefix(
    previous: RequestView | None,
    current: RequestView,
    *,
    deliberate: Literal["compaction", "picture-release"] | None = None,
    between_turns: bool = False,
) -> PrefixReport:
    """Compare `current` with `previous` and report the shared prefix.

    Args:
        previous: The session's previous reasoning request (None: the session's first).
        current: The request about to be sent.
        deliberate: A rewrite this request makes on purpose (audited, never refused).
        between_turns: `previous` belongs to an earlier turn, so the agent's instructions
            or tools may have changed since (recorded as `agent-changed`).

    Raises:
        PrefixRewriteError: An unexpected rewrite while `STRICT` is set.
    """
    shared = 0 if previous is None else _shared(previous.messages, current.messages)
    # One update over the joined digests hashes the same bytes as one update per digest.
    joined = "".join(current.messages[:shared]).encode()
    report = PrefixReport(shared=shared, prefix_sha256=hashlib.sha256(joined).hexdigest())
    if previous is None:
        return report
    region = _broken_region(previous, current, shared)
    if region is None:
        return PrefixReport(shared=shared, prefix_sha256=report.prefix_sha256)
    reason: BreakReason
    if deliberate is not None:
        reason = deliberate
        region = "pictures" if deliberate == "picture-release" else region
    elif between_turns and region in ("system", "tools"):
        reason = "agent-changed"
    else:
        reason = "unexpected-rewrite"
        message = (
            f"a model request rewrote the {region} region of the prompt after {shared} shared "
            "message(s): a message-list hook may only append (compaction and picture "
            "release are the only exceptions)"
        )
        if STRICT:
            raise PrefixRewriteError(message, region=region, shared=shared)
        log.error(message)
    return PrefixReport(
        shared=shared, prefix_sha256=report.prefix_sha256, broken=region, reason=reason
    )


def _shared(old: tuple[str, ...], new: tuple[str, ...]) -> int:
    """How many leading digests `old` and `new` share."""
    if new[: len(old)] == old:  # the usual case: everything sent before is sent again
        return min(len(old), len(new))
    shared = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def _broken_region(previous: RequestView, current: RequestView, shared: int) -> Region | None:
    if previous.tools_sha256 != current.tools_sha256:
        return "tools"
    if shared >= len(previous.messages):
        return None
    return "system" if shared == 0 else "history"


class PreviousRequest(TypedDict):
    """The session's previous reasoning request, as the prefix check needs it (JSON)."""

    messages: list[str]
    """A digest per message, in order."""
    tools_sha256: str
    between_turns: bool
    """It was made by an earlier turn (the agent may have changed since)."""


def view_of(previous: PreviousRequest | None) -> RequestView | None:
    """The prefix check's view of a stored previous request."""
    if previous is None:
        return None
    return RequestView(tuple(previous["messages"]), previous["tools_sha256"])


def stored(view: RequestView, *, between_turns: bool = False) -> PreviousRequest:
    """A request view as JSON for the graph state and the Store."""
    return {
        "messages": list(view.messages),
        "tools_sha256": view.tools_sha256,
        "between_turns": between_turns,
    }
