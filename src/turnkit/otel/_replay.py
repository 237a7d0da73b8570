"""The replay buffer's lag: how old an event is when a live reader gets it from the buffer."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final

from turnkit.otel._state import active

__all__ = ("record_replay_lag",)

_TS: Final = re.compile(rb'"ts":"([^"]{10,40})"')


def record_replay_lag(data: bytes, now: datetime) -> None:
    """Record `now` minus the event's own `ts` (no-op without a meter provider).

    Called once per batch a reader takes from the buffer, with the batch's newest event, so
    the cost stays off the per-chunk path.
    """
    found = active()
    if found is None:
        return
    match = _TS.search(data)
    if match is None:
        return
    try:
        ts = datetime.fromisoformat(match.group(1).decode())
    except ValueError:
        return
    found.replay_lag.record(max(0.0, (now - ts).total_seconds()))
