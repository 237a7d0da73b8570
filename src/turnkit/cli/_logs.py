"""What `turnkit serve` and `turnkit worker` log, and how: text lines or JSON lines.

`TURNKIT_LOG_FORMAT=json` writes every line, uvicorn's too, as one JSON object
(`turnkit.runtime.logs.JsonLogFormatter`); `text` (the default) as
`time LEVEL logger: message`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Final, TextIO, cast

from turnkit.errors import ConfigurationError
from turnkit.runtime.logs import JsonLogFormatter

__all__ = (
    "LOG_FORMATS",
    "announce",
    "info_logs_to_stderr",
    "log_format",
    "notices",
    "uvicorn_log_config",
)

LOG_FORMATS: Final = ("text", "json")
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_format(environ: Mapping[str, str]) -> str:
    """`TURNKIT_LOG_FORMAT`: `text` (the default, also when empty) or `json`."""
    chosen = environ.get("TURNKIT_LOG_FORMAT", "").strip().lower() or "text"
    if chosen not in LOG_FORMATS:
        raise ConfigurationError(f"TURNKIT_LOG_FORMAT must be 'text' or 'json', not {chosen!r}")
    return chosen


class _OneLine(logging.Formatter):
    """A record in one line: its exception's repr instead of a traceback.

    asyncpg's pool warns with a traceback each time it fails to reconnect during an outage;
    turnkit's own lines already say the database is out of reach. The record itself is
    left as it is, for any other handler.
    """

    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        bare = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        text = super().format(bare)
        return f"{text}: {error!r}" if error is not None else text


class _EveryMinute(logging.Filter):
    """Let one record of each message through a minute (an exporter retrying every second)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[object, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        if record.created - self._last.get(key, -math.inf) < 60:
            return False
        self._last[key] = record.created
        return True


def _formatter(chosen: str, *, tracebacks: bool) -> logging.Formatter:
    if chosen == "json":
        return JsonLogFormatter(tracebacks=tracebacks)
    return logging.Formatter(_TEXT) if tracebacks else _OneLine(_TEXT)


@contextlib.contextmanager
def info_logs_to_stderr(chosen: str = "text") -> Iterator[None]:
    """Show turnkit's INFO lines (a worker's claims, recoveries, finished turns) on stderr.

    The database driver's warnings go there too, formatted the same, one line each, and
    so do OpenTelemetry's (an exporter that cannot reach its backend), at most one of each
    kind a minute. `chosen`: the format, `text` or `json`.
    """
    turnkit, driver = logging.getLogger("turnkit"), logging.getLogger("asyncpg")
    exporters = logging.getLogger("opentelemetry")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(chosen, tracebacks=True))
    quiet = logging.StreamHandler(sys.stderr)
    quiet.setFormatter(_formatter(chosen, tracebacks=False))
    rare = logging.StreamHandler(sys.stderr)
    rare.setFormatter(_formatter(chosen, tracebacks=False))
    rare.addFilter(_EveryMinute())
    level = turnkit.level
    turnkit.addHandler(handler)
    turnkit.setLevel(logging.INFO)
    driver.addHandler(quiet)
    exporters.addHandler(rare)
    try:
        yield
    finally:
        turnkit.removeHandler(handler)
        turnkit.setLevel(level)
        driver.removeHandler(quiet)
        exporters.removeHandler(rare)


class _LinesToLog(io.TextIOBase):
    """What a command would print on stderr, as log lines of `logger` instead.

    A line written in pieces (`print` writes its arguments one by one) is one record,
    logged once its newline arrives (or at `flush`).
    """

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self._logger = logger
        self._pending = ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._say(line)
        return len(text)

    def flush(self) -> None:
        pending, self._pending = self._pending, ""
        self._say(pending)

    def _say(self, line: str) -> None:
        if line.strip():
            self._logger.info(line.removeprefix("turnkit: "))


def notices(chosen: str) -> TextIO:
    """Where a command's own notices go: stderr, or `turnkit.cli` log lines with JSON."""
    if chosen == "json":
        return cast(TextIO, _LinesToLog(logging.getLogger("turnkit.cli")))
    return sys.stderr


def announce(out: TextIO, text: str, chosen: str) -> None:
    """Say that a server or worker is up: on `out`, or as a log line when logs are JSON.

    A JSON log is then all a collector reads. `chosen`: the log format.
    """
    if chosen == "json":
        logging.getLogger("turnkit.cli").info(text)
        return
    out.write(text + "\n")
    out.flush()


def uvicorn_log_config(chosen: str) -> dict[str, Any] | None:
    """Uvicorn's logging in `chosen` format (None: uvicorn's own, for `text`).

    Its lines go where uvicorn sends them (the access log to stdout, the rest to stderr).
    """
    if chosen != "json":
        return None
    formatter = {"()": f"{JsonLogFormatter.__module__}.JsonLogFormatter"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": formatter},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            },
            "access": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stdout",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        },
    }
