"""The batteries-included app: `uvicorn turnkit.quickstart:app` or `turnkit serve`.

It serves the routes under `/api/harness` and the chat page at `/` (static ES modules in
`turnkit/http/page`, no build step).

Embedded defaults — SQLite (`turnkit.db`), in-memory replay, the offline demo model (not an
LLM). Environment variables switch to production parts:

| variable | effect |
|---|---|
| `TURNKIT_DATABASE_URL` | `postgresql://…` for PostgreSQL (default `sqlite:///turnkit.db`) |
| `TURNKIT_DATABASE_SCHEMA` | PostgreSQL schema for turnkit's tables |
| `TURNKIT_REDIS_URL` | `redis://…` for the Redis Streams replay buffer |
| `TURNKIT_MODEL` | a litellm model string instead of the demo model |
| `TURNKIT_AGENT` | `module:name` of your `Agent`s, comma-separated (first = default) |
| `TURNKIT_RUN_IN_PROCESS` | `0` leaves turns to `turnkit worker` processes |
| `TURNKIT_RECOVER_IN_PROCESS` | `0` turns off the app's own recovery loop (on by default) |
| `TURNKIT_IDLE_WINDOW_S` | the readers' idle window (default 120) |
| `TURNKIT_LEASE_TTL_S` | how long a driver's claim lasts unrenewed (default 8) |
| `TURNKIT_PLUGINS` | installed plugins to run in every turn, by name, comma-separated |
| `TURNKIT_MAX_BODY_BYTES` | the largest request body accepted (default 64 MiB; `off`: none) |
| `TURNKIT_KEEP_ENDED_CHECKPOINTS` | `1` keeps ended turns' graph checkpoints (default: deleted) |
| `TURNKIT_LISTEN_FOR_STOPS` | `0` behind a pooler relaying no notifications (Stops: at renewal) |
| `TURNKIT_AUTH` | `module:name` of your FastAPI auth dependency (default: all anonymous) |
| `TURNKIT_ALLOWED_HOSTS` | host names the app answers to, comma-separated (default: any) |
| `TURNKIT_ALLOWED_ORIGINS` | other origins whose pages may POST to it, comma-separated (`*`: any) |

The app's lifespan configures the OpenTelemetry SDK from the standard `OTEL_*` variables,
as `turnkit serve` does (once a process; not when a tracer provider is set already).
"""

from __future__ import annotations

import os
import string
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, cast

from turnkit.errors import ConfigurationError, missing_extra

try:
    from fastapi import FastAPI
    from fastapi.responses import FileResponse, Response
    from fastapi.staticfiles import StaticFiles
    from starlette.types import Scope
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The quickstart app", "fastapi", exc) from exc

from turnkit.agent import import_object, load_agents
from turnkit.config import (
    Durability,
    RuntimeConfig,
    env_flag,
    env_idle_window_s,
    env_keep_ended_checkpoints,
    env_lease_ttl_s,
    env_listen_for_stops,
    env_plugins,
)
from turnkit.demo import demo_agent
from turnkit.http import (
    create_health_router,
    create_turnkit_router,
    install_problem_handlers,
)
from turnkit.http.body_limit import DEFAULT_MAX_BODY_BYTES, RequestBodyLimit, checked_bound
from turnkit.http.cross_origin import CrossOriginProtection, checked_origins
from turnkit.http.trusted_hosts import TrustedHosts
from turnkit.otel.setup import configure_once
from turnkit.protocols.agui import create_agui_router
from turnkit.protocols.ai_sdk import create_ai_sdk_router
from turnkit.replay import replay_from_url
from turnkit.runtime import SessionRuntime
from turnkit.tenancy import AuthDependency, anonymous

__all__ = (
    "allowed_hosts_from_env",
    "allowed_origins_from_env",
    "app",
    "auth_from_env",
    "create_app",
    "max_body_bytes_from_env",
    "runtime_from_env",
)

_PAGE = Path(__file__).parent / "http" / "page"


