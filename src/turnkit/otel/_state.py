"""Which providers turnkit emits through, its instruments, and the content-capture switch.

Spans and metrics go to the global tracer and meter providers (`opentelemetry-api`). Until
an application (or `turnkit serve|worker|run`) installs real ones, `active()` returns None
and every instrumentation call site takes its no-op path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, MeterProvider, NoOpMeterProvider

# The API's stand-in until a provider is set; private, but the only way to tell "unset".
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, Tracer, TracerProvider

__all__ = ("Active", "active", "capture_content", "set_capture_content", "use_providers")

SCOPE = "turnkit"
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

# Bucket boundaries the GenAI semantic conventions advise for these histograms.
_TOKEN_BUCKETS = tuple(4.0**i for i in range(13))  # 1 … 16,777,216
_SECONDS_BUCKETS = tuple(0.01 * 2.0**i for i in range(14))  # 0.01 … 81.92


@dataclass(frozen=True, slots=True)
class Active:
    """The tracer and instruments of the providers in force."""

    tracer: Tracer
    token_usage: Histogram
    duration: Histogram
    time_to_first_chunk: Histogram
    turns: Counter
    cascade_steps: Counter
    recoveries: Counter
    replay_lag: Histogram

    @classmethod
    def of(cls, tracer_provider: TracerProvider, meter_provider: MeterProvider) -> Active:
        meter = meter_provider.get_meter(SCOPE)
        return cls(
            tracer=tracer_provider.get_tracer(SCOPE),
            token_usage=meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Tokens used per model call, by gen_ai.token.type",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            ),
            duration=meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="Duration of one model call (one rung of a cascade)",
                explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            ),
            time_to_first_chunk=meter.create_histogram(
                "gen_ai.client.operation.time_to_first_chunk",
                unit="s",
                description="Time from the request to the first streamed chunk",
                explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            ),
            turns=meter.create_counter(
                "turnkit.turns",
                unit="{attempt}",
                description="Turn attempts that ended, by turnkit.outcome",
            ),
            cascade_steps=meter.create_counter(
                "turnkit.cascade.steps",
                unit="{step}",
                description="Model calls that fell back to the next rung of their family",
            ),
            recoveries=meter.create_counter(
                "turnkit.recoveries",
                unit="{recovery}",
                description="Turns taken over after their driver died (lease expired)",
            ),
            replay_lag=meter.create_histogram(
                "turnkit.replay.lag",
                unit="s",
                description="Age of an event when the replay buffer hands it to a live reader",
                explicit_bucket_boundaries_advisory=_SECONDS_BUCKETS,
            ),
        )


_override: tuple[TracerProvider, MeterProvider] | None = None
_cached: tuple[TracerProvider, MeterProvider, Active] | None = None
_capture: bool | None = None


def _is_set(provider: TracerProvider | MeterProvider) -> bool:
    return not isinstance(
        provider, ProxyTracerProvider | NoOpTracerProvider | _ProxyMeterProvider | NoOpMeterProvider
    )


def active() -> Active | None:
    """The instruments to emit through, or None when no provider is configured (no-op)."""
    global _cached
    if _override is not None:
        tracer_provider, meter_provider = _override
    else:
        tracer_provider, meter_provider = trace.get_tracer_provider(), metrics.get_meter_provider()
    if not (_is_set(tracer_provider) or _is_set(meter_provider)):
        return None
    cached = _cached
    if cached is not None and cached[0] is tracer_provider and cached[1] is meter_provider:
        return cached[2]
    found = Active.of(tracer_provider, meter_provider)
    _cached = (tracer_provider, meter_provider, found)
    return found


@contextmanager
def use_providers(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> Iterator[None]:
    """Emit through these providers instead of the global ones, inside the block.

    For tests and benchmarks: OpenTelemetry lets a process set its global providers only
    once. A provider left out is a no-op one.
    """
    global _override
    before = _override
    _override = (tracer_provider or NoOpTracerProvider(), meter_provider or NoOpMeterProvider())
    try:
        yield
    finally:
        _override = before


def set_capture_content(enabled: bool | None) -> None:
    """Record message contents (True), never (False), or as the environment says (None).

    The environment variable is `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
    """
    global _capture
    _capture = enabled


def capture_content() -> bool:
    """Whether spans carry message contents, tool arguments and tool results."""
    if _capture is not None:
        return _capture
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in ("true", "1", "yes")
