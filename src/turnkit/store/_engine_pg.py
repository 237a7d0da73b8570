"""`PgConnections`: PostgreSQL's connections under a `SqlStore`, and what a lost one raises.

A base of `SqlEngine`: SQLAlchemy's async engine (asyncpg) for most transactions, an
asyncpg pool of its own for a turn's hot statements (`_pg_driver`), and the connection that
hears when a turn becomes claimable (`work_signal`) or is stopped (`stop_signal`). It also
tells a database out of reach (`StoreUnavailableError`) from a bad statement, on either
database.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import unquote, unquote_plus

from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InvalidatePoolError,
    OperationalError,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from turnkit.clock import Clock
from turnkit.config import masked_url
from turnkit.errors import (
    ConfigurationError,
    InvalidInputError,
    StoreError,
    StoreUnavailableError,
    missing_extra,
)
from turnkit.store._asyncpg_pool import NO_STATEMENT_EXPIRY, close_pool, keep_session, pooled
from turnkit.store._listen_pg import Listener

if TYPE_CHECKING:
    import asyncpg

__all__ = (
    "CONNECT_TIMEOUT_S",
    "DRIVER_POOL_SIZE",
    "RETIRE_INTERVAL_S",
    "UNREACHABLE_DRIVER_ERRORS",
    "PgConnections",
    "Retirements",
    "asyncpg_dsn",
    "drop_if_closed",
    "first_line",
    "shown_url",
    "is_unreachable",
    "reached_read_only",
    "tls_file_missing",
    "tls_file_refused",
    "unavailable",
    "unresolved_host",
)

T = TypeVar("T")
DRIVER_POOL_SIZE = 10
"""Connections for PostgreSQL's hot statements (beside SQLAlchemy's pool for the rest)."""
CONNECT_TIMEOUT_S = 10.0
RETIRE_INTERVAL_S = 2.0
"""A pool's connections are retired for a read-only refusal at most once this often.

After a failover the first refusal retires them at once; refusals within the next two
seconds (connections opened while the name still led to the old primary) are held back
and retire them again when the interval ends, at the next connection handed out. A
failover (promotion, then the name moving) takes seconds, so the first write after it
finds the new primary within two seconds; a server that stays read-only (a replica on
purpose, a read-only role) costs each pool one reconnect every two seconds at most,
however many writes or readiness probes it refuses."""


class Retirements:
    """When a pool's connections are retired after read-only refusals: at most once an interval.

    `refused` on each refusal says whether to retire now: the first after an interval
    does; those within it are held back, and `due`, asked before a connection is handed
    out, retires them once the interval has passed. Never more than one retirement an
    interval, and never a refusal left without one.
    """

    def __init__(
        self, monotonic: Callable[[], float], interval_s: float = RETIRE_INTERVAL_S
    ) -> None:
        self._monotonic = monotonic
        self.interval_s = interval_s
        self._last: float | None = None
        self._held = False

    def refused(self) -> bool:
        """A connection met a read-only server: True to retire the pool's connections now."""
        now = self._monotonic()
        if self._last is None or now - self._last >= self.interval_s:
            self._last, self._held = now, False
            return True
        self._held = True
        return False

    def due(self) -> bool:
        """Before a connection is handed out: True to retire now a refusal held back."""
        return self._held and self.refused()


