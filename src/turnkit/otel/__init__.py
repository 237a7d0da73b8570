"""OpenTelemetry for turnkit: spans and metrics on the GenAI semantic conventions.

turnkit depends on `opentelemetry-api` only and emits through the global tracer and meter
providers, so nothing is recorded (and almost nothing runs) until an application installs
an SDK, or `turnkit serve|worker|run` configures one from the `OTEL_*` variables
(`turnkit.otel.setup`). This package is the only one that imports `opentelemetry`.

Per turn attempt: `invoke_agent {agent}` → `stage {name}` → `chat {model}` (one per rung
tried) and `execute_tool {tool}`. Every attempt of a turn joins the trace pinned when its
message was submitted. See docs/guides/observability.md.
"""

from __future__ import annotations

from turnkit.otel._chat import ChatTrace, chat, tool_fallback, traced_tool
from turnkit.otel._log_ids import current_trace_ids
from turnkit.otel._replay import record_replay_lag
from turnkit.otel._state import capture_content, set_capture_content, use_providers
from turnkit.otel._turn import (
    TurnTrace,
    attempt,
    note_resume,
    resume_cause,
    stage_ended,
    stage_started,
    submit_trace,
    submit_traceparent,
)

__all__ = (
    "ChatTrace",
    "TurnTrace",
    "attempt",
    "capture_content",
    "chat",
    "current_trace_ids",
    "record_replay_lag",
    "set_capture_content",
    "note_resume",
    "resume_cause",
    "stage_ended",
    "stage_started",
    "submit_trace",
    "submit_traceparent",
    "tool_fallback",
    "traced_tool",
    "use_providers",
)
