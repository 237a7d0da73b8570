"""Configure the OpenTelemetry SDK from the standard `OTEL_*` variables.

The CLI's commands (`configure`) and the quickstart app's lifespan (`configure_once`) use it.

Nothing is configured unless asked: `--otel-console`, or one of `OTEL_TRACES_EXPORTER`,
`OTEL_METRICS_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`. Exporters are looked up by name in the SDK's own
registry (the `opentelemetry_traces_exporter` / `opentelemetry_metrics_exporter` entry
points: `console` ships with the SDK, `otlp` with `opentelemetry-exporter-otlp`); the
resource, sampler, batching and OTLP endpoint settings are read by the SDK itself
(`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`,
`OTEL_EXPORTER_OTLP_*`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TextIO

__all__ = ("configure", "configure_once", "wanted")

_TRIGGERS = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
_OTLP_HINT = "pip install opentelemetry-exporter-otlp"

_installed: list[Any] = []
"""The tracer and meter providers `configure` installed in this process (set once)."""


def wanted(environ: Mapping[str, str], *, console: bool) -> bool:
    """Whether the command line or the environment asks for telemetry."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return console or any(environ.get(name) for name in _TRIGGERS)


def _names(environ: Mapping[str, str], variable: str) -> list[str]:
    """Exporter names a variable lists; `otlp` by default once an endpoint is set."""
    raw = environ.get(variable)
    if raw is None:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or (
            variable == "OTEL_TRACES_EXPORTER" and environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        return ["otlp"] if endpoint else []
    return [n.strip() for n in raw.split(",") if n.strip() and n.strip() != "none"]


def _protocol(environ: Mapping[str, str], signal: str) -> str:
    """The OTLP protocol for `signal` (`TRACES`, `METRICS`), as the SDK's launcher reads it.

    The signal's own `OTEL_EXPORTER_OTLP_{SIGNAL}_PROTOCOL` wins over
    `OTEL_EXPORTER_OTLP_PROTOCOL`.
    """
    own = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "").strip()
    return own or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()


def _exporter(group: str, name: str, environ: Mapping[str, str]) -> type[Any] | None:
    signal = "METRICS" if group == "opentelemetry_metrics_exporter" else "TRACES"
    if name == "otlp" and _protocol(environ, signal) == "http/protobuf":
        name = "otlp_proto_http"
    for point in entry_points(group=group, name=name):
        loaded: type[Any] = point.load()
        return loaded
    return None


def configure(
    *,
    console: bool = False,
    err: TextIO,
    install: bool = True,
    one_line_spans: bool = False,
) -> Callable[[], None] | None:
    """Build (and with `install`, set globally) tracer and meter providers.

    Writes one line to `err` for what was set up, or for what could not be (no SDK, an
    exporter not installed). `console` spans go to `err` too, indented, or each on one
    line with `one_line_spans` (among JSON log lines). Returns the function that flushes
    and shuts the providers down, or None when nothing was configured.
    """
    env = os.environ
    if not wanted(env, console=console):
        return None
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        err.write(
            "turnkit: OpenTelemetry was asked for but opentelemetry-sdk is not installed "
            '(pip install "turnkit[otel]"); running without telemetry\n'
        )
        return None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "turnkit"}))
    tracer_provider = TracerProvider(resource=resource)
    done: list[str] = []
    missing: list[str] = []
    if console:
        # Spans to stderr: `turnkit run` prints the turn itself on stdout.
        exporter = (
            ConsoleSpanExporter(out=err, formatter=lambda span: span.to_json(indent=None) + "\n")
            if one_line_spans
            else ConsoleSpanExporter(out=err)
        )
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        done.append("console spans")
    for name in _names(env, "OTEL_TRACES_EXPORTER"):
        cls = _exporter("opentelemetry_traces_exporter", name, env)
        if cls is None:
            missing.append(f"trace exporter {name!r}")
            continue
        tracer_provider.add_span_processor(BatchSpanProcessor(_build(cls, name, err)))
        done.append(f"{name} spans")
    readers: list[MetricReader] = []
    for name in _names(env, "OTEL_METRICS_EXPORTER"):
        cls = _exporter("opentelemetry_metrics_exporter", name, env)
        if cls is None:
            missing.append(f"metric exporter {name!r}")
            continue
        readers.append(PeriodicExportingMetricReader(_build(cls, name, err)))
        done.append(f"{name} metrics")
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    _say_missing(missing, err)
    if not done:
        return None
    if install:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        _installed[:] = [tracer_provider, meter_provider]
    service = resource.attributes.get("service.name")
    err.write(f"turnkit: OpenTelemetry on ({', '.join(done)}; service.name={service})\n")

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown


def configure_once(*, err: TextIO) -> Callable[[], None] | None:
    """Configure from `OTEL_*` as the CLI does, once a process, for an app served alone.

    Nothing happens (nothing is even imported) unless an `OTEL_*` variable asks, nor when
    this process has a tracer provider already: the CLI's (`turnkit serve` configured
    it), an earlier app's, or one the app or `opentelemetry-instrument` set. Returns the
    function that flushes what was recorded so far (the providers themselves shut down
    when the process exits), or None.
    """
    if _installed or not wanted(os.environ, console=False):
        return None
    try:
        from opentelemetry import trace
    except ImportError:  # no API either: `configure` says what to install
        pass
    else:
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return None  # the app (or an agent) set its own
    if configure(err=err) is None:
        return None
    providers = list(_installed)

    def flush() -> None:
        for provider in providers:
            provider.force_flush()

    return flush


def _build(cls: Any, name: str, err: TextIO) -> Any:
    """An exporter; the SDK's console ones write to `err`, not over the turn on stdout."""
    return cls(out=err) if name == "console" else cls()


def _say_missing(missing: list[str], err: TextIO) -> None:
    """One line naming the exporters asked for that are not installed."""
    if missing:
        hint = f": {_OTLP_HINT}" if any("otlp" in m for m in missing) else ""
        err.write(f"turnkit: OpenTelemetry: no {', no '.join(missing)} installed{hint}\n")
