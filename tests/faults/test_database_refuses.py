"""A PostgreSQL server that answers but takes no writes (read-only after a failover, a full
disk) is an outage to ride out: nothing is half-written, HTTP says 503, and a turn whose
checkpoint it refused is left for recovery, not failed for good."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI

from tests.conftest import POSTGRES_URL, require_service
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.errors import StoreUnavailableError
from turnkit.http import create_health_router, create_turnkit_router, install_problem_handlers
from turnkit.ids import SessionId
from turnkit.store.sql import RETIRE_INTERVAL_S, SqlStore, database_refused
from turnkit.testing import ModelStep, ScriptedModel


@pytest.fixture
async def read_only() -> AsyncIterator[tuple[str, str]]:
    """(URL of a role whose transactions are read-only, schema set up for it)."""
    require_service("PostgreSQL", "127.0.0.1", 5432)
    role, schema = f"tk_ro_{uuid.uuid4().hex[:8]}", f"tk_test_{uuid.uuid4().hex[:12]}"
    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=schema)
    async with SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config):
        pass  # the tables and the checkpoints', as a writable role made them
    admin = await asyncpg.connect(POSTGRES_URL)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
        await admin.execute(f'GRANT ALL ON SCHEMA "{schema}" TO {role}')
        await admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO {role}')
        await admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}')
        yield POSTGRES_URL.replace("postgres@", f"{role}@", 1), schema
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_a_read_only_server_is_unavailable_not_a_bug(read_only: tuple[str, str]) -> None:
    url, schema = read_only
    store = SqlStore.from_url(url, schema=schema)
    try:
        with pytest.raises(StoreUnavailableError, match="is read-only") as caught:
            await store.create_session(
                SessionId("s1"), principal=None, organisation=None, title=None
            )
        assert "retry shortly" in caught.value.message
    finally:
        await store.close()

    config = RuntimeConfig(database_url=url, database_schema=schema, auto_migrate=False)
    starting = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    with pytest.raises(StoreUnavailableError, match="takes no writes now") as refused:
        await starting.open()  # one line from `turnkit serve`, not a driver's traceback
    assert str(refused.value).count("[store-unavailable;") == 1, refused.value  # one code
    await starting.close()

    # A process that opened before the server turned read-only: its Store now refuses.
    store = SqlStore.from_url(url, schema=schema)
    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=schema)
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config, store=store)
    app = FastAPI()
    install_problem_handlers(app)
    app.include_router(create_turnkit_router(runtime))
    await runtime.open()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            answer = await http.post("/api/harness/sessions/s1/execute", json={"content": "hi"})
    finally:
        await runtime.close()
        await store.close()
    assert answer.status_code == 503, answer.text  # was a bare 500 "Internal Server Error"
    assert answer.json()["code"] == "store-unavailable"
    assert answer.headers["retry-after"]


async def _refusal(read_only: tuple[str, str]) -> BaseException:
    """The error a read-only server raises for a write, as asyncpg gives it."""
    url, schema = read_only
    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        await conn.execute("INSERT INTO tk_sessions (session_id) VALUES ('x')")
    except asyncpg.PostgresError as exc:
        return exc
    finally:
        await conn.close()
    raise AssertionError("the role wrote")


async def test_a_checkpoint_the_server_refuses_leaves_the_turn_to_recovery(
    read_only: tuple[str, str],
) -> None:
    refusal = await _refusal(read_only)
    assert database_refused(refusal)
    _, schema = read_only
    config = RuntimeConfig(
        database_url=POSTGRES_URL, database_schema=schema, lease_ttl_s=1.0, max_attempts=3
    )
    model = ScriptedModel([ModelStep.text_reply("Answered on the second attempt.")])
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        saver: Any = runtime._graph.checkpointer  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage]
        put = saver.aput
        refused = []

        async def refuse_once(*args: Any, **kwargs: Any) -> Any:
            if not refused:
                refused.append(True)
                async with saver._connection():  # the saver's own connection is refused:
                    raise refusal  # the disk filled up, or the server became a replica
            return await put(*args, **kwargs)

        saver.aput = refuse_once
        submission = await runtime.start("s1", "hello")
        async with asyncio.timeout(20):
            while not refused:
                await asyncio.sleep(0.02)
        for _ in range(50):  # a second: the old code failed the turn at once
            record = await runtime.turn(submission.turn_id)
            if record.status != "running":
                break
            await asyncio.sleep(0.02)
        assert record.status == "running"  # not `failed`: nothing was wrong with the turn
        assert record.error_code is None

    recovery = RuntimeConfig(
        database_url=POSTGRES_URL,
        database_schema=schema,
        lease_ttl_s=1.0,
        recover_in_process=True,
    )
    again = ScriptedModel([ModelStep.text_reply("Answered on the second attempt.")])
    async with SessionRuntime(agent=Agent(model=again), config=recovery) as runtime:
        async with asyncio.timeout(30):
            while (record := await runtime.turn(submission.turn_id)).status == "running":
                await asyncio.sleep(0.1)
    assert record.status == "succeeded"
    assert record.attempts == 2


async def test_an_app_error_that_looks_like_an_outage_still_fails_the_turn(
    tmp_path: Any,
) -> None:
    """Only the database's own refusals leave a turn to recovery, not any OSError."""
    assert not database_refused(FileNotFoundError("settings.toml"))
    assert not database_refused(ConnectionRefusedError("the app's own service"))

    def deps(scope: Any) -> object:
        raise FileNotFoundError("settings.toml")

    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'app.db'}")
    model = ScriptedModel([ModelStep.text_reply("never")])
    async with SessionRuntime(agent=Agent(model=model), config=config, deps=deps) as runtime:
        async with asyncio.timeout(20):
            events = [e async for e in runtime.execute_message("s1", "hello")]
    assert events[-1].type == "done"
    assert (events[-1].status, events[-1].error_code) == ("failed", "internal-error")


