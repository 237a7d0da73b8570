"""`turnkit serve|worker|run` configure the OpenTelemetry SDK from flags and `OTEL_*`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from turnkit.cli import _parser
from turnkit.otel.setup import configure, wanted


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


def test_nothing_is_configured_unless_asked() -> None:
    err = io.StringIO()
    assert configure(err=err, install=False) is None
    assert err.getvalue() == ""
    assert not wanted(
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, console=True
    )
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, console=False)


def test_the_console_flag_prints_one_line() -> None:
    err = io.StringIO()
    shutdown = configure(console=True, err=err, install=False)
    assert shutdown is not None
    shutdown()
    assert err.getvalue() == "turnkit: OpenTelemetry on (console spans; service.name=turnkit)\n"


def test_exporters_come_from_the_sdk_registry_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "support-bot")
    shutdown = configure(err=err, install=False)
    assert shutdown is not None
    shutdown()
    assert err.getvalue() == (
        "turnkit: OpenTelemetry on (console spans; service.name=support-bot)\n"
    )


@pytest.mark.skipif(
    bool(entry_points(group="opentelemetry_traces_exporter", name="otlp")),
    reason="the OTLP exporter is installed here",
)
def test_a_missing_otlp_exporter_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    assert configure(err=err, install=False) is None
    [line] = err.getvalue().splitlines()
    assert "no trace exporter 'otlp'" in line
    assert "pip install opentelemetry-exporter-otlp" in line


def test_a_missing_sdk_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("opentelemetry.sdk")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    err = io.StringIO()
    assert configure(console=True, err=err, install=False) is None
    assert err.getvalue() == (
        "turnkit: OpenTelemetry was asked for but opentelemetry-sdk is not installed "
        '(pip install "turnkit[otel]"); running without telemetry\n'
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_turnkit_run_with_otel_console_prints_the_spans(tmp_path: Path, how: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TURNKIT_"))} | {
        "OTEL_METRICS_EXPORTER": "none",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    flags = ["--otel-console"]
    if how == "environment":  # the SDK's own console exporter, asked for by name
        env, flags = env | {"OTEL_TRACES_EXPORTER": "console"}, []
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnkit.cli",
            "run",
            "What is (12 + 3) * 7?",
            *flags,
            "--database-url",
            f"sqlite:///{tmp_path / 't.db'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "105" in done.stdout
    assert '"trace_id"' not in done.stdout  # spans go to stderr, not over the turn
    assert "turnkit: OpenTelemetry on (console spans; service.name=turnkit)" in done.stderr
    assert "Traceback" not in done.stderr
    # The console exporter writes each span as indented JSON ("{" … "}" at line starts).
    names = [
        json.loads("{" + chunk.split("\n{", 1)[-1].removeprefix("{") + "\n}")["name"]
        for chunk in done.stderr.split("\n}\n")
        if "\n{" in "\n" + chunk
    ]
    assert "turnkit.submit" in names
    assert any(n.startswith("invoke_agent ") for n in names)
    assert any(n.startswith("execute_tool ") for n in names)
    assert "stage post-turn" in names


_QUICKSTART = """
import sys

from fastapi.testclient import TestClient
from opentelemetry import trace

from turnkit.otel.setup import configure
from turnkit.quickstart import create_app

if sys.argv[1] == "cli-first":  # as `turnkit serve` does before it serves the app
    configure(err=sys.stderr)
for _ in range(2):  # a second app in the process configures nothing more
    with TestClient(create_app()) as client:
        answer = client.post(
            "/api/harness/sessions/s1/execute", json={"content": "What is (12 + 3) * 7?"}
        )
        print(answer.status_code, "105" in answer.text)
print("tracer provider:", type(trace.get_tracer_provider()).__name__)
"""


def _quickstart(tmp_path: Path, otel: dict[str, str], how: str = "alone") -> tuple[str, str]:
    """Serve the quickstart app (its lifespan too) in a process of its own: stdout, stderr."""
    script = tmp_path / "serve.py"
    script.write_text(_QUICKSTART)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TURNKIT_"))}
    env |= otel | {
        "TURNKIT_DATABASE_URL": f"sqlite:///{tmp_path / 'q.db'}",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    done = subprocess.run(
        [sys.executable, str(script), how],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


_ON = "turnkit: OpenTelemetry on (console spans; service.name=turnkit)"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["alone", "cli-first"])
def test_the_quickstart_app_configures_telemetry_from_the_environment(
    tmp_path: Path, how: str
) -> None:
    """`uvicorn turnkit.quickstart:app` exports what `OTEL_*` asks for, as `turnkit serve`
    does; once a process, whoever asked first."""
    out, err = _quickstart(
        tmp_path, {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}, how
    )
    assert out.splitlines() == ["200 True", "200 True", "tracer provider: TracerProvider"]
    assert err.count(_ON) == 1
    assert "Overriding of current TracerProvider" not in err
    assert '"name": "stage tool-loop"' in err  # the turns' spans, on stderr
    assert err.count('"name": "invoke_agent ') == 2  # both apps' turns, one provider


@pytest.mark.slow
def test_the_quickstart_app_costs_nothing_without_otel_variables(tmp_path: Path) -> None:
    out, err = _quickstart(tmp_path, {})
    assert out.splitlines() == ["200 True", "200 True", "tracer provider: ProxyTracerProvider"]
    assert "OpenTelemetry" not in err


@pytest.mark.parametrize("command", [["run", "hi"], ["worker"], ["serve"]])
def test_the_commands_that_run_turns_take_the_otel_flags(command: list[str]) -> None:
    args = _parser().parse_args([*command, "--otel-console", "--otel-capture-content"])
    assert (args.otel_console, args.otel_capture_content) == (True, True)


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
def test_otlp_over_http_is_chosen_per_signal_as_the_launcher_does(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf` picks the HTTP exporter for spans.

    Only the HTTP exporter is "installed" here: the gRPC one would be a silent mismatch
    (gRPC against an HTTP port) where it is installed, and a false "not installed" where
    it is not.
    """
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    import turnkit.otel.setup as setup

    class _Point:
        def load(self) -> type[ConsoleSpanExporter]:
            return ConsoleSpanExporter

    asked: list[tuple[str, str]] = []

    def fake_entry_points(*, group: str, name: str) -> list[_Point]:
        asked.append((group, name))
        return [_Point()] if name == "otlp_proto_http" else []

    monkeypatch.setattr(setup, "entry_points", fake_entry_points)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv(variable, "http/protobuf")
    err = io.StringIO()
    shutdown = configure(err=err, install=False)
    assert shutdown is not None
    shutdown()
    assert asked == [("opentelemetry_traces_exporter", "otlp_proto_http")]
    assert err.getvalue() == "turnkit: OpenTelemetry on (otlp spans; service.name=turnkit)\n"
