"""Log lines as JSON, one object a line, joined to their turn and trace.

`turnkit serve` and `turnkit worker` write them with `TURNKIT_LOG_FORMAT=json`; an app
that serves turnkit itself can put `JsonLogFormatter` on its own handler. A line written
while a turn runs names the turn and its session, and the span it was written in when
OpenTelemetry records spans, so a log backend can link it to the trace.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from turnkit.ids import SessionId, TurnId
from turnkit.otel import current_trace_ids

__all__ = ("JsonLogFormatter", "turn_logging")

_TURN: ContextVar[tuple[TurnId, SessionId] | None] = ContextVar("turnkit_log_turn", default=None)


def turn_logging(turn_id: TurnId, session_id: SessionId) -> None:
    """Name the turn in every line logged from the calling task on (and the tasks it starts).

    Called by a turn's driver in its own task; the mark goes with the task.
    """
    _TURN.set((turn_id, session_id))


class JsonLogFormatter(logging.Formatter):
    """A record as one line of JSON.

    Keys: `time` (UTC, RFC 3339), `level`, `logger`, `message`; `turn_id` and
    `session_id` when the line is about one turn; `trace_id` and `span_id` when the record
    names them (a line about a span that has ended: a turn's ending) or it was written
    inside a recorded span; `error` (`Type: message`) when it carries an
    exception, and with `tracebacks` its `traceback` too.
    """

    def __init__(self, *, tracebacks: bool = True) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (no newline inside: a traceback is escaped)."""
        moment = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        turn = _TURN.get()
        turn_id = getattr(record, "turn_id", None) or (turn[0] if turn else None)
        if turn_id is not None:
            line["turn_id"] = turn_id
            session_id = getattr(record, "session_id", None) or (turn[1] if turn else None)
            if session_id is not None:
                line["session_id"] = session_id
        named = getattr(record, "trace_id", None), getattr(record, "span_id", None)
        if named[0] is not None and named[1] is not None:  # a line about a span that ended
            line["trace_id"], line["span_id"] = named
        elif (ids := current_trace_ids()) is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line["error"] = f"{type(error).__name__}: {error}"
            if self.tracebacks:
                line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