@pytest.fixture
async def failover() -> AsyncIterator[tuple[str, str, Any]]:
    """(URL of a writable role, its schema, `turn(read_only)`) to play a failover.

    `turn(True)` is the failover's first half: the server restarts (the role's
    connections are cut) and new connections land on a read-only server, as when a
    DNS name still points at the old primary, now a replica. `turn(False)` is the
    second half: new connections reach the new primary; old ones stay where they were.
    """
    require_service("PostgreSQL", "127.0.0.1", 5432)
    role, schema = f"tk_fo_{uuid.uuid4().hex[:8]}", f"tk_test_{uuid.uuid4().hex[:12]}"
    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=schema)
    async with SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config):
        pass
    admin = await asyncpg.connect(POSTGRES_URL)

    async def turn(read_only: bool) -> None:
        if read_only:
            await admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
            )
        else:
            await admin.execute(f"ALTER ROLE {role} RESET default_transaction_read_only")

    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f'GRANT ALL ON SCHEMA "{schema}" TO {role}')
        await admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO {role}')
        await admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA "{schema}" TO {role}')
        yield POSTGRES_URL.replace("postgres@", f"{role}@", 1), schema, turn
    finally:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def _first_success(write: Any, tries: int = 4) -> int:
    """How many tries `write()` took: each refusal may retire the connections it used."""
    for attempt in range(1, tries + 1):
        try:
            await write()
        except StoreUnavailableError:
            continue
        return attempt
    raise AssertionError(f"still refused after {tries} tries: connections to the old server")


async def test_after_a_failover_connections_to_the_read_only_server_are_retired(
    failover: tuple[str, str, Any],
) -> None:
    url, schema, turn = failover
    config = RuntimeConfig(database_url=url, database_schema=schema, auto_migrate=False)
    model = ScriptedModel([ModelStep.text_reply("Written on the new primary.")], repeat_last=True)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        saver: Any = runtime._graph.checkpointer  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage]
        store = runtime.store
        names = iter(range(1000))

        async def session() -> None:  # SQLAlchemy's pool
            await store.create_session(SessionId(f"s{next(names)}"))

        async def message() -> None:  # the driver's pool
            await runtime.start(f"m{next(names)}", "hello")

        async def checkpoint() -> None:  # the checkpointer's pool
            try:
                await saver.adelete_threads([f"t{next(names)}"])
            except asyncpg.PostgresError as exc:
                if database_refused(exc):
                    raise StoreUnavailableError(str(exc)) from exc
                raise

        await turn(True)  # the old primary restarts as a replica, still under the name
        for write in (session, message, checkpoint):
            for _ in range(3):  # every pooled connection now reaches the read-only server
                with pytest.raises(StoreUnavailableError):
                    await write()
        await turn(False)  # the name now reaches the new primary
        # The first refusal retired each pool at once; those after it, within the interval,
        # held their retirement back until it ends (a server that stays read-only is not
        # reconnected to on every refusal): once it has, the next write connects afresh.
        await asyncio.sleep(RETIRE_INTERVAL_S)
        tries = {w.__name__: await _first_success(w) for w in (session, message, checkpoint)}
        assert set(tries.values()) == {1}, tries  # the refusals retired the old connections

        async with asyncio.timeout(30):
            events = [e async for e in runtime.execute_message("after", "hello")]
        assert events[-1].type == "done"
        assert events[-1].status == "succeeded"


