"""Every script in benchmarks/ runs at a tiny size, exits 0 and writes its JSON.

Nothing else runs them between measurements: a refactor that moves a name a benchmark
imports or patches would otherwise go unnoticed until someone needs the figures. The
scripts run in subprocesses (they are scripts, with their own event loops and servers),
two at a time, each writing to a temporary directory; the figures themselves are not
checked (at these sizes they mean nothing). Scripts that need PostgreSQL, Redis or
Chromium skip without them on a developer machine and fail under CI=true.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tests.conftest import POSTGRES_URL, REDIS_URL, require_service

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
CHROMIUM = Path("/usr/bin/chromium")
RUN_TIMEOUT_S = 240
"""Bound of one script's run (the slowest takes about 30 s on 2 cores)."""

PG, REDIS, BROWSER = "postgres", "redis", "chromium"


@dataclass(frozen=True)
class Bench:
    """A benchmark script, the arguments that make it tiny, and the services it needs."""

    args: tuple[str, ...]
    needs: tuple[str, ...] = ()


SMOKE: dict[str, Bench] = {
    "agent_loop_tokens": Bench(()),
    "asked_submit": Bench(("--runs", "3", "--turns", "20", "--postgres", POSTGRES_URL), (PG,)),
    "budget_check": Bench(("--sizes", "50", "--checks", "2", "--postgres", POSTGRES_URL), (PG,)),
    "concurrent_turns": Bench(
        ("--turns", "10", "--latency", "0.01", "--rounds", "1", "--sequential", "2")
    ),
    "db_copy": Bench(("--sessions", "3", "--paused", "1", "--postgres", POSTGRES_URL), (PG,)),
    "delta_cost": Bench(("--low", "2", "--high", "20", "--rounds", "1")),
    "held_size": Bench(("--turns", "3")),
    "idle_worker": Bench(
        ("--turns", "2", "--rounds", "1", "--workers", "1", "--gap", "0.05"), (PG, REDIS)
    ),
    "long_session": Bench(("--turns", "4", "--window", "2")),
    "model_transport": Bench(("--rounds", "1", "--calls", "2", "--short", "2", "--long", "5")),
    "otel_overhead": Bench(("--turns", "4", "--rounds", "1", "--warmup", "1")),
    "page_render": Bench(("--chars", "500", "--deltas", "10", "--reps", "1"), (BROWSER,)),
    "paused_turns": Bench(("--turns", "4", "--concurrency", "2")),
    "pii_streaming": Bench(("--sizes", "500", "--rounds", "1")),
    "postgres_turn": Bench(("--turns", "3", "--warmup", "1", "--rounds", "1"), (PG,)),
    "quiet_streams": Bench(
        ("--streams", "5", "--window", "0.5", "--rounds", "1", "--modes", "shared,record"), (PG,)
    ),
    "scale_out": Bench(
        (
            "--turns",
            "4",
            "--in-flight",
            "2",
            "--layouts",
            "1+1",
            "--latencies",
            "0",
            "--rounds",
            "1",
        ),
        (PG, REDIS),
    ),  # fmt: skip
    "serve_ab": Bench(
        (
            "--tree",
            f"a={ROOT / 'src'}",
            "--tree",
            f"b={ROOT / 'src'}",
            "--clients",
            "2",
            "--turns-per-client",
            "1",
            "--rounds",
            "1",
        ),
    ),  # fmt: skip
    "serve_clients": Bench(("--clients", "2", "--turns-per-client", "1", "--rounds", "1")),
    "soak_memory": Bench(
        (
            "--turns",
            "7",
            "--batches",
            "2",
            "--database-url",
            POSTGRES_URL,
            "--redis-url",
            REDIS_URL,
        ),
        (PG, REDIS),
    ),  # fmt: skip
    "soak_worker": Bench(
        (
            "--duration",
            "3",
            "--warmup",
            "1",
            "--workers",
            "1",
            "--producers",
            "2",
            "--concurrency",
            "2",
            "--sample-every",
            "1",
            "--database-url",
            POSTGRES_URL,
            "--redis-url",
            REDIS_URL,
        ),
        (PG, REDIS),
    ),  # fmt: skip
    "sse_latency": Bench(("--turns", "3", "--events", "50", "--reps", "1"), (REDIS,)),
    "turn_overhead": Bench(
        ("--turns", "3", "--warmup", "1", "--rounds", "1", "--concurrency", "2")
    ),
}


def _missing(needs: tuple[str, ...]) -> str | None:
    """Why a script cannot run here (None: it can)."""
    import socket

    for need in needs:
        if need == BROWSER:
            if not CHROMIUM.exists():
                return f"Chromium is not installed at {CHROMIUM}"
            continue
        port = 5432 if need == PG else 6379
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                pass
        except OSError:
            return f"{need} is not reachable on 127.0.0.1:{port}"
    return None


def _require(needs: tuple[str, ...]) -> None:
    """Skip (developer machine) or fail (CI=true) as the suite does for missing services."""
    for need in needs:
        if need == PG:
            require_service("PostgreSQL", "127.0.0.1", 5432)
        elif need == REDIS:
            require_service("Redis", "127.0.0.1", 6379)
        elif not CHROMIUM.exists():
            reason = f"Chromium is not installed at {CHROMIUM}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{reason} (CI=true: page_render must run; see .ci/run)")
            pytest.skip(reason)


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str
    json_path: Path


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )}  # fmt: skip
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_MODEL", "TURNKIT_RUNTIME"):
        env.pop(name, None)
    # The suite's services, whatever a developer's benchmark settings say.
    env["TURNKIT_BENCH_POSTGRES_URL"], env["TURNKIT_BENCH_REDIS_URL"] = POSTGRES_URL, REDIS_URL
    return env


