"""An install without an extra: the core imports, and each adapter names the extra it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

_WEB = ("fastapi", "starlette", "sse_starlette", "uvicorn")


def _import_without(blocked: tuple[str, ...], statement: str) -> subprocess.CompletedProcess[str]:
    """Run `statement` in a fresh interpreter where `blocked` packages cannot be imported."""
    block = "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{block}{statement}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_core_imports_without_the_web_extra() -> None:
    done = _import_without(_WEB, "import turnkit, turnkit.runtime, turnkit.cli; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "module",
    ["turnkit.http", "turnkit.protocols.agui", "turnkit.protocols.ai_sdk", "turnkit.quickstart"],
)
def test_a_web_adapter_names_its_extra(module: str) -> None:
    done = _import_without(_WEB, f"import {module}")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: "), last
    assert 'pip install "turnkit[fastapi]"' in last


def test_the_routes_name_the_extra_when_only_sse_starlette_is_missing() -> None:
    done = _import_without(("sse_starlette",), "import turnkit.http")
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: "), last
    assert 'pip install "turnkit[fastapi]"' in last


def test_the_redis_buffer_names_its_extra() -> None:
    done = _import_without(("redis",), "import turnkit.replay.redis")
    last = done.stderr.strip().splitlines()[-1]
    assert 'pip install "turnkit[redis]"' in last


def test_serve_without_the_web_extra_is_one_line() -> None:
    done = _import_without(
        _WEB, "from turnkit.cli import main; raise SystemExit(main(['serve', '--port', '1']))"
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("turnkit: ")
    assert "turnkit[fastapi]" in done.stderr
