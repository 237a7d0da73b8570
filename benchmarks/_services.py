"""Where the benchmarks find PostgreSQL and Redis, unless a script's flag says otherwise.

`TURNKIT_BENCH_POSTGRES_URL` and `TURNKIT_BENCH_REDIS_URL`; else the test suite's
`TURNKIT_TEST_POSTGRES_URL` and `TURNKIT_TEST_REDIS_URL`, so one setting serves both; else
127.0.0.1 (PostgreSQL on port 5432 with a database `test`, Redis on port 6379). Scripts that
use PostgreSQL or Redis only when told to read the `GIVEN_` ones: None when neither is set.
"""

from __future__ import annotations

import os

__all__ = ("GIVEN_POSTGRES_URL", "GIVEN_REDIS_URL", "POSTGRES_URL", "REDIS_URL")


def _given(*names: str) -> str | None:
    """The first of the variables `names` set to something (empty is unset)."""
    return next((v for n in names if (v := os.environ.get(n, "").strip())), None)


GIVEN_POSTGRES_URL = _given("TURNKIT_BENCH_POSTGRES_URL", "TURNKIT_TEST_POSTGRES_URL")
GIVEN_REDIS_URL = _given("TURNKIT_BENCH_REDIS_URL", "TURNKIT_TEST_REDIS_URL")
POSTGRES_URL = GIVEN_POSTGRES_URL or "postgresql://postgres@127.0.0.1:5432/test"
"""The PostgreSQL a benchmark uses (each run in a schema or database of its own)."""
REDIS_URL = GIVEN_REDIS_URL or "redis://127.0.0.1:6379/0"
"""The Redis a benchmark uses (each run under key prefixes of its own)."""