class PgConnections:
    """The PostgreSQL connections under a `SqlEngine` (see the module doc); None on SQLite."""

    url: str
    schema: str | None
    _clock: Clock
    _closed: bool

    def __init__(self) -> None:
        self._async_engine: AsyncEngine | None = None
        self._driver_pool: asyncpg.Pool | None = None
        """PostgreSQL's hot statements, on asyncpg outside SQLAlchemy (`_pg_driver`)."""
        self._driver_pool_lock = asyncio.Lock()
        self._listener: Listener | None = None
        """PostgreSQL: the connection that hears when a turn becomes claimable or stopped."""
        # The pools' own time, not the store's clock (a test's clock may stand still).
        self._engine_retirements = Retirements(time.monotonic)
        """When SQLAlchemy's pool is retired for a read-only refusal."""
        self._driver_retirements = Retirements(time.monotonic)
        """When the driver's pool is retired for a read-only refusal."""

    def _open_async_engine(self) -> None:
        """SQLAlchemy's async engine for `url`, its tables in `schema` when one is given."""
        try:
            import asyncpg  # the `postgres` extra
        except ImportError as exc:
            raise missing_extra("A PostgreSQL database", "postgres", exc) from exc
        dsn, settings, timeout = self._asyncpg_dsn()

        async def connect() -> Any:
            # asyncpg reads the URL's libpq options (`sslmode`, `application_name` …) from
            # the DSN; SQLAlchemy's dialect would pass them on as keywords it refuses.
            return await asyncpg.connect(
                dsn, server_settings=settings, timeout=timeout, **NO_STATEMENT_EXPIRY
            )

        self._async_engine = create_async_engine(
            make_url(self.url).set(query={}),
            async_creator=connect,
            pool_size=10,
            max_overflow=10,
            # Every use is `begin()`, which ends its own transaction: no ROLLBACK on
            # return. A closed connection is caught at checkout (`drop_if_closed`).
            pool_reset_on_return=None,
        )
        event.listen(self._async_engine.sync_engine.pool, "checkout", self._on_checkout)
        event.listen(self._async_engine.sync_engine, "handle_error", self._retire_if_read_only)

    def _on_checkout(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        """SQLAlchemy's `checkout`: no closed connection, and a retirement held back is done."""
        drop_if_closed(dbapi_conn, record, proxy)
        if self._engine_retirements.due():
            raise InvalidatePoolError("the database refused a write as read-only")

    def _retire_if_read_only(self, context: ExceptionContext) -> None:
        """SQLAlchemy's `handle_error`: a read-only refusal invalidates the pool.

        As a lost link does, at most once an interval (`Retirements`).
        """
        if reached_read_only(context.original_exception) and self._engine_retirements.refused():
            context.is_disconnect = True
            context.invalidate_pool_on_disconnect = True

    async def _pg_driver(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `fn(asyncpg_connection, *args)` on a pooled connection, outside SQLAlchemy.

        For statements that are a transaction on their own (see `_commit_pg`): no BEGIN,
        no COMMIT, asyncpg's prepared-statement cache. A database out of reach raises
        `StoreUnavailableError`.
        """
        if self._closed:
            raise StoreError("the store is closed", url=self._shown_url())
        try:
            pool = self._driver_pool or await self._open_driver_pool()
            if self._driver_retirements.due():
                await pool.expire_connections()
            async with pooled(pool) as conn:
                return await fn(conn, *args)
        except Exception as exc:  # the driver's own errors
            if (
                self._driver_pool is not None
                and reached_read_only(exc)
                and self._driver_retirements.refused()
            ):
                await self._driver_pool.expire_connections()
            if is_unreachable(exc):
                raise self._unavailable(exc) from exc
            refused = unstorable_text(exc)
            if refused is not None:
                raise refused from exc
            raise

    async def refuses_writes(self) -> str | None:
        """Why the database would refuse a write now (`read-only`), or None if it would not.

        PostgreSQL: asks a pooled connection whether its transactions are read-only (a
        replica, such as the old primary after a failover); if so, the pool's connections
        are retired, so a later call connects afresh: at most once an interval
        (`RETIRE_INTERVAL_S`), so frequent probes of a server that stays read-only do not
        reconnect every time. SQLite: always None.
        """
        if self._async_engine is None:
            return None
        if await self._pg_driver(_read_only_now) != "on":
            return None
        if self._driver_pool is not None and self._driver_retirements.refused():
            await self._driver_pool.expire_connections()
        return "read-only"

    async def work_signal(self) -> asyncio.Event | None:
        """An event set when a turn may have become claimable; None where none is heard.

        PostgreSQL notifies every listening process when a turn is queued unclaimed, put
        back unclaimed (a pause answered) or unblocked by the end of an earlier turn of
        its session; clear the event before you claim. A lease that lapses is not
        announced. Each call listens again if the connection was lost (which also sets the
        event); while it cannot connect, the answer is None. SQLite: always None.
        """
        listener = self._the_listener()
        return None if listener is None else await listener.event()

    def stop_signal(self, turn_id: str) -> asyncio.Event | None:
        """An event set when Stop may have been pressed for `turn_id` in another process.

        PostgreSQL notifies every listening process when a Stop flags a turn for its live
        driver (`turnkit_stop`, at the Stop's commit); the event of that turn is set, and
        its driver renews its lease at once to learn of it. A Stop heard before anyone
        asked for the turn's event (between its claim and its driver's first call), or
        flagged before the connection listened (read as it opens), sets the event as it
        is made. The listening connection is opened in the background (the process's one,
        shared with `work_signal`); while it cannot be, nothing sets the event: the
        driver learns of a Stop at its next renewal, as without it. Call it again at each
        renewal: a lost connection is opened again. SQLite: always None.
        """
        listener = self._the_listener()
        return None if listener is None else listener.stop_signal(turn_id)

    def _the_listener(self) -> Listener | None:
        """The process's listening connection (not opened yet); None on SQLite or closed."""
        if self._async_engine is None or self._closed:
            return None
        if self._listener is None:
            dsn, settings, _ = self._asyncpg_dsn()
            self._listener = Listener(dsn, settings, self._clock.monotonic)
        return self._listener

    def _asyncpg_dsn(self) -> tuple[str, dict[str, str] | None, float]:
        """The URL, server settings and connect timeout for a plain asyncpg connection."""
        dsn, timeout = asyncpg_dsn(self.url)
        settings = {"search_path": self.schema} if self.schema is not None else None
        return dsn, settings, timeout

    async def _open_driver_pool(self) -> asyncpg.Pool:
        """The asyncpg pool for `_pg_driver`, opened on first use (no connection yet).

        A pool of its own rather than SQLAlchemy's: checking a connection out of
        SQLAlchemy's async pool costs greenlet switches and its bookkeeping on every
        statement. A connection the server closed is replaced when next acquired.
        """
        import asyncpg  # the `postgres` extra

        async with self._driver_pool_lock:
            if self._driver_pool is None:
                dsn, settings, timeout = self._asyncpg_dsn()
                self._driver_pool = await asyncpg.create_pool(
                    dsn,
                    min_size=0,
                    max_size=DRIVER_POOL_SIZE,
                    server_settings=settings,
                    reset=keep_session,
                    timeout=timeout,
                    **NO_STATEMENT_EXPIRY,
                )
            return self._driver_pool

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        """What a database out of reach raises (nothing was written)."""
        return unavailable(exc, url=self._shown_url())

    def _shown_url(self) -> str:
        return shown_url(self.url)

    async def _close_pg(self) -> None:
        """Close the listener, the driver's pool and the async engine (those opened)."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.close()
        if self._driver_pool is not None:
            pool, self._driver_pool = self._driver_pool, None
            await close_pool(pool)
        if self._async_engine is not None:
            engine_a, self._async_engine = self._async_engine, None
            await engine_a.dispose()


def asyncpg_dsn(url: str) -> tuple[str, float]:
    """A plain asyncpg DSN for a `postgresql://` URL, and the timeout to connect with.

    asyncpg reads libpq's query options itself (`sslmode`, `sslrootcert`,
    `application_name`, `target_session_attrs` …) but would send `connect_timeout` to the
    server as a setting it does not know: it becomes the timeout (default
    `CONNECT_TIMEOUT_S`).

    Raises:
        ConfigurationError: `connect_timeout` is not a positive number of seconds.
    """
    parsed = make_url(url).set(drivername="postgresql")
    query = dict(parsed.query)
    raw = query.pop("connect_timeout", None)
    timeout = CONNECT_TIMEOUT_S
    if raw is not None:
        given = raw if isinstance(raw, str) else raw[-1]
        try:
            timeout = float(given)
        except ValueError:
            timeout = 0.0
        if not 0 < timeout < float("inf"):
            raise ConfigurationError(
                f"connect_timeout={given!r} in the database URL is not a positive number of seconds"
            )
    return parsed.set(query=query).render_as_string(hide_password=False), timeout


def shown_url(url: str) -> str:
    """A database URL as logs and errors may show it: no password, no driver name.

    The password is `***`, in the URL's `user:password@` and in its query: the value of
    any option whose name holds `pass`, `secret`, `token` or `key` (`password`,
    `sslpassword` …) is `***` too, except the options that name a file (`sslkey`,
    `sslcert`, `sslrootcert`, `sslcrl`, `passfile`), which show the path.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # not a URL SQLAlchemy reads (`postgresql:/u:pw@h`)
        return _masked_query(masked_url(url))
    if parsed.drivername.startswith("postgresql"):
        parsed = parsed.set(drivername="postgresql")
    return _masked_query(parsed.render_as_string(hide_password=True))


_SECRET_OPTION: Final = re.compile(r"pass|secret|token|key", re.IGNORECASE)
"""A URL query option whose value may be a secret (`password`, `sslpassword`, `api_key` …)."""
_PATH_OPTIONS: Final = frozenset({"sslkey", "sslcert", "sslrootcert", "sslcrl", "passfile"})
"""Query options that name a file, shown: the path is no secret, and the errors name it."""
_QUERY_OPTION: Final = re.compile(r"([?&])([^=&#]*)=([^&#]*)")


def _masked_query(url: str) -> str:
    """`url` with the values of its secret-looking query options as `***`."""
    head, mark, query = url.partition("?")
    if not mark:
        return url

    def masked(option: re.Match[str]) -> str:
        name = unquote_plus(option[2]).strip().lower()
        if _SECRET_OPTION.search(name) is None or name in _PATH_OPTIONS:
            return option[0]
        return f"{option[1]}{option[2]}=***"

    return head + _QUERY_OPTION.sub(masked, mark + query)


def is_unreachable(exc: BaseException) -> bool:
    """The database cannot take the statement now, whatever the statement.

    Out of reach (refused, reset, shutting down), or reached but unable to write for now:
    a read-only server (a replica after a failover), a full disk, no memory or no
    connections left. Not a bad statement: the same one succeeds once it is mended.
    """
    if isinstance(exc, OSError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    # The driver's own error, wrapped or not: SQLAlchemy's `orig` may itself be its asyncpg
    # adapter's error, whose cause is the driver's (a server shutting down, say).
    return any(
        isinstance(e, OSError) or type(e).__name__ in UNREACHABLE_DRIVER_ERRORS for e in _chain(exc)
    ) or database_refused(exc)


def database_refused(exc: BaseException) -> bool:
    """The database answered, and refused the statement for a reason that clears.

    Read-only (a replica after a failover), out of disk, memory or connections, shutting
    down, connection lost. Only the database's own errors (they carry a SQLSTATE) count,
    never an `OSError` or a bug in the app's code that merely looks alike. (SQLite's
    connections raise `StoreUnavailableError` themselves: `cannot_write`.)
    """
    return any(_temporary(getattr(e, "sqlstate", None)) for e in _chain(exc))


async def _read_only_now(conn: asyncpg.Connection) -> str:
    """`on` when this connection's transactions are read-only (a hot standby, say)."""
    return str(await conn.fetchval("SELECT current_setting('transaction_read_only')"))


def reached_read_only(exc: BaseException) -> bool:
    """The connection reached a read-only server: after a failover, likely the old primary.

    Connections opened while a database name still led to the old primary, now a replica,
    keep reaching it after the name leads to the new one. Whoever sees this refusal
    retires the pool's connections, so a later statement connects afresh (at most once an
    interval: `Retirements`).
    """
    return any(getattr(e, "sqlstate", None) == READ_ONLY_SQLSTATE for e in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it wraps (SQLAlchemy's `orig`, else its cause), a few deep."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return
        yield seen
        seen = getattr(seen, "orig", None) or seen.__cause__


def _temporary(state: object) -> bool:
    """A SQLSTATE of a refusal that clears by itself (see `UNAVAILABLE_SQLSTATES`)."""
    return (
        isinstance(state, str)
        and state.startswith(UNAVAILABLE_SQLSTATES)
        and state not in _LASTING_SQLSTATES
    )


def unavailable(exc: BaseException, *, url: str | None = None) -> StoreUnavailableError:
    """What a database out of reach, or refusing writes for now (`is_unreachable`), raises."""
    then = "check the host name in the URL" if _no_such_name(exc) else "retry shortly"
    return StoreUnavailableError(
        f"the database {_why_unavailable(exc)} ({type(exc).__name__}: {first_line(exc)}); "
        f"nothing was written, {then}",
        **({"url": url} if url is not None else {}),
    )


_NO_SUCH_NAME: Final = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)
"""`getaddrinfo` errors of a name the resolver answered has no address (not a resolver
that could not answer now, `EAI_AGAIN`)."""


def unresolved_host(exc: BaseException, url: str) -> str | None:
    """The host of database URL `url` when `exc` says no such name exists; else None.

    A mistyped host, most likely; though a container platform's name may also vanish
    while its container is down.
    """
    if not _no_such_name(exc):
        return None
    try:
        return make_url(url).host or "localhost"
    except (ArgumentError, ValueError):
        return "?"


def tls_refused(exc: BaseException) -> str | None:
    """Why the URL's settings cannot reach the database, when TLS or the driver says so.

    The server's certificate fails verification (a CA the URL's `sslrootcert` does not
    trust, a name or address it was not issued for), the handshake is refused (no TLS
    version or cipher both sides speak), or the driver cannot use the URL's options (no
    root certificate to verify with, an unknown `sslmode`): no wait mends any of them.
    The message ends with what to check. A connection lost mid-handshake (EOF, reset) is
    an outage, not this; None then.
    """
    tls = "check sslmode and sslrootcert in the database URL, and the server's certificate"
    for error in _wrapped(exc):
        if isinstance(error, ssl.SSLCertVerificationError):
            if getattr(error, "verify_code", None) == _NOT_YET_VALID:  # a clock not synced yet
                return None
            return f"the database's TLS certificate cannot be verified ({first_line(error)}): {tls}"
        if isinstance(error, ssl.SSLError) and _ssl_reason(error) in _SSL_SETTINGS:
            return f"the TLS handshake with the database fails ({first_line(error)}): {tls}"
        if type(error).__name__ == "ClientConfigurationError":  # asyncpg's, for its options
            return f"the database URL cannot be used ({first_line(error)}): check its options"
    return None


_TLS_FILES: Final = (
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcrl", "PGSSLCRL"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
)
"""The files a PostgreSQL URL's TLS reads, by query option and the variable that stands in."""
_VERIFYING: Final = frozenset({"require", "verify-ca", "verify-full"})
"""The `sslmode`s under which the driver reads `sslrootcert` and `sslcrl` (it reads
`verify_full` as `verify-full`)."""
_FILE_ERRORS: Final = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def tls_file_refused(exc: BaseException, url: str) -> str | None:
    """Why a TLS file database URL `url` names cannot be used, when that is what `exc` says.

    The driver reads `sslrootcert`, `sslcrl`, `sslcert` and `sslkey` (or `$PGSSLROOTCERT`
    and the like) before it connects: one that does not exist, is a directory or cannot
    be read, or holds no certificate or key, fails every attempt the same way. The
    message names the option and the path. None for any other failure (a Unix socket not
    there yet is an outage), and for a file the driver does not read: under
    `sslmode=disable`; with only Unix-socket hosts and no `sslmode` (no TLS then); an
    `sslkey` without an `sslcert`; `sslrootcert` and `sslcrl` under `allow` or `prefer`;
    any of them for a database other than PostgreSQL.
    """
    found = _tls_file_problem(exc, url)
    return found[0] if found is not None else None


def tls_file_missing(exc: BaseException, url: str) -> str | None:
    """`tls_file_refused`'s answer when the file is missing or unreadable, not unparsed.

    Such a file may yet appear (a mounted secret, a sidecar that writes a certificate
    after the process starts); one that holds no certificate or key will not mend.
    """
    found = _tls_file_problem(exc, url)
    return found[0] if found is not None and found[1] else None


def _tls_file_problem(exc: BaseException, url: str) -> tuple[str, bool] | None:
    """`tls_file_refused`'s message, and whether the file is missing or unreadable."""
    errors = list(_wrapped(exc))
    unreadable = any(isinstance(e, _FILE_ERRORS) for e in errors)
    unparsed = next((e for e in errors if _tls_file_unparsed(e)), None)
    if not unreadable and unparsed is None:
        return None
    files = _tls_files_read(url)
    for _, path, source in files:
        problem = _file_problem(path)
        if unreadable and problem is not None:
            return (
                f"{source} names {path!r}, which {problem}: check the path, and that the "
                "file is there for this process (a mounted secret, a container's volume)"
            ), True
    if unparsed is not None and files:
        named = ", ".join(f"{option}={path}" for option, path, _ in files)
        return (
            f"a TLS file the database URL names cannot be used ({first_line(unparsed)}): "
            f"check {named} (PEM certificates and keys)"
        ), False
    return None


def _tls_files_read(url: str) -> list[tuple[str, str, str]]:
    """The TLS files asyncpg reads to connect to `url`: (option, path, where it is named)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return []
    if parsed.drivername.split("+")[0] not in ("postgresql", "postgres"):
        return []
    query = parsed.query
    given = _option(query, "sslmode") or os.environ.get("PGSSLMODE")
    if given is None and _unix_sockets_only(parsed):
        return []  # the driver uses no TLS over a Unix socket unless told to
    mode = (given or "prefer").replace("_", "-")
    if mode == "disable":
        return []
    files: list[tuple[str, str, str]] = []
    for option, variable in _TLS_FILES:
        if option in ("sslrootcert", "sslcrl") and mode not in _VERIFYING:
            continue  # not read under allow or prefer
        if option == "sslkey" and not any(named == "sslcert" for named, _, _ in files):
            continue  # read only beside a certificate
        path, source = _option(query, option), f"{option} in the database URL"
        if not path:
            path, source = os.environ.get(variable), f"${variable}"
        if path:
            files.append((option, path, source))
    return files


def _unix_sockets_only(parsed: Any) -> bool:
    """Every host asyncpg would try for URL `parsed` is a Unix socket's directory.

    The host in the URL, else its `host` option, else `$PGHOST`; none at all means the
    driver's defaults, which end with `localhost` (TCP).
    """
    hosts = unquote(parsed.host or "") or _option(parsed.query, "host") or os.environ.get("PGHOST")
    return bool(hosts) and all(host.startswith("/") for host in str(hosts).split(","))


def _option(query: Any, name: str) -> str | None:
    """A URL query option's value (its last, when given more than once)."""
    value = query.get(name)
    if isinstance(value, tuple):
        value = value[-1] if value else None
    return str(value) if value else None


def _file_problem(path: str) -> str | None:
    """What stops the driver reading the file at `path`; None when it can."""
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return "is a directory, not a file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def _tls_file_unparsed(error: BaseException) -> bool:
    """OpenSSL found no certificate, CRL or key it can use in a file it read."""
    if not isinstance(error, ssl.SSLError) or isinstance(error, ssl.SSLCertVerificationError):
        return False
    return getattr(error, "library", None) in ("PEM", "X509") or "PEM lib" in str(error)


_SSL_SETTINGS: Final = frozenset(
    {
        "UNSUPPORTED_PROTOCOL",
        "TLSV1_ALERT_PROTOCOL_VERSION",
        "NO_SHARED_CIPHER",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "NO_PROTOCOLS_AVAILABLE",
    }
)
"""TLS failures of settings the two sides disagree on (a version, a cipher), which no wait
mends; any other (a record cut short, a proxy whose server is not up yet) is an outage."""
_NOT_YET_VALID: Final = 9
"""OpenSSL's `X509_V_ERR_CERT_NOT_YET_VALID`: at boot, a clock not synced yet says so."""
_REASON = re.compile(r"\[SSL: ([A-Z0-9_]+)\]")


def _ssl_reason(error: ssl.SSLError) -> str | None:
    """OpenSSL's reason for `error` (`NO_SHARED_CIPHER`), from its message if not given."""
    reason = getattr(error, "reason", None)
    if reason:
        return str(reason)
    found = _REASON.search(str(error))
    return found.group(1) if found else None


def _wrapped(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every error it wraps (SQLAlchemy's `orig`, a cause, a context), a few deep."""
    pending, seen = [exc], set[int]()
    while pending and len(seen) < 12:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending += [
            e
            for e in (getattr(error, "orig", None), error.__cause__, error.__context__)
            if isinstance(e, BaseException)
        ]


def _no_such_name(exc: BaseException) -> bool:
    return any(isinstance(e, socket.gaierror) and e.errno in _NO_SUCH_NAME for e in _chain(exc))


def _why_unavailable(exc: BaseException) -> str:
    """`cannot be reached`, or for a server that answered, why it takes no writes now."""
    if _no_such_name(exc):
        return "cannot be reached: its host name does not resolve"
    for error in _chain(exc):
        state = str(getattr(error, "sqlstate", ""))
        if state == READ_ONLY_SQLSTATE:
            return "is read-only"
        if state.startswith("53"):
            return "is out of disk, memory or connections"
    return "cannot be reached"


READ_ONLY_SQLSTATE = "25006"
UNAVAILABLE_SQLSTATES = ("08", READ_ONLY_SQLSTATE, "53", "57P")
"""SQLSTATEs (or their classes) of a server that cannot take statements now: connection
exceptions, a read-only transaction, insufficient resources (disk full, out of memory,
too many connections), an operator's shutdown."""
_LASTING_SQLSTATES = frozenset({"08P01", "53400", "57P04"})
"""Of those, what does not clear by waiting: a protocol violation, a configured limit, a
dropped database."""


_UNSTORABLE_TEXT = frozenset({"22021", "22P05"})
"""SQLSTATEs of text PostgreSQL cannot store (a NUL character, or no such character)."""


def unstorable_text(exc: BaseException) -> InvalidInputError | None:
    """What to raise for a statement refused over text it cannot store (else None).

    A NUL character in an id or a key reaches PostgreSQL only from a request nobody
    checked: a bad request, not a store failure.
    """
    if any(getattr(e, "sqlstate", None) in _UNSTORABLE_TEXT for e in _chain(exc)):
        return InvalidInputError(
            "a text holds a character PostgreSQL cannot store (such as NUL, U+0000); "
            "nothing was written"
        )
    return None


UNREACHABLE_DRIVER_ERRORS = frozenset(
    {
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
        "ConnectionFailureError",
        "AdminShutdownError",
        "CrashShutdownError",
        "InterfaceError",
        # A connection left mid-operation when the server went away ("cannot switch to
        # state 12; another operation is in progress"): seen during a restart.
        "InternalClientError",
    }
)
"""The names of asyncpg's errors that mean the server is out of reach."""


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, at most 200 characters."""
    return (str(exc).strip().splitlines() or [""])[0][:200]


def drop_if_closed(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """Hand out no connection the server has closed (a restart): the pool takes another.

    asyncpg knows a closed connection without a round trip, so this costs nothing, where
    SQLAlchemy's `pool_pre_ping` sends a BEGIN and a ROLLBACK before every transaction.
    """
    if dbapi_conn.driver_connection.is_closed():
        raise DisconnectionError("the server closed the connection")
