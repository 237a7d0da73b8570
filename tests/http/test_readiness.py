"""`/readyz` answers not-ready while the Store cannot be reached."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from tests.support.services import free_port

from turnkit import Agent, SessionRuntime
from turnkit.http import create_health_router
from turnkit.store.sql import SqlStore
from turnkit.testing import ScriptedModel


async def test_readyz_is_not_ready_while_the_store_is_unreachable() -> None:
    # Nothing listens on the port: every connection is refused at once.
    store = SqlStore.from_url(f"postgresql://turnkit@127.0.0.1:{free_port()}/turnkit")
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), store=store)
    app = FastAPI()
    app.include_router(create_health_router(runtime))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}  # the process is up
            readyz = await http.get("/readyz")
    finally:
        await store.close()
    assert readyz.status_code == 503
    assert readyz.headers["content-type"].startswith("application/problem+json")
    assert readyz.headers["Retry-After"] == "2"
    body = readyz.json()
    assert body["code"] == "not-ready"
    assert body["status"] == 503
    assert "store: unavailable: StoreUnavailableError" in body["detail"]
    assert "replay: ok" in body["detail"]  # only the Store is down
