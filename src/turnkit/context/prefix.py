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
from typing import Literal, NotRequired, TypedDict

from turnkit.context._known import KnownHistory, digests_of, joined_sha256, message_digest
from turnkit.context.transcript import TranscriptMessage
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
    "compact",
    "expand",
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


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a request sent, as the prefix check sees it: a digest per message, in order."""

    messages: tuple[str, ...]
    tools_sha256: str

    @classmethod
    def of(
        cls,
        messages: Sequence[TranscriptMessage],
        tools_sha256: str,
        known: KnownHistory | None = None,
    ) -> RequestView:
        """The view of a request made of `messages` with tools hashed to `tools_sha256`.

        `known`: the session's history, which `messages` may start with (after the system
        message); its digests are not looked up again.
        """
        return cls(digests_of(messages, known), tools_sha256)


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
    known: KnownHistory | None = None,
) -> PrefixReport:
    """Compare `current` with `previous` and report the shared prefix.

    Args:
        previous: The session's previous reasoning request (None: the session's first).
        current: The request about to be sent.
        deliberate: A rewrite this request makes on purpose (audited, never refused).
        between_turns: `previous` belongs to an earlier turn, so the agent's instructions
            or tools may have changed since (recorded as `agent-changed`).
        known: The session's history `current` may start with (its hash is kept).

    Raises:
        PrefixRewriteError: An unexpected rewrite while `STRICT` is set.
    """
    shared = 0 if previous is None else _shared(previous.messages, current.messages)
    # One update over the joined digests hashes the same bytes as one update per digest.
    prefix_sha256 = joined_sha256(current.messages[:shared], known)
    report = PrefixReport(shared=shared, prefix_sha256=prefix_sha256)
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
    high = min(len(old), len(new))
    if old[:high] == new[:high]:  # the usual case: everything sent before is sent again
        return high
    low = 0  # old[:low] == new[:low], old[:high] != new[:high]
    while high - low > 1:  # halving by slices: a long session's lists are compared in C
        middle = (low + high) // 2
        if old[low:middle] == new[low:middle]:
            low = middle
        else:
            high = middle
    return low


def _broken_region(previous: RequestView, current: RequestView, shared: int) -> Region | None:
    if previous.tools_sha256 != current.tools_sha256:
        return "tools"
    if shared >= len(previous.messages):
        return None
    return "system" if shared == 0 else "history"


class PreviousRequest(TypedDict):
    """The session's previous reasoning request, as the prefix check needs it (JSON).

    In memory, `messages` holds a digest per message. Where it is stored (graph checkpoints,
    the Store) it is `compact`: the messages it shares with the transcript stored beside it
    are counted (`shares`), not listed, so what is written per checkpoint and per turn does
    not grow with the session; `expand` reads it back against that transcript.
    """

    messages: list[str]
    """A digest per message, in order (compact: those after the first `shares`)."""
    tools_sha256: str
    between_turns: bool
    """It was made by an earlier turn (the agent may have changed since)."""
    shares: NotRequired[int]
    """Compact: its first `shares` messages are the stored transcript's (the first, its
    system message, as `first` says: the agent may have changed it since)."""
    first: NotRequired[str]
    """Compact: the digest of its first message."""
    sha256: NotRequired[str]
    """Compact: the hash of all its digests joined, which `expand` checks."""


def view_of(previous: PreviousRequest | None) -> RequestView | None:
    """The prefix check's view of a previous request (as kept in memory: not compact)."""
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


def compact(
    previous: PreviousRequest, beside: Sequence[str], known: KnownHistory | None = None
) -> PreviousRequest:
    """`previous` as it is stored beside a transcript whose digests are `beside`.

    The messages it shares with that transcript are counted, not listed (see
    `PreviousRequest`). `known`: the history both may start with (its hash is kept).
    """
    digests = previous["messages"]
    if "shares" in previous or not digests or not beside:
        return previous
    # The first message is kept apart (`first`): an agent changed since sends another one.
    shares = 1 + _shared(tuple(digests[1:]), tuple(beside[1:]))
    if shares < 2:  # nothing worth leaving out
        return previous
    return {
        "messages": digests[shares:],
        "tools_sha256": previous["tools_sha256"],
        "between_turns": previous["between_turns"],
        "shares": shares,
        "first": digests[0],
        "sha256": joined_sha256(digests, known),
    }


def expand(
    previous: PreviousRequest, beside: Sequence[str], known: KnownHistory | None = None
) -> PreviousRequest:
    """A stored `previous` with every digest listed again.

    `beside`: the digests of the transcript it was stored beside. A transcript that no
    longer starts with what the request sent (a history rebuilt otherwise since) cannot
    fill in its messages; then only the first is known, and the prefix check sees a
    rewrite after it.
    """
    shares = previous.get("shares")
    if shares is None:
        return previous
    first, tail = previous.get("first", ""), previous["messages"]
    digests = [first, *beside[1:shares], *tail]
    if len(beside) < shares or joined_sha256(digests, known) != previous.get("sha256"):
        log.warning(
            "the previous request's first %d message(s) are not the stored transcript's: "
            "the prefix check compares with its first message only",
            shares,
        )
        digests = [first, *([""] * (shares - 1)), *tail]
    return {
        "messages": digests,
        "tools_sha256": previous["tools_sha256"],
        "between_turns": previous["between_turns"],
    }