async def test_readyz_is_not_ready_while_the_server_takes_no_writes(
    failover: tuple[str, str, Any],
) -> None:
    """A load balancer stops sending writes to a process whose database became a replica."""
    url, schema, turn = failover
    config = RuntimeConfig(database_url=url, database_schema=schema, auto_migrate=False)
    async with SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config) as runtime:
        app = FastAPI()
        app.include_router(create_health_router(runtime))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            assert (await http.get("/readyz")).status_code == 200
            await turn(True)  # the failover's first half: the old primary, now a replica
            await http.get("/readyz")  # may meet a connection the restart cut: unavailable
            for _ in range(2):  # its connections retired, the next ones reach it again
                readyz = await http.get("/readyz")
                assert readyz.status_code == 503  # was 200: its check was a read
                assert "store: read-only" in readyz.json()["detail"]
            await turn(False)  # the name reaches the new primary: ready at the next check
            await asyncio.sleep(RETIRE_INTERVAL_S)  # after the retirement held back
            assert (await http.get("/readyz")).status_code == 200


async def test_an_apps_own_read_only_postgres_still_fails_the_turn(
    read_only: tuple[str, str],
) -> None:
    """Only turnkit's own connections' refusals are outages, not a replica the app writes to."""
    url, schema = read_only

    async def deps(scope: Any) -> object:
        conn = await asyncpg.connect(url, server_settings={"search_path": schema})
        try:  # the app's own replica: read-only
            await conn.execute("INSERT INTO tk_sessions (session_id) VALUES ('x')")
        finally:
            await conn.close()
        return conn

    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=schema)
    model = ScriptedModel([ModelStep.text_reply("never")])
    async with SessionRuntime(agent=Agent(model=model), config=config, deps=deps) as runtime:
        async with asyncio.timeout(20):  # it hung: the turn was left for a recovery
            events = [e async for e in runtime.execute_message("s1", "hello")]
    assert events[-1].type == "done"
    assert (events[-1].status, events[-1].error_code) == ("failed", "internal-error")


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """New connections asyncpg opens (SQLAlchemy's and asyncpg's pools), by role."""
    opened: dict[str, int] = {}
    connect = asyncpg.connection.connect

    async def counted(dsn: Any = None, *args: Any, **kwargs: Any) -> Any:
        conn = await connect(dsn, *args, **kwargs)
        user = conn.get_settings().session_authorization or ""
        opened[user] = opened.get(user, 0) + 1
        return conn

    monkeypatch.setattr(asyncpg.connection, "connect", counted)
    monkeypatch.setattr(asyncpg, "connect", counted)
    return opened


async def test_a_server_that_stays_read_only_costs_few_reconnects(
    read_only: tuple[str, str], connections: dict[str, int]
) -> None:
    """Each refusal retired the pool: a deliberately read-only server was a reconnect storm."""
    from turnkit.graph._postgres_saver import AsyncPgSaver

    url, schema = read_only
    role = url.split("://", 1)[1].split("@", 1)[0]
    probes = 20
    store = SqlStore.from_url(url, schema=schema)
    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=schema)
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config, store=store)
    app = FastAPI()
    app.include_router(create_health_router(runtime))
    await runtime.open()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            for _ in range(probes):  # a load balancer's probes
                readyz = await http.get("/readyz")
                assert readyz.status_code == 503
                assert "store: read-only" in readyz.json()["detail"]
        probed, connections[role] = connections.get(role, 0), 0
        for n in range(probes):  # SQLAlchemy's pool
            with pytest.raises(StoreUnavailableError, match="is read-only"):
                await store.create_session(SessionId(f"s{n}"))
        for n in range(probes):  # the driver's pool
            with pytest.raises(StoreUnavailableError, match="is read-only"):
                await runtime.start(f"m{n}", "hello")
        written, connections[role] = connections.get(role, 0), 0
    finally:
        await runtime.close()
        await store.close()

    pool = await asyncpg.create_pool(url, min_size=0, max_size=10,
                                     server_settings={"search_path": schema})  # fmt: skip
    saver = AsyncPgSaver(pool)
    try:
        for n in range(probes):  # the checkpointer's pool
            with pytest.raises(StoreUnavailableError, match="is read-only"):
                await saver.adelete_threads([f"t{n}"])
    finally:
        await pool.close()
    checkpointed = connections.get(role, 0)
    counts = {"readyz": probed, "writes": written, "checkpoints": checkpointed}
    print(f"new connections over {probes} refusals each: {counts}")
    # At most one retirement a pool while the refusals last (a few seconds at most):
    # the first refusal's, maybe one more; the pools' first connections besides.
    assert probed <= 3, counts  # was one a probe
    assert written <= 6, counts  # was one a refused write
    assert checkpointed <= 3, counts