def runtime_from_env(env: Mapping[str, str] | None = None) -> SessionRuntime:
    """A runtime configured from `TURNKIT_*` environment variables."""
    env = os.environ if env is None else env
    idle = env_idle_window_s(env)
    in_process = env_flag(env, "TURNKIT_RUN_IN_PROCESS", default=True)
    config = RuntimeConfig(
        database_url=env.get("TURNKIT_DATABASE_URL", "").strip() or "sqlite:///turnkit.db",
        database_schema=env.get("TURNKIT_DATABASE_SCHEMA") or None,
        run_in_process=in_process,
        recover_in_process=env_flag(env, "TURNKIT_RECOVER_IN_PROCESS", default=in_process),
        idle_window_s=idle,
        heartbeat_interval_s=min(5.0, idle / 3),
        ceiling_s=max(3600.0, idle),
        lease_ttl_s=env_lease_ttl_s(env),
        checkpoint_durability=cast(
            Durability | None, env.get("TURNKIT_CHECKPOINT_DURABILITY") or None
        ),  # RuntimeConfig refuses any other value
        max_running_turns=_count(env, "TURNKIT_MAX_RUNNING_TURNS"),
        budgets=cast(Literal["off", "enforce"], env.get("TURNKIT_BUDGETS") or "off"),
        keep_ended_checkpoints=env_keep_ended_checkpoints(env),
        listen_for_stops=env_listen_for_stops(env),
    )  # RuntimeConfig refuses a `budgets` other than those two
    replay = replay_from_url(env.get("TURNKIT_REDIS_URL"))
    named = env.get("TURNKIT_AGENT", "").strip(
        string.whitespace + ","
    )  # blank: unset, as `turnkit worker` has it
    agents = (
        load_agents(named) if named else (demo_agent(env.get("TURNKIT_MODEL", "").strip() or None),)
    )
    return SessionRuntime(agents=agents, config=config, replay=replay, plugins=env_plugins(env))


def _count(env: Mapping[str, str], name: str) -> int | None:
    """A whole number from the environment; unset, empty or `off`: None."""
    value = env.get(name)
    if value is None or value.strip().lower() in ("", "off", "none"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"{name}={value!r} is not a whole number (or 'off')") from None


def max_body_bytes_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """`TURNKIT_MAX_BODY_BYTES`: unset or empty, 64 MiB; `off`, no bound; else bytes (≥ 1)."""
    env = os.environ if env is None else env
    value = env.get("TURNKIT_MAX_BODY_BYTES", "").strip()
    if not value:
        return DEFAULT_MAX_BODY_BYTES
    bound = _count(env, "TURNKIT_MAX_BODY_BYTES")
    if bound is not None and bound < 1:
        raise ConfigurationError(f"TURNKIT_MAX_BODY_BYTES={value!r} is not at least 1 (or 'off')")
    return bound


def auth_from_env(env: Mapping[str, str] | None = None) -> AuthDependency | None:
    """`TURNKIT_AUTH`: the app's FastAPI auth dependency, by `package.module:name`.

    Unset or empty: None (every caller is anonymous).

    Raises:
        ConfigurationError: it cannot be imported, or is not callable.
    """
    env = os.environ if env is None else env
    spec = env.get("TURNKIT_AUTH", "").strip()
    if not spec:
        return None
    found = import_object(spec, f"TURNKIT_AUTH={spec!r}")
    if not callable(found):
        raise ConfigurationError(f"TURNKIT_AUTH={spec!r} is not a function (a dependency)")
    return cast(AuthDependency, found)


def allowed_hosts_from_env(env: Mapping[str, str] | None = None) -> list[str] | None:
    """`TURNKIT_ALLOWED_HOSTS`: host names, comma-separated; unset or empty: None (any)."""
    env = os.environ if env is None else env
    hosts = [h.strip() for h in env.get("TURNKIT_ALLOWED_HOSTS", "").split(",") if h.strip()]
    return hosts or None


def allowed_origins_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """`TURNKIT_ALLOWED_ORIGINS`: origins trusted beside the app's own, comma-separated.

    Unset or empty: none. `*` trusts every origin (no cross-origin check).

    Raises:
        ConfigurationError: one is not `scheme://host[:port]` (or `*`).
    """
    env = os.environ if env is None else env
    given = env.get("TURNKIT_ALLOWED_ORIGINS", "").split(",")
    return list(checked_origins(given, source="TURNKIT_ALLOWED_ORIGINS"))


