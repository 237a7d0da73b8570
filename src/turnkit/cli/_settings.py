"""What the commands that run turns build from their flags and the environment.

The runtime's configuration (or the app's own runtime, `--runtime`), the agents they
host, the garbage collector's settings.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from turnkit.agent import import_object
from turnkit.config import (
    RuntimeConfig,
    env_idle_window_s,
    env_keep_ended_checkpoints,
    env_lease_ttl_s,
    env_listen_for_stops,
)
from turnkit.demo import DEMO_MODEL_NAME
from turnkit.errors import ConfigurationError
from turnkit.models._errors import redact_secrets
from turnkit.runtime import SessionRuntime

__all__ = (
    "GC_THRESHOLDS",
    "RUNTIME_FLAGS",
    "ceiling",
    "gc_mode",
    "hosting",
    "install_command",
    "load_runtime",
    "named_agents",
    "refuse_beside_runtime",
    "runtime_config",
    "tune_gc",
)


def install_command(
    requirement: str, *, prefix: str | None = None, executable: str | None = None
) -> str:
    """The command that installs `requirement` into the Python running turnkit.

    A virtual environment uv made (its `pyvenv.cfg` says `uv = …`) has no pip in it:
    `uv pip install --python …`. Otherwise this Python's own pip (a bare `pip` is often
    another environment's), after `ensurepip` when it has none.
    """
    prefix = sys.prefix if prefix is None else prefix
    executable = sys.executable if executable is None else executable
    try:
        made = (Path(prefix) / "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        made = ""
    if re.search(r"^\s*uv\s*=", made, re.MULTILINE):
        return f"uv pip install --python {executable} '{requirement}'"
    pip = f"{executable} -m pip install '{requirement}'"
    if prefix == sys.prefix and importlib.util.find_spec("pip") is None:
        return f"{executable} -m ensurepip && {pip}"
    return pip


def ceiling(args: argparse.Namespace, idle: float) -> float:
    """`--ceiling`, else as the API processes have it: an hour, or the idle window if longer."""
    given: float | None = getattr(args, "ceiling", None)
    return given if given is not None else max(3600.0, idle)


def _lease_ttl(args: argparse.Namespace) -> float:
    """A worker's `--lease-ttl`, else `$TURNKIT_LEASE_TTL_S` (8 s); `turnkit run`'s 30 s."""
    if not hasattr(args, "lease_ttl"):
        return 30.0
    given: float | None = args.lease_ttl
    return given if given is not None else env_lease_ttl_s(os.environ)


def runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    """The `RuntimeConfig` a command's flags (and the environment) describe."""
    given: float | None = getattr(args, "idle_window", None)
    idle = given or env_idle_window_s(os.environ)
    most = ceiling(args, idle)
    if given is not None and given > most:
        raise ConfigurationError(f"--idle-window ({given:g} s) cannot exceed --ceiling "
                                 f"({most:g} s)")  # fmt: skip
    idle = min(idle, most)  # a lower --ceiling bounds the environment's idle window
    return RuntimeConfig(
        database_url=args.database_url,
        database_schema=args.database_schema,
        lease_ttl_s=_lease_ttl(args),
        ceiling_s=most,
        idle_window_s=idle,
        heartbeat_interval_s=min(5.0, idle / 3),
        max_attempts=getattr(args, "max_attempts", 3),
        checkpoint_durability=getattr(args, "checkpoint_durability", None),
        budgets=getattr(args, "budgets", None) or "off",
        keep_ended_checkpoints=env_keep_ended_checkpoints(os.environ),
        listen_for_stops=env_listen_for_stops(os.environ),
    )


GC_THRESHOLDS: Final = (10_000, 20, 20)
"""Collection thresholds `turnkit serve` and `turnkit worker` run with (Python's: 700, 10, 10)."""


def gc_mode() -> str:
    """`TURNKIT_GC`: `tuned` (the default, also when empty) or `python`."""
    mode = os.environ.get("TURNKIT_GC", "").strip().lower() or "tuned"
    if mode not in ("tuned", "python"):
        raise ConfigurationError(f"TURNKIT_GC must be 'tuned' or 'python', not {mode!r}")
    return mode


def tune_gc(mode: str) -> None:
    """Freeze what start-up allocated and collect less often, unless `mode` is `python`.

    A loaded server holds many live objects, and Python's default thresholds run a full
    collection over all of them every few hundred thousand allocations: with 1,000 turns in
    flight that was about two fifths of the process's CPU. Frozen start-up objects are
    never scanned again.
    """
    if mode == "tuned":
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)


