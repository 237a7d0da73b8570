"""SQLAlchemy Core statements run on a plain `sqlite3` connection (private).

SQLAlchemy's per-statement work (cache-key generation, parameter and result processing)
costs 25–200 µs, several times what SQLite itself needs for a small write. Here a Core
statement is compiled once for SQLite, keyed by the statement object, and each execution
is one `sqlite3` call. The statements stay the single definition: PostgreSQL runs the same
objects through SQLAlchemy.

Only what turnkit's statements use is supported: named bind parameters (values from the
call or fixed in the statement), literal IN lists, RETURNING, and result columns of the
types in `_tables.py` (times come back as naive UTC datetimes, like SQLAlchemy's).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Boolean, DateTime
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import IntegrityError, OperationalError

from turnkit.errors import StoreUnavailableError

T = TypeVar("T")

__all__ = (
    "BusyError",
    "LockWait",
    "busy_error",
    "RawResult",
    "SqliteConnection",
    "cannot_write",
    "connect",
    "is_busy",
    "refusal",
    "tune",
)

_DIALECT = sqlite.dialect(paramstyle="named")
_POSTCOMPILE = re.compile(r"__\[POSTCOMPILE_(\w+)\]")
_CACHE_SIZE = 512


class BusyError(Exception):
    """Another connection holds the write lock (raised only when the wait is zero)."""


class LockWait:
    """A thread's wait for SQLite's locks: up to `wait_ms`, unless given up sooner.

    SQLite's own busy timeout cannot be cut short (not even by `interrupt()`), so a write
    that met a lock another process holds would hold its thread, and whoever closes it,
    for the whole timeout. A connection that waits this way has a busy timeout of one
    `SLICE_MS` and tries again slice after slice instead, and `give_up` ends the wait
    within one slice: the transaction then fails as if the timeout had run out.
    """

    SLICE_MS: ClassVar[int] = 50

    def __init__(self, wait_ms: int) -> None:
        self.wait_ms = wait_ms
        self._given_up = threading.Event()

    def give_up(self) -> None:
        """Transactions waiting for a lock now, or later, stop waiting (for good)."""
        self._given_up.set()

    @property
    def given_up(self) -> bool:
        return self._given_up.is_set()

    def waits(self, since: float) -> bool:
        """Whether a wait that began at `since` (`time.monotonic()`) goes on."""
        return not self.given_up and time.monotonic() - since < self.wait_ms / 1000

    def begin(self, raw: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE on `raw` (busy timeout `SLICE_MS`), waiting as told.

        Raises:
            sqlite3.OperationalError: the lock was not had (busy), or BEGIN failed.
        """
        self.retry(lambda: raw.execute("BEGIN IMMEDIATE"), busy=busy_error)

    def retry(self, attempt: Callable[[], T], *, busy: Callable[[Exception], bool]) -> T:
        """`attempt()`, tried while it meets a lock (`busy(exc)`) and the wait goes on.

        Its last error is raised once `busy` says no or the wait is over (or given up).
        """
        since = time.monotonic()
        while True:
            try:
                return attempt()
            except Exception as exc:
                if not busy(exc) or not self.waits(since):
                    raise


