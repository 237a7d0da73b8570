"""A database that cannot be reached is told apart from a bad statement, however wrapped."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi
from sqlalchemy.exc import DBAPIError, ProgrammingError

from turnkit.store._engine_pg import is_unreachable


def _as_sqlalchemy_raises(driver: Exception) -> DBAPIError:
    """The error a SQLAlchemy connect raises for `driver`: wrapped in its adapter's error."""
    adapted = AsyncAdapt_asyncpg_dbapi.Error(str(driver))
    adapted.__cause__ = driver
    return DBAPIError("connect", None, adapted)


@pytest.mark.parametrize(
    "driver",
    [
        asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        ConnectionRefusedError(111, "Connect call failed"),
    ],
)
def test_a_server_going_away_is_unreachable(driver: Exception) -> None:
    assert is_unreachable(_as_sqlalchemy_raises(driver))
    assert is_unreachable(driver)  # as asyncpg raises it, outside SQLAlchemy


def test_a_bad_statement_is_not() -> None:
    bad = asyncpg.exceptions.UndefinedTableError('relation "nope" does not exist')
    assert not is_unreachable(_as_sqlalchemy_raises(bad))
    assert not is_unreachable(ProgrammingError("SELECT * FROM nope", None, Exception("nope")))


def test_a_host_name_that_does_not_resolve_is_told_apart_from_a_resolver_that_failed() -> None:
    """No such name: a mistyped URL, named as one. A resolver that could not answer now
    (`EAI_AGAIN`) is an outage like any other."""
    import socket

    from turnkit.store._engine_pg import unavailable, unresolved_host

    url = "postgresql://app:S3cret@db.mistyped:5432/app"
    no_such = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert unresolved_host(_as_sqlalchemy_raises(no_such), url) == "db.mistyped"
    assert unresolved_host(no_such, url) == "db.mistyped"
    said = str(unavailable(no_such))
    assert "its host name does not resolve" in said
    assert "check the host name in the URL" in said
    later = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    assert unresolved_host(later, url) is None
    assert "retry shortly" in str(unavailable(later))