_PAGE_CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",  # its own modules: no inline script, no eval
        "style-src 'self'",  # its own style sheet: no inline style
        "img-src 'self' data:",  # its icon is `data:,`
        "connect-src 'self'",  # its API and streams, on its own origin
        "base-uri 'none'",
        "form-action 'none'",  # its forms are sent by script, never as a navigation
        "frame-ancestors 'none'",  # it holds Approve buttons: no other site may frame it
    )
)
"""The chat page's `Content-Security-Policy`: should anything on it ever parse the model's
text as HTML, the browser still runs no script and loads nothing from elsewhere."""

_PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Frame-Options": "DENY",  # as `frame-ancestors 'none'`, for browsers older than CSP 2
    "Content-Security-Policy": _PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    # Not `no-referrer`: that makes a browser send `Origin: null` with the page's own POSTs,
    # which CrossOriginProtection refuses over plain HTTP.
    "Referrer-Policy": "same-origin",
}


class _PageFiles(StaticFiles):
    """The page's static files, revalidated on every load so an upgrade never mixes versions."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_PAGE_HEADERS)
        return response


_HEALTH_PATHS = ("/healthz", "/readyz")
"""`create_health_router`'s probes, at the app's root: answered whatever the `Host`."""


def create_app(
    runtime: SessionRuntime | None = None,
    *,
    keepalive_s: float = 10.0,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    auth: AuthDependency | None = None,
    allowed_hosts: Sequence[str] | None = None,
    allowed_origins: Sequence[str] = (),
) -> FastAPI:
    """A FastAPI app with turnkit's routes, the chat page and the protocol adapters.

    turnkit's routes are under `/api/harness`, the page at `/`, the AI SDK's chat routes
    at `/api/chat` and AG-UI's endpoint at `/api/agui/run`. `keepalive_s` is how often an
    idle stream sends a `: keep-alive` comment. A request body over `max_body_bytes` is refused
    with 413 `content-too-large` while it arrives (None: no bound).

    `auth` is your FastAPI dependency naming the caller (see `create_turnkit_router`);
    without one every caller is anonymous and sees every anonymous session: serve the app
    to one person, or behind a proxy that authenticates. `allowed_hosts` are the host
    names it answers to (None: any); others get 400 `host-not-allowed`, except the health
    probes (`/healthz`, `/readyz`), which are sent by address. A POST (or any
    method but GET, HEAD and OPTIONS) a browser sends from another origin than the app's
    own gets 403 `cross-origin-request`, unless that origin is in `allowed_origins`
    (`["*"]`: any origin; see `CrossOriginProtection`).
    """
    trusted = checked_origins(allowed_origins, source="allowed_origins")  # now, not later
    rt = runtime or runtime_from_env()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        flush = configure_once(err=sys.stderr)  # as `turnkit serve`: OTEL_* asks for it
        await rt.open()
        try:
            yield
        finally:
            await rt.close()
            await rt.replay.close()
            if flush is not None:
                flush()

    application = FastAPI(title="turnkit", version="0.1.0", lifespan=lifespan)
    caller = auth or anonymous
    application.include_router(create_turnkit_router(rt, keepalive_s=keepalive_s, auth=caller))
    application.include_router(create_health_router(rt))
    application.include_router(create_ai_sdk_router(rt, keepalive_s=keepalive_s, auth=caller))
    application.include_router(create_agui_router(rt, keepalive_s=keepalive_s, auth=caller))
    install_problem_handlers(application)
    if max_body_bytes is not None:
        bound = checked_bound(max_body_bytes)  # now, not at the first request
        application.add_middleware(RequestBodyLimit, max_bytes=bound)
    # Added before TrustedHosts, so inside it: a request for another host is 400 first.
    application.add_middleware(CrossOriginProtection, origins=trusted)
    if allowed_hosts is not None:  # probes by address (compose, a kubelet) are answered
        application.add_middleware(TrustedHosts, hosts=allowed_hosts, exempt=_HEALTH_PATHS)

    @application.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def chat_page() -> FileResponse:
        return FileResponse(_PAGE / "index.html", headers=_PAGE_HEADERS)

    application.mount("/page", _PageFiles(directory=_PAGE), name="page")
    application.state.runtime = rt
    return application


app = create_app(
    max_body_bytes=max_body_bytes_from_env(),
    auth=auth_from_env(),
    allowed_hosts=allowed_hosts_from_env(),
    allowed_origins=allowed_origins_from_env(),
)