class _Row(tuple[Any, ...]):
    """A result row: a tuple whose columns are also attributes."""

    __slots__ = ()
    _index: ClassVar[dict[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._index[name]]
        except KeyError:
            raise AttributeError(name) from None


class RawResult:
    """The rows of one statement, fetched at once (turnkit's results are small)."""

    __slots__ = ("rowcount", "_rows")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return self._rows

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise LookupError(f"expected one row, got {len(self._rows)}")
        return self._rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        if len(self._rows) > 1:
            raise LookupError(f"expected at most one row, got {len(self._rows)}")
        return self._rows[0][0] if self._rows else None

    def scalars(self) -> list[Any]:
        return [row[0] for row in self._rows]


_last_time: tuple[datetime | None, str] = (None, "")


def _bind_value(value: Any) -> Any:
    """Python values as SQLAlchemy's SQLite types store them (times: naive UTC text)."""
    global _last_time  # a one-entry cache: a transaction binds one "now" many times
    if isinstance(value, datetime):
        cached = _last_time  # one read: another thread may replace it meanwhile
        if cached[0] is value:
            return cached[1]
        plain = value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
        text = plain.isoformat(" ", "microseconds")
        _last_time = (value, text)
        return text
    return value


_CANNOT_WRITE = {
    sqlite3.SQLITE_FULL: "is out of disk space",
    sqlite3.SQLITE_READONLY: "is read-only",
    sqlite3.SQLITE_IOERR: "could not be read or written (a disk I/O error)",
}
_LASTING = frozenset(
    {
        sqlite3.SQLITE_READONLY_DBMOVED,  # the file was moved or deleted under the process
        sqlite3.SQLITE_READONLY_CANTINIT,
        sqlite3.SQLITE_READONLY_DIRECTORY,
    }
)
"""Refusals that need a restart or an operator, not time: errors, not outages."""


def cannot_write(exc: BaseException) -> str | None:
    """Why SQLite cannot write now (a full disk, a read-only file, an I/O error), or None.

    Such a refusal clears once the disk has room or the file may be written again: an
    outage to wait out, not a bug. SQLite rolls such a transaction back whole. A file
    moved or deleted under the process is not one (`_LASTING`).
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int) or code in _LASTING:
        return None
    return _CANNOT_WRITE.get(code & 0xFF)


def refusal(exc: BaseException, path: str) -> StoreUnavailableError | None:
    """What SQLite's refusal to write `path` (`cannot_write`) raises; None for any other."""
    why = cannot_write(exc)
    if why is None:
        return None
    return StoreUnavailableError(
        f"the SQLite database {path!r} {why} ({exc}); nothing was written, "
        "retry once the disk or the file is mended",
        path=path,
    )


def busy_error(exc: Exception) -> bool:
    """`exc` says another connection holds a lock (`BusyError`, or SQLite's own error)."""
    return isinstance(exc, BusyError) or (
        isinstance(exc, sqlite3.OperationalError) and is_busy(exc)
    )


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds a lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in str(exc)


def _parse_time(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _parse_bool(value: Any) -> Any:
    return bool(value) if value is not None else None


class _Compiled:
    """One statement's SQL, fixed parameter values, and row shape."""

    __slots__ = ("sql", "fixed", "row_type", "convert", "returns_rows")

    def __init__(self, statement: Any, keys: Sequence[str] | None) -> None:
        compiled = statement.compile(dialect=_DIALECT, column_keys=keys)
        sql: str = compiled.string
        fixed: dict[str, Any] = {}
        for name, bind in compiled.binds.items():
            if bind.expanding:
                if bind.required:
                    raise TypeError(f"bind parameter {name!r}: expanding values must be fixed")
                names = [f"{name}_{i}" for i in range(len(bind.value))]
                fixed.update(zip(names, (_bind_value(v) for v in bind.value), strict=True))
                sql = sql.replace(
                    f"__[POSTCOMPILE_{name}]", ", ".join(f":{n}" for n in names) or "NULL"
                )
            elif not bind.required and bind.callable is None:
                fixed[name] = _bind_value(bind.value)  # a value written into the statement
        # Column defaults SQLAlchemy fills in at execution (`x: int = 0` on the model).
        for column in (*compiled.insert_prefetch, *compiled.update_prefetch):
            default = column.default if column in compiled.insert_prefetch else column.onupdate
            if default is None or not default.is_scalar:
                raise TypeError(f"column {column.key!r}: only constant defaults are supported")
            fixed[column.key] = _bind_value(default.arg)
        if _POSTCOMPILE.search(sql):
            raise TypeError(f"unsupported post-compile parameter in {sql!r}")
        self.sql = sql
        self.fixed = fixed
        columns = _result_columns(statement)
        self.returns_rows = columns is not None
        self.row_type: type[_Row] = type(
            "Row",
            (_Row,),
            {"__slots__": (), "_index": {c.key: i for i, c in enumerate(columns or ())}},
        )
        self.convert = [
            (i, _parse_time if isinstance(c.type, DateTime) else _parse_bool)
            for i, c in enumerate(columns or ())
            if isinstance(c.type, DateTime | Boolean)
        ]

    def params(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        params = dict(self.fixed)
        if values:
            params.update(values)
            for key, value in values.items():
                if isinstance(value, datetime):  # the only values stored other than as given
                    params[key] = _bind_value(value)
        return params

    def rows(self, raw: list[tuple[Any, ...]]) -> list[Any]:
        if self.convert:
            out = []
            for row in raw:
                cells = list(row)
                for i, fn in self.convert:
                    cells[i] = fn(cells[i])
                out.append(self.row_type(cells))
            return out
        return [self.row_type(row) for row in raw]


def _result_columns(statement: Any) -> Any:
    if statement.is_select:
        return statement.selected_columns
    if statement.is_dml and statement._returning:
        return statement.exported_columns
    return None


class SqliteConnection:
    """A `sqlite3` connection that runs Core statements (one thread uses it at a time)."""

    dialect = _DIALECT

    def __init__(
        self, raw: sqlite3.Connection, path: str = "", *, lock_wait: LockWait | None = None
    ) -> None:
        self.raw = raw
        self.path = path
        self.lock_wait = lock_wait
        """How its write transactions wait for the lock; None: the busy timeout alone."""
        self._cache: OrderedDict[tuple[int, tuple[str, ...] | None], tuple[Any, _Compiled]]
        self._cache = OrderedDict()

    def _compiled(self, statement: Any, keys: tuple[str, ...] | None) -> _Compiled:
        key = (id(statement), keys)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is statement:
            self._cache.move_to_end(key)
            return hit[1]
        compiled = _Compiled(statement, keys)
        # The entry holds the statement, so its id cannot be reused while cached.
        self._cache[key] = (statement, compiled)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def execute(
        self,
        statement: Any,
        parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> RawResult:
        """Run `statement` with one parameter set, or with each of a list of them."""
        batch: list[Mapping[str, Any]] | None = None
        single: Mapping[str, Any] | None = None
        if isinstance(parameters, Mapping) or parameters is None:
            single = parameters
        else:
            batch = list(parameters)
        first = batch[0] if batch else single
        # As in SQLAlchemy, an INSERT/UPDATE's parameter names pick its columns.
        keys = tuple(first) if statement.is_dml and first else None
        compiled = self._compiled(statement, keys)
        try:
            if batch is not None:
                params = [compiled.params(p) for p in batch]
                if compiled.returns_rows:
                    rows: list[Any] = []
                    for p in params:
                        rows += self.raw.execute(compiled.sql, p).fetchall()
                    return RawResult(compiled.rows(rows), len(rows))
                cursor = self.raw.executemany(compiled.sql, params)
                return RawResult([], cursor.rowcount)
            cursor = self.raw.execute(compiled.sql, compiled.params(single))
            rows = cursor.fetchall() if compiled.returns_rows else []
            return RawResult(compiled.rows(rows), cursor.rowcount)
        except sqlite3.IntegrityError as exc:
            raise IntegrityError(compiled.sql, None, exc) from exc
        except sqlite3.OperationalError as exc:
            if is_busy(exc):  # a read that met a lock (writes hold theirs from BEGIN)
                raise BusyError(str(exc)) from exc
            if (unavailable := refusal(exc, self.path)) is not None:
                raise unavailable from exc
            raise

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[SqliteConnection]:
        """BEGIN … COMMIT (ROLLBACK on error).

        A write transaction takes the write lock up front (BEGIN IMMEDIATE), so it either
        waits for it here — `BusyError` when the busy timeout is zero — or never waits later.
        """
        try:
            if write and self.lock_wait is not None:
                self.lock_wait.begin(self.raw)
            else:
                self.raw.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise BusyError(str(exc)) from exc
            raise refusal(exc, self.path) or OperationalError("BEGIN", None, exc) from exc
        try:
            yield self
            self.raw.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._roll_back()
            if (unavailable := refusal(exc, self.path)) is not None:
                raise unavailable from exc
            raise
        except BaseException:
            self._roll_back()
            raise

    def _roll_back(self) -> None:
        """End a failed transaction (SQLite may have rolled it back already)."""
        if self.raw.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.raw.execute("ROLLBACK")

    def close(self) -> None:
        self.raw.close()


def tune(raw: sqlite3.Connection, *, busy_timeout_ms: int, autocheckpoint: bool = True) -> None:
    """WAL mode with synchronous=NORMAL: a commit survives a crash of the process."""
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=NORMAL")
    raw.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    if not autocheckpoint:
        raw.execute("PRAGMA wal_autocheckpoint=0")


def connect(
    path: str, *, busy_timeout_ms: int, autocheckpoint: bool, lock_wait: LockWait | None = None
) -> SqliteConnection:
    """Open `path` tuned (see `tune`), with explicit transactions.

    With `lock_wait`, its write transactions wait for the lock as that says, and its busy
    timeout is one `LockWait.SLICE_MS` (`busy_timeout_ms` is not used).
    """
    raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    if lock_wait is not None:
        busy_timeout_ms = LockWait.SLICE_MS
    tune(raw, busy_timeout_ms=busy_timeout_ms, autocheckpoint=autocheckpoint)
    return SqliteConnection(raw, path, lock_wait=lock_wait)
