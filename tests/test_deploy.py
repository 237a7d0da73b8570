"""`deploy/compose.yaml` runs what the systemd units run, with the same variables and checks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.server import serve
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.quickstart import create_app
from turnkit.testing import ModelStep, ScriptedModel

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())  # type: ignore[no-any-return]


def _example_variables() -> set[str]:
    text = (DEPLOY / "turnkit.env.example").read_text()
    return set(re.findall(r"^(TURNKIT_\w+)=", text, re.M))


def test_the_compose_file_runs_the_api_and_workers_on_postgres_and_redis() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "migrate", "api", "worker"} <= set(services)
    for name in ("migrate", "api", "worker"):
        env = services[name]["environment"]
        assert _example_variables() <= set(env), f"{name} lacks a variable of the example"
        assert "@postgres:" in env["TURNKIT_DATABASE_URL"]
        assert env["TURNKIT_REDIS_URL"].startswith("redis://redis:")
    api, worker = services["api"], services["worker"]
    assert api["environment"]["TURNKIT_RUN_IN_PROCESS"] == "0"  # as the systemd unit: workers drive
    assert api["command"][:2] == ["turnkit", "serve"]
    assert worker["command"][:2] == ["turnkit", "worker"]
    assert (api["deploy"]["replicas"], worker["deploy"]["replicas"]) == (2, 2)
    for name, service in services.items():  # every awaited health check exists
        for dep, rule in (service.get("depends_on") or {}).items():
            assert dep in services, (name, dep)
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
    build = api["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve().is_file()


def _run_probe(probe: str, url: str) -> subprocess.CompletedProcess[bytes]:
    """The compose health check's command, against `url` instead of the container's port."""
    command = [sys.executable, "-c", probe.replace("http://127.0.0.1:8000", url)]
    return subprocess.run(command, capture_output=True, timeout=30, check=False)


def test_the_api_health_check_passes_when_ready_and_fails_when_down(tmp_path: Path) -> None:
    [probe] = [p for p in _compose()["services"]["api"]["healthcheck"]["test"] if "urlopen" in p]
    assert "/healthz" in probe
    assert "/readyz" in probe
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("hi")])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'h.db'}"),
    )
    with serve(create_app(runtime)) as url:
        up = _run_probe(probe, url)
    assert up.returncode == 0, up.stderr.decode()
    down = _run_probe(probe, url)
    assert down.returncode != 0  # the container would be marked unhealthy


def test_the_api_health_check_passes_while_redis_hangs(tmp_path: Path) -> None:
    """A Redis outage marks the replay degraded; it must not fail every API container."""
    import socket

    from turnkit.replay.redis import RedisReplayBuffer

    [probe] = [p for p in _compose()["services"]["api"]["healthcheck"]["test"] if "urlopen" in p]
    with socket.socket() as hung:  # accepts connections and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        runtime = SessionRuntime(
            agent=Agent(model=ScriptedModel([])),
            config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'r.db'}"),
            replay=RedisReplayBuffer.from_url(f"redis://127.0.0.1:{hung.getsockname()[1]}/0"),
        )
        with serve(create_app(runtime)) as url:
            up = _run_probe(probe, url)
    assert up.returncode == 0, up.stderr.decode()


def test_the_containers_pass_every_setting_the_processes_read() -> None:
    """Every variable the operations page lists for the app or a worker reaches them."""
    from turnkit.quickstart import runtime_from_env

    page = (ROOT / "docs" / "operations.md").read_text()
    table = page[page.index("## Environment variables") : page.index("## Performance")]
    listed = set(re.findall(r"^\| `(TURNKIT_\w+)` \|", table, re.M))
    assert len(listed) >= 15
    # The API's in-process driving is set by the file itself; recovery follows it.
    passed = listed - {"TURNKIT_RUN_IN_PROCESS", "TURNKIT_RECOVER_IN_PROCESS"}
    for name in ("api", "worker"):
        env = _compose()["services"][name]["environment"]
        assert passed <= set(env), f"{name} lacks {sorted(passed - set(env))}"
    # Compose passes an unset variable as empty: every one then means its default.
    unset = dict.fromkeys(passed, "") | {"TURNKIT_DATABASE_URL": "sqlite:///:memory:"}
    runtime = runtime_from_env(unset)
    assert runtime.agent.name == "demo"
    assert type(runtime.agent.model).__name__ == "DemoModel"


def test_the_quickstart_app_serves_the_protocol_endpoints(tmp_path: Path) -> None:
    import httpx

    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("hi"), ModelStep.text_reply("yo")])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'p.db'}"),
    )
    hello = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}
    agui = {
        "threadId": "t1", "runId": "r1", "state": {}, "tools": [], "context": [],
        "forwardedProps": {}, "messages": [{"id": "m1", "role": "user", "content": "Hi"}],
    }  # fmt: skip
    with serve(create_app(runtime)) as url, httpx.Client(base_url=url, timeout=30) as http:
        chat = http.post("/api/chat", json={"id": "c1", "messages": [hello]})
        assert chat.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert chat.text.rstrip().endswith("data: [DONE]")
        run = http.post("/api/agui/run", json=agui, headers={"Accept": "text/event-stream"})
        assert run.status_code == 200, run.text
        assert '"type":"RUN_FINISHED"' in run.text.replace(" ", "")
