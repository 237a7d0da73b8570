"""Typed identifiers and the helpers that mint or derive them."""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Final, Literal, NewType

__all__ = (
    "SESSION_ID_PATTERN",
    "TURN_ID_PREFIX",
    "AuditStageId",
    "RequestId",
    "SessionId",
    "StageId",
    "ToolCallId",
    "TurnId",
    "derive_id",
    "event_stage",
    "is_valid_session_id",
    "new_turn_id",
    "uuid7",
)

SessionId = NewType("SessionId", str)
TurnId = NewType("TurnId", str)
ToolCallId = NewType("ToolCallId", str)
RequestId = NewType("RequestId", str)

StageId = Literal["runtime", "anchor-plan", "tool-loop", "synthesize", "post-turn"]
"""Who produced an event: one of the four stages, or the runtime around them."""

AuditStageId = Literal[
    "runtime", "anchor-plan", "tool-loop", "synthesize", "post-turn", "thread-naming"
]
"""Who made an audited call: a stage, the runtime, or `thread-naming` (the call that names
a session after its opening turn has ended; it writes no events)."""


def event_stage(stage_id: AuditStageId) -> StageId:
    """The stage an event of `stage_id`'s work names (naming's are the runtime's)."""
    return "runtime" if stage_id == "thread-naming" else stage_id


SESSION_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
"""1-128 characters: letters, digits and `_ . : -`, starting with a letter or digit."""


def is_valid_session_id(value: str) -> bool:
    """Whether `value` has the session id format (see `SESSION_ID_PATTERN`)."""
    return SESSION_ID_PATTERN.fullmatch(value) is not None


def uuid7() -> str:
    """A time-ordered UUIDv7 string (RFC 9562), so ids sort by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


TURN_ID_PREFIX = "turn_"
"""How every turn id begins (and so every checkpoint thread of turnkit's)."""


def new_turn_id() -> TurnId:
    """Mint a fresh turn id (`turn_<uuid7>`)."""
    return TurnId(f"{TURN_ID_PREFIX}{uuid7()}")


def derive_id(prefix: str, *parts: str | int) -> str:
    """Derive a stable id from the log position it stands for.

    The same parts always give the same id, so a retried attempt that derives an id
    for the same position commits nothing twice (a block's or a call's id is the same on
    every attempt).
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=10).hexdigest()
    return f"{prefix}_{digest}"