_DEMO: Final = (
    f"{DEMO_MODEL_NAME}, the OFFLINE DEMO model: fixed rules, not an LLM; "
    "set TURNKIT_MODEL or --agent for a real one"
)


def hosting(runtime: SessionRuntime) -> str:
    """The agents `runtime` hosts, each with its model, for a start-up line.

    `support (model openai/gpt-4o-mini), triage (model fast: family fast: a, b)`; the
    demo model says that it is the offline demo, not an LLM. Model names and endpoint
    addresses only: never a key, nor an address's user, password or query (nor a key in its
    path).
    """
    return ", ".join(
        f"{agent.name} (model {_model(agent.model, runtime.models)})"
        for agent in runtime.agents.hosted()
    )


def _model(model: object, served: Mapping[str, object], depth: int = 0) -> str:
    """`model` as a start-up line names it (a served name with what it stands for)."""
    if isinstance(model, str):
        stands_for = served.get(model) if depth < 3 else None
        if stands_for is None or stands_for == model:
            return model
        return f"{model}: {_model(stands_for, served, depth + 1)}"
    name = getattr(model, "model", None)
    if name == DEMO_MODEL_NAME:
        return _DEMO
    rungs = getattr(model, "rungs", None)
    if rungs is not None:
        tried = ", ".join(_model(rung, served, depth + 1) for rung in rungs)
        return f"family {getattr(model, 'name', '?')}: {tried}"
    shown = name if isinstance(name, str) else type(model).__name__
    base = getattr(model, "api_base", None)
    return f"{shown} at {_address(base)}" if isinstance(base, str) and base else shown


def _address(url: str) -> str:
    """An endpoint's address without what may be secret: its user, password and query.

    A key-shaped part of its path (`/key/sk-…/v1`) shows as `***`.
    """
    try:
        parts = urlsplit(url if "//" in url else f"//{url}")
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port that is not a number
        return "?"
    host = f"[{host}]" if ":" in host else host
    scheme = f"{parts.scheme}://" if parts.scheme else ""
    return f"{scheme}{host}{port}{redact_secrets(parts.path)}"


def named_agents(args: argparse.Namespace) -> list[str]:
    """The `--agent` values given; an empty one (compose's unset `${TURNKIT_AGENT:-}`) is none."""
    return [name for name in args.agent or () if name.strip()]


RUNTIME_FLAGS: Final = (
    "--agent",
    "--database-url",
    "--database-schema",
    "--redis-url",
    "--lease-ttl",
    "--idle-window",
    "--ceiling",
    "--max-attempts",
    "--checkpoint-durability",
    "--budgets",
)
"""The flags that build a runtime (serve's and the worker's): with `--runtime`, the app's
runtime decides."""


async def load_runtime(spec: str) -> SessionRuntime:
    """Import the app's runtime by `package.module:name`.

    A `SessionRuntime`, or a function (sync or async) returning a new one.

    Raises:
        ConfigurationError: `spec` cannot be imported, or is not (and makes no) runtime.
    """
    target = import_object(spec, f"the runtime {spec!r}")
    made = target() if callable(target) and not isinstance(target, SessionRuntime) else target
    runtime = await made if inspect.isawaitable(made) else made
    if not isinstance(runtime, SessionRuntime):
        raise ConfigurationError(
            f"{spec!r} is not a turnkit SessionRuntime (or a function returning one)"
        )
    return runtime


def refuse_beside_runtime(argv: Sequence[str]) -> None:
    """Refuse the flags that build a runtime, given with a value, beside `--runtime`.

    An empty value is none (compose's `--agent ${TURNKIT_AGENT:-}` with the variable unset).
    """
    given: list[str] = []
    for at, arg in enumerate(argv):
        written, equals, value = arg.partition("=")
        # argparse takes a flag's unique prefix (`--budget`) as the flag: so must this.
        named = [f for f in RUNTIME_FLAGS if len(written) > 2 and f.startswith(written)]
        if len(named) != 1:
            continue
        flag = named[0]
        if not equals:
            value = argv[at + 1] if at + 1 < len(argv) else ""
        if value.strip() and flag not in given:
            given.append(flag)
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} cannot be given with --runtime: the runtime your function "
            "builds has its own agents, database, replay buffer and settings"
        )
