"""FastAPI routes for turnkit: execute with resumable SSE, resume, cancel, sessions, files, audit.

```python
app = FastAPI()
app.include_router(create_turnkit_router(runtime, auth=current_user))
install_problem_handlers(app)
```
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from turnkit.errors import ConfigurationError, RuntimeClosedError, missing_extra

try:
    from fastapi import APIRouter, Depends, Response
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing_extra("The HTTP routes", "fastapi", exc) from exc

from turnkit._problems import opened
from turnkit.http._access import Principal
from turnkit.http._admin import add_budget_routes, add_callback_routes
from turnkit.http._session_routes import add_session_routes
from turnkit.http._turn_routes import TURN_ID_HEADER, add_turn_routes
from turnkit.http.problems import (
    MEDIA_TYPE,
    Problem,
    ProblemRoute,
    install_problem_handlers,
    problem_response,
)
from turnkit.runtime import SessionRuntime
from turnkit.runtime.deps import NO_DEPS
from turnkit.store import Store
from turnkit.tenancy import (
    AuthDependency,
    Principal as TenantPrincipal,
    anonymous,
    principal_from_auth,
)

__all__ = (
    "TURN_ID_HEADER",
    "AuthDependency",
    "create_health_router",
    "create_turnkit_router",
    "install_problem_handlers",
)


_PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {MEDIA_TYPE: {}}}
    for status in (400, 401, 403, 404, 409, 416, 422, 503)  # 401/403: `auth`, admission
}


READY_STORE_TIMEOUT_S = 1.5
"""How long `/readyz` waits for the Store before it answers 503 (a database that hangs)."""
READY_REPLAY_TIMEOUT_S = 1.0
"""How long `/readyz` waits for the replay buffer before it says `degraded`."""
READY_REPLAY_KEPT_S = 2.0
"""How long `/readyz` reuses a replay buffer that answered `ok` instead of asking again:
probes from several load balancers (and an orchestrator) each second cost Redis one check
in this time, not one each. A `degraded` answer is never reused."""


_T = TypeVar("_T")


async def _within(check: Awaitable[_T], seconds: float) -> _T:
    """`check`'s answer, awaited for at most `seconds`; TimeoutError after that.

    A check that overruns is cancelled without waiting for it: cancelling a call on a
    connection that hangs can itself take seconds, and a probe must answer on time.
    """
    task = asyncio.ensure_future(check)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieved)
        raise TimeoutError(f"no answer within {seconds:g} s")
    return task.result()


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Take an abandoned check's outcome, so asyncio does not report it as never read."""
    if not task.cancelled():
        task.exception()


def _caller_dependency(auth: AuthDependency) -> Callable[..., Awaitable[Principal]]:
    """The dependency for the caller: `auth`'s answer as a principal (None: anonymous)."""

    async def who(found: Annotated[Any, Depends(auth)]) -> TenantPrincipal | None:
        return principal_from_auth(found)

    return who


async def _no_deps() -> Any:
    return NO_DEPS


def create_turnkit_router(
    runtime: SessionRuntime,
    *,
    auth: AuthDependency = anonymous,
    prefix: str = "/api/harness",
    max_frame_bytes: int = 1_000_000,
    keepalive_s: float = 10.0,
    deps: Callable[..., Any] | None = None,
) -> APIRouter:
    """Routes for `runtime` under `prefix`.

    `auth` is a FastAPI dependency returning the caller: a `turnkit.Principal`
    (organisation, department, roles), a bare principal id, or None for anonymous use.
    Sessions belong to the principal that created them; a session or turn of another
    principal answers 404, exactly like one that does not exist. Every message passes the
    runtime's admission chain (a refusal is a 403 problem naming the check); the budget
    routes need the `admin` role; callbacks authenticate with their turn's token instead.

    `deps` is a FastAPI dependency returning the app's dependencies for the turn a
    request starts or resumes (`ToolContext.deps`); where the turn is driven elsewhere
    (a worker, after a restart) the runtime's own `deps` factory builds them.

    A runtime nobody opened opens at the first request, as at its first message in Python
    (close it in your app's lifespan all the same: see `SessionRuntime.close`); a closed
    one answers 503 `runtime-closed`.
    """
    router = APIRouter(
        prefix=prefix,
        tags=["turnkit"],
        responses=_PROBLEMS,
        route_class=ProblemRoute,
        dependencies=[Depends(opened(runtime))],  # a runtime nobody opened opens here
    )
    who = _caller_dependency(auth)
    # No two routes answer the same method and path: this order only orders the OpenAPI paths.
    add_turn_routes(
        router,
        runtime,
        who=who,
        deps=deps or _no_deps,
        keepalive_s=keepalive_s,
        max_frame_bytes=max_frame_bytes,
    )
    add_session_routes(router, runtime, who=who)
    add_budget_routes(router, runtime, who)
    add_callback_routes(router, runtime)
    return router


