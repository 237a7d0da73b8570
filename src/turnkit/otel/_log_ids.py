"""The trace and span a log line was written in, as a log collector joins them to spans."""

from __future__ import annotations

from opentelemetry import trace

__all__ = ("current_trace_ids",)


def current_trace_ids() -> tuple[str, str] | None:
    """The current span's trace id (32 hex digits) and span id (16), or None outside one.

    Inside a turn that is its attempt's span, or the stage, model call or tool call
    running; with no SDK installed nothing is recorded and this is None.
    """
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
