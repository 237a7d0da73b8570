"""Where `SqlStore` runs its transactions: URLs, engines, connections, errors.

`SqlEngine` is the plumbing `SqlStore` inherits: PostgreSQL on the async engine (asyncpg),
with a turn's hot statements on an asyncpg pool of their own (`PgConnections`, its base in
`_engine_pg`, which also tells a database out of reach from a bad statement); SQLite on
plain `sqlite3` connections — in place on the event loop when a transaction need not wait,
else on one dedicated thread — with SQLAlchemy's engine only for migrations.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Self, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from turnkit.clock import Clock, SystemClock
from turnkit.config import check_schema_name, database_url_problem
from turnkit.errors import ConfigurationError, StoreError
from turnkit.store import _sqlite as sqlite_conn
from turnkit.store._commit_sql import HotStatements
from turnkit.store._engine_pg import (
    PgConnections,
    first_line,
    is_unreachable,
    shown_url,
    unstorable_text,
)
from turnkit.store._folds import WalFolds
from turnkit.store._group_commit import GroupCommit
from turnkit.store.migrate import current_revision, upgrade

__all__ = ("SqlEngine", "close_lock_wait_s", "closing_within", "normalize_url")

T = TypeVar("T")
_THREAD_WAIT_MS = 30_000
"""How long the store's thread waits for SQLite's write lock before giving up."""
CLOSE_LOCK_WAIT_S = 2.0
"""On close, how long work still queued on the store's thread may wait for SQLite's lock
(another process's open transaction) before it gives up."""
_CLOSE_BY: ContextVar[float | None] = ContextVar("turnkit_close_by", default=None)
_CHECKPOINT_EVERY = 256
"""Commits on the loop's connection between two WAL folds on the store's thread."""


@contextlib.contextmanager
def closing_within(seconds: float | None = None) -> Iterator[None]:
    """Closes inside wait for SQLite's lock `seconds` from now all told, not each that long.

    `seconds` is `CLOSE_LOCK_WAIT_S` unless given. A runtime closes its checkpointer,
    then its store: behind locks another process holds, each would wait its own
    `CLOSE_LOCK_WAIT_S`, one after the other.
    """
    wait_s = CLOSE_LOCK_WAIT_S if seconds is None else seconds
    token = _CLOSE_BY.set(time.monotonic() + wait_s)
    try:
        yield
    finally:
        _CLOSE_BY.reset(token)


def close_lock_wait_s() -> float:
    """How long a close may still wait for SQLite's lock (see `closing_within`)."""
    by = _CLOSE_BY.get()
    return CLOSE_LOCK_WAIT_S if by is None else max(0.0, by - time.monotonic())


def normalize_url(url: str) -> str:
    """The SQLAlchemy URL: SQLite as given (plain `sqlite3`), `postgresql://` → asyncpg."""
    if url.startswith("sqlite:///") or url == "sqlite://":
        return url
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    return url


class SqlEngine(PgConnections):
    """The engines, connections and transactions under a `SqlStore` (see the module doc)."""

    def __init__(self, url: str, *, clock: Clock | None = None, schema: str | None = None) -> None:
        super().__init__()
        self.url = normalize_url(url)
        problem = database_url_problem(url)  # as RuntimeConfig refuses it, for a Store built here
        if problem is not None:
            raise StoreError(problem)
        if schema is not None:
            check_schema_name(schema)
            if self.url.startswith("sqlite"):  # as RuntimeConfig refuses it
                raise ConfigurationError(
                    f"database schema {schema!r} applies to PostgreSQL only: SQLite keeps "
                    "turnkit's tables in the database file (name another file instead)",
                    schema=schema,
                )
        self.schema = schema
        self._clock = clock or SystemClock()
        self._thread: ThreadPoolExecutor | None = None
        self._migrator: Engine | None = None
        self._path: str | None = None
        self._on_thread: sqlite_conn.SqliteConnection | None = None
        self._on_loop: sqlite_conn.SqliteConnection | None = None
        self._loop_thread = 0
        self._closed = False
        self._conn_lock = threading.Lock()
        self._folds: WalFolds | None = None
        """WAL folds on the store's thread for the loop's connection (file databases)."""
        self._lock_wait = sqlite_conn.LockWait(_THREAD_WAIT_MS)
        """How the store's thread waits for SQLite's write lock (given up on close)."""
        self._group: GroupCommit | None = None
        """Write transactions on the store's thread, committed together (file databases)."""
        if self.url.startswith("sqlite"):
            sa_url = make_url(self.url).set(drivername="sqlite")  # whatever driver was named
            path = sa_url.database or ":memory:"
            self._path = path
            self._insert: Any = sqlite.insert
            # SQLAlchemy's engine only runs migrations; statements go through `_sqlite`.
            if path == ":memory:":
                # One connection holds the database, so everything runs on it, in place.
                shared = sqlite_conn.connect(path, busy_timeout_ms=0, autocheckpoint=True)
                self._on_loop = self._on_thread = shared
                self._migrator = create_engine(
                    "sqlite://", creator=lambda: shared.raw, poolclass=StaticPool
                )
            else:
                self._migrator = create_engine(
                    sa_url,
                    connect_args={"timeout": 30, "check_same_thread": False},
                )
                _tune_sqlite(self._migrator)
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnkit-sqlite")
                self._folds = WalFolds(self._thread, self._fold_wal, every=_CHECKPOINT_EVERY)
                self._group = GroupCommit(self._thread, self._thread_conn, self._busy_too_long)
        elif self.url.startswith("postgresql"):
            self._open_async_engine()
            self._insert = postgresql.insert
        else:
            raise StoreError(f"SqlStore supports SQLite and PostgreSQL, not {shown_url(url)!r}")
        self._hot = HotStatements(self._insert)

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return "sqlite" if self._path is not None else "postgresql"

    async def _tx(
        self, fn: Callable[..., T], *args: Any, write: bool = True, behind: bool = False
    ) -> T:
        """Run `fn(conn, *args)` in one transaction (SQLite: on the store's thread).

        `behind`: new work, committed after the writes of work in progress queued with it.
        """
        if self._closed:
            raise StoreError("the store is closed", url=self._shown_url())
        if self._path == ":memory:":
            assert self._on_loop is not None
            with self._conn_lock, self._on_loop.transaction(write=write) as conn:  # one connection
                return fn(conn, *args)
        if self._thread is not None:
            if write:  # with the other turns' writes queued meanwhile, in one transaction
                assert self._group is not None
                return await self._group.run(fn, *args, behind=behind)

            def once() -> T:
                with self._thread_conn().transaction(write=write) as conn:
                    return fn(conn, *args)

            def run() -> T:  # a read: tried again while it meets a lock, as a write waits
                try:
                    return self._lock_wait.retry(once, busy=sqlite_conn.busy_error)
                except sqlite_conn.BusyError as exc:
                    raise self._busy_too_long(exc) from exc

            return await asyncio.get_running_loop().run_in_executor(self._thread, run)
        assert self._async_engine is not None
        try:
            async with self._async_engine.begin() as aconn:
                return await aconn.run_sync(fn, *args)
        except (DBAPIError, OSError) as exc:
            if is_unreachable(exc):
                raise self._unavailable(exc) from exc
            refused = unstorable_text(exc)
            if refused is not None:
                raise refused from exc
            raise

    def _busy_too_long(self, exc: BaseException) -> BaseException:
        """What a transaction on the store's thread raises when it failed (as it is)."""
        if not isinstance(exc, sqlite_conn.BusyError):
            return exc
        held = (
            "when the store closed"
            if self._lock_wait.given_up
            else f"for {_THREAD_WAIT_MS / 1000:g} s"
        )
        error = StoreError(
            f"the SQLite database {self._path!r} stayed locked by another connection "
            f"{held}; nothing was written",
            path=self._path,
        )
        error.__cause__ = exc
        return error

    def _thread_conn(self) -> sqlite_conn.SqliteConnection:
        """The store thread's connection (waits up to `_THREAD_WAIT_MS` for the write lock)."""
        if self._on_thread is None:
            assert self._path is not None
            self._on_thread = sqlite_conn.connect(
                self._path,
                busy_timeout_ms=_THREAD_WAIT_MS,
                autocheckpoint=True,
                lock_wait=self._lock_wait,
            )
        return self._on_thread

    async def _hot_tx(
        self, fn: Callable[..., T], *args: Any, write: bool = True, behind: bool = False
    ) -> T:
        """`_tx` for the per-turn path: on SQLite, run on the event loop if it need not wait.

        A short SQLite transaction costs tens of microseconds, less than the hop to a
        thread, so it runs in place — with a zero busy timeout, so the loop never waits
        for a lock: if another connection holds it, the transaction goes to the store's
        thread and waits there. Nothing was written by the attempt (BEGIN IMMEDIATE takes
        the lock before any statement runs). The connection belongs to the first thread
        that uses it; a store shared with another thread's loop sends that loop's
        transactions to the store's thread.
        """
        if self._thread is None or self._closed:
            return await self._tx(fn, *args, write=write, behind=behind)
        if self._on_loop is None:
            with self._conn_lock:
                if self._on_loop is None:
                    assert self._path is not None
                    self._loop_thread = threading.get_ident()
                    self._on_loop = sqlite_conn.connect(
                        self._path, busy_timeout_ms=0, autocheckpoint=False
                    )
        folds = self._folds
        assert folds is not None
        if write and folds.must_wait():
            # behind the fold, on the thread
            return await self._tx(fn, *args, write=write, behind=behind)
        if self._loop_thread != threading.get_ident():
            return await self._tx(fn, *args, write=write, behind=behind)  # another thread's loop
        try:
            with self._on_loop.transaction(write=write) as conn:
                result = fn(conn, *args)
        except sqlite_conn.BusyError:
            return await self._tx(fn, *args, write=write, behind=behind)
        if write:
            folds.committed()
        return result

    def _fold_wal(self, second_pass: bool) -> None:
        """Checkpoint the WAL on the store's thread (scheduled by `WalFolds`)."""
        self._thread_conn().raw.execute("PRAGMA wal_checkpoint(PASSIVE)").close()

    async def setup(self) -> None:
        """Bring the schema up to date (Alembic migrations; safe to run concurrently)."""

        def migrate(conn: Connection) -> None:
            if conn.dialect.name == "postgresql":
                # One migrator at a time across processes; released at commit.
                conn.execute(text("SELECT pg_advisory_xact_lock(7413620511)"))
                if self.schema is not None:
                    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))
            upgrade(conn)

        await self._migrate(migrate)

    async def schema_revision(self) -> str | None:
        """The schema revision the database is at (None before the first upgrade)."""
        return await self._migrate(current_revision)

    async def _migrate(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` on a SQLAlchemy connection (Alembic needs one) in one transaction."""
        if self._migrator is not None:
            engine = self._migrator

            def run() -> T:
                with engine.begin() as conn:
                    return fn(conn)

            try:
                if self._thread is None:  # in memory: the one connection is used in place
                    return run()
                return await asyncio.get_running_loop().run_in_executor(self._thread, run)
            except DBAPIError as exc:
                reason = first_line(exc.orig or exc)
                raise StoreError(
                    f"cannot use the SQLite database {self._path!r}: {reason} "
                    "(does its folder exist, and may this process write there?)",
                    path=self._path,
                ) from exc
        assert self._async_engine is not None
        try:
            async with self._async_engine.begin() as aconn:
                return await aconn.run_sync(fn)
        except (DBAPIError, OSError) as exc:
            if is_unreachable(exc):
                raise self._unavailable(exc) from exc
            if isinstance(exc, DBAPIError):  # a login, database or permission refused
                raise StoreError(
                    f"cannot use the PostgreSQL database {self._shown_url()}: "
                    f"{first_line(exc.orig or exc)}",
                    url=self._shown_url(),
                ) from exc
            raise

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Dispose the engine and stop the SQLite thread (idempotent).

        Work already handed to the store's thread finishes first; calls after this raise
        `StoreError`.
        """
        self._closed = True
        if self._migrator is not None:
            engine, self._migrator = self._migrator, None
            on_loop, self._on_loop = self._on_loop, None
            if self._thread is None:  # in memory: one connection, closed with the engine
                self._on_thread = None
                engine.dispose()
                if on_loop is not None:
                    on_loop.close()
                return
            if self._folds is not None:
                await self._folds.wait()

            def dispose() -> None:
                # Runs after everything queued before it, so it closes whatever they opened.
                on_thread, self._on_thread = self._on_thread, None
                if on_thread is not None:
                    with contextlib.suppress(sqlite3.Error):
                        on_thread.raw.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    on_thread.close()
                engine.dispose()

            if on_loop is not None:
                on_loop.close()
            disposed = asyncio.get_running_loop().run_in_executor(self._thread, dispose)
            # Queued writes may wait for a lock another process holds: not for long.
            done, _ = await asyncio.wait([disposed], timeout=close_lock_wait_s())
            if not done:
                self._lock_wait.give_up()
            await disposed
            self._thread.shutdown(wait=True)
        await self._close_pg()


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        sqlite_conn.tune(dbapi_conn, busy_timeout_ms=_THREAD_WAIT_MS)