async def _store_check(runtime: SessionRuntime) -> str:
    """`ok`, or why the Store cannot serve: out of reach, hanging, or taking no writes."""
    try:
        refused = await _within(_opened_refusal(runtime), READY_STORE_TIMEOUT_S)
    except TimeoutError:  # a database that hangs
        return f"unavailable: no answer within {READY_STORE_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        # Class names only: the probe is public, and the errors' words name hosts and ports.
        root = exc.__cause__
        return f"unavailable: {type(exc).__name__}" + (f" ({type(root).__name__})" if root else "")
    return "ok" if refused is None else refused


async def _opened_refusal(runtime: SessionRuntime) -> str | None:
    """`_refusal` of the runtime's Store; a runtime without one yet (nobody opened it) opens.

    The opening is shielded: a probe that stops waiting for it does not cancel it halfway.
    """
    try:
        store = runtime.store  # a closed runtime raises `RuntimeClosedError`: not ready
    except ConfigurationError:  # not open: it opens now, as at the routes' first request
        await asyncio.shield(runtime.ensure_open())
        store = runtime.store
    if runtime.closed:  # a Store the app gave outlives the runtime's close
        raise RuntimeClosedError("the runtime is closed")
    return await _refusal(store)


async def _refusal(store: Store) -> str | None:
    """None if the Store answers a read and would take a write; else why it would not."""
    await store.list_sessions(limit=1)
    refuses_writes = getattr(store, "refuses_writes", None)  # `SqlStore`'s
    if refuses_writes is None:
        return None
    refused = await refuses_writes()  # a replica after a failover: no write would work
    return None if refused is None else str(refused)


def create_health_router(runtime: SessionRuntime) -> APIRouter:
    """Health routes for load balancers and orchestrators.

    `GET /healthz`: the process answers. `GET /readyz`: its Store answers too (503
    `not-ready` with `Retry-After` otherwise). The replay buffer is only a fast path:
    while it does not answer, readers follow the Store, so the process stays ready and
    says `"replay": "degraded: …"`; a replay buffer that answered is not asked again for
    `READY_REPLAY_KEPT_S` (one that did not is asked at every probe). A runtime nobody
    opened opens at the first `/readyz` (so a load balancer's probe readies an app whose
    lifespan does not open it); a closed one is not ready.
    """
    router = APIRouter(tags=["health"], route_class=ProblemRoute)

    @router.get("/healthz", summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    answered_at: float | None = None
    """When the replay buffer last answered `ok` (loop time)."""

    async def replay_check() -> str:
        nonlocal answered_at
        now = asyncio.get_running_loop().time()
        if answered_at is not None and now - answered_at < READY_REPLAY_KEPT_S:
            return "ok"
        answered_at = None  # asked again: until it answers, nothing is reused
        try:
            await _within(runtime.replay.ping(), READY_REPLAY_TIMEOUT_S)
        except ConfigurationError as exc:  # it answered: say what it refused
            return f"degraded: {exc}; readers follow the Store"
        except Exception as exc:  # noqa: BLE001 - readers follow the Store meanwhile
            return f"degraded: {type(exc).__name__}; readers follow the Store"
        answered_at = now
        return "ok"

    @router.get(
        "/readyz",
        summary="The Store answers (the replay buffer may be degraded)",
        response_model=None,
    )
    async def readyz() -> Response | dict[str, str]:
        # Both at once: the answer comes within the longer bound, well inside a probe's.
        store, replay = await asyncio.gather(_store_check(runtime), replay_check())
        checks = {"store": store, "replay": replay}
        if checks["store"] == "ok":
            return {"status": "ready", **checks}
        return problem_response(
            503,
            "not-ready",
            "; ".join(f"{k}: {v}" for k, v in checks.items()),
            headers={"Retry-After": "2"},
        )

    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):  # load balancers' HEAD
        router.add_api_route(
            path, probe, methods=["HEAD"], include_in_schema=False, response_model=None
        )
    return router