def _run(name: str, tmp: Path) -> Ran:
    out = tmp / f"{name}.json"
    args = [*SMOKE[name].args, "--json", str(out)]
    if name == "soak_worker":
        args += ["--logs", str(tmp / "soak_worker_logs")]
    try:
        done = subprocess.run(
            [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
            cwd=tmp, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return Ran(-1, str(exc.stdout or ""), f"timed out after {RUN_TIMEOUT_S} s", out)
    return Ran(done.returncode, done.stdout, done.stderr, out)


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Ran]]]:
    """The selected scripts, started two at a time in the order their tests run."""
    tmp = tmp_path_factory.mktemp("benchmarks")
    selected = [
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
        and "name" in item.callspec.params
    ]  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(_run, name, tmp)
            for name in selected
            if _missing(SMOKE[name].needs) is None
        }
        yield futures
        for future in futures.values():
            future.cancel()


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_")}
    assert scripts == set(SMOKE), "give each benchmark a tiny run in SMOKE"


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_runs(name: str, runs: dict[str, Future[Ran]]) -> None:
    _require(SMOKE[name].needs)
    ran = runs[name].result()
    tail = f"\n--- stdout\n{ran.out[-3000:]}\n--- stderr\n{ran.err[-6000:]}"
    assert ran.code == 0, f"benchmarks/{name}.py exited {ran.code}{tail}"
    assert ran.json_path.exists(), f"benchmarks/{name}.py wrote no JSON{tail}"
    assert isinstance(json.loads(ran.json_path.read_text()), dict)


def _patch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_bench_patch", BENCHMARKS / "_patch.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_patch_of_a_name_that_moved_fails() -> None:
    patch = _patch_module()
    target = SimpleNamespace(here=1)
    with patch.patched(target, "here", 2) as old:
        assert (old, target.here) == (1, 2)
    assert target.here == 1
    with pytest.raises(AttributeError, match="renamed or moved"):
        patch.replace(target, "gone", 2)
    assert not hasattr(target, "gone")


def test_soak_worker_small_caches_reach_the_worker_runtime(tmp_path: Path) -> None:
    """The soak's workers hold at most 256 KiB of transcripts, not 64 MiB.

    The runtime passes its configured bound to `HeldTranscripts`, so shrinking only the
    class's default changed nothing.
    """
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(BENCHMARKS)!r})
        os.environ["TURNKIT_SOAK_SMALL_CACHES"] = "1"
        import soak_worker
        from turnkit import RuntimeConfig, SessionRuntime
        from turnkit.context import transcript
        agent = soak_worker.AGENT  # as `turnkit worker` loads it, before its runtime
        url = "sqlite:///{tmp_path / "soak.db"}"
        runtime = SessionRuntime(agent=agent, config=RuntimeConfig(database_url=url))
        print(runtime._held.max_bytes, transcript._CACHE_SIZE)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    held, cache = (int(n) for n in done.stdout.split())
    assert (held, cache) == (256 * 1024, 32)


def _processes_naming(marker: str) -> list[str]:
    """The live processes whose command line holds `marker` (pid: command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        cmdline = raw.replace(b"\0", b" ").decode("utf-8", "replace")
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def _kill_naming(marker: str) -> None:
    """Kill what a leaky run left behind, so one failure does not load every later test."""
    import signal

    for line in _processes_naming(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def test_a_server_that_does_not_start_stops_those_that_did(tmp_path: Path) -> None:
    """serve_ab starts one server per tree: when the second cannot start (a tree whose
    turnkit does not import), the first, already serving, is stopped, not left running."""
    broken = tmp_path / "broken" / "turnkit"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise SystemExit('this tree is broken')\n")
    env = {**_env(), "TMPDIR": str(tmp_path)}  # the servers' databases: named by tmp_path
    try:
        done = subprocess.run(
            [sys.executable, str(BENCHMARKS / "serve_ab.py"), "--tree", f"a={ROOT / 'src'}",
             "--tree", f"b={broken.parent}", "--clients", "1", "--turns-per-client", "1",
             "--rounds", "1"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
        assert done.returncode != 0
        assert "b exited; see" in done.stderr, done.stderr[-2000:]
        assert _processes_naming(str(tmp_path)) == []
    finally:
        _kill_naming(str(tmp_path))


def test_a_benchmark_stopped_mid_run_stops_its_servers(tmp_path: Path) -> None:
    """SIGTERM (a CI job's timeout) while serve_clients measures: its `turnkit serve`
    processes stop with it, where they outlived it."""
    import signal
    import time

    env = {**_env(), "TMPDIR": str(tmp_path)}
    bench = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / "serve_clients.py"), "--clients", "2",
         "--turns-per-client", "1", "--rounds", "50", "--json", str(tmp_path / "out.json")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any("turnkit.cli serve" in p for p in _processes_naming(str(tmp_path))):
            assert bench.poll() is None, bench.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no server started"
            time.sleep(0.1)
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=120)
        assert _processes_naming(str(tmp_path)) == []
        assert bench.returncode == 128 + signal.SIGTERM, err[-2000:]  # through its `finally`s
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        _kill_naming(str(tmp_path))
