"""`Worker` finds work promptly and says what it does (claims, recoveries, finished turns)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL
from tests.helpers import db_flags, until
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.cli import main
from turnkit.errors import StoreUnavailableError
from turnkit.ids import TurnId
from turnkit.runtime.worker import Worker
from turnkit.store import TurnRecord
from turnkit.testing import ModelStep, ScriptedModel


async def _until_finished(
    runtime: SessionRuntime, caplog: pytest.LogCaptureFixture, *, turns: int
) -> Worker:
    """Run a worker until it logged `turns` finished turns (bounded: 20 s), then stop it."""
    stop = asyncio.Event()
    worker = Worker(runtime, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
    running = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + 20
    while caplog.text.count("finished turn") < turns:
        assert time.monotonic() < deadline, caplog.text
        await asyncio.sleep(0.02)
    stop.set()
    await running
    return worker


async def test_the_worker_logs_claims_recoveries_and_finished_turns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}", lease_ttl_s=0.3)
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        orphan = await runtime.submit("s-orphan", "hi", claim=True)  # claimed, never driven
        queued = await runtime.submit("s-queued", "hello")
        await asyncio.sleep(0.4)  # the orphan's lease lapses
        worker = await _until_finished(runtime, caplog, turns=2)

    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    assert lines[-1] == f"worker {worker.owner} stopped"
    assert (
        f"recovering turn {orphan.turn_id} (session s-orphan): attempt 2, "
        "its previous driver's lease expired"
    ) in lines
    assert f"claimed turn {queued.turn_id} (session s-queued, attempt 1)" in lines
    for turn_id, session in ((orphan.turn_id, "s-orphan"), (queued.turn_id, "s-queued")):
        [done] = [line for line in lines if line.startswith(f"finished turn {turn_id} ")]
        assert re.fullmatch(
            rf"finished turn {turn_id} \(session {session}\): succeeded in (\d+ ms|\d+\.\d s)", done
        )


async def test_the_worker_logs_why_a_turn_failed_and_each_fallback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider outage shows on a worker's stderr, not only in the turns' logs."""
    from turnkit import ModelFamily, ProviderError

    caplog.set_level(logging.INFO, logger="turnkit.worker")
    down = ProviderError("busy", status_code=503)
    family = ModelFamily(
        "chat",
        [
            ScriptedModel([ModelStep.fail(down), ModelStep.fail(down)], name="primary"),
            ScriptedModel(
                [ModelStep.text_reply("From the fallback."), ModelStep.fail(down)], name="backup"
            ),
        ],
    )
    agent = Agent(model=family, skip_stages=frozenset({"anchor-plan"}))
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}", run_in_process=False)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        saved = await runtime.submit("s-1", "one")
        lost = await runtime.submit("s-2", "two")
        await _until_finished(runtime, caplog, turns=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    assert (
        f"turn {saved.turn_id}: model primary failed (ProviderError: busy); trying backup" in lines
    )
    assert (
        f"turn {lost.turn_id}: model backup failed (ProviderError: busy); no model left to try"
        in lines
    )
    [done] = [line for line in lines if line.startswith(f"finished turn {lost.turn_id} ")]
    assert "failed (family-exhausted) in" in done


async def test_a_full_worker_claims_the_next_turn_as_soon_as_one_ends(tmp_path: Path) -> None:
    """Driving all it may, a worker waits for a turn to end, not for its next poll."""
    model = ScriptedModel([ModelStep.text_reply("First."), ModelStep.text_reply("Second.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}")
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        first = await runtime.submit("s-1", "one")
        second = await runtime.submit("s-2", "two")
        stop = asyncio.Event()
        worker = Worker(runtime, concurrency=1, poll_interval_s=60, sweep_interval_s=3600)
        running = asyncio.create_task(worker.run(stop))
        try:
            deadline = time.monotonic() + 20  # well under the 60 s poll
            for turn in (first, second):
                while (await runtime.turn(turn.turn_id)).status == "running":
                    assert time.monotonic() < deadline, "the second turn waited for a poll"
                    await asyncio.sleep(0.02)
                assert (await runtime.turn(turn.turn_id)).status == "succeeded"
        finally:
            stop.set()
            await running


async def _status_once_driven(runtime: SessionRuntime, worker: Worker, turn_id: str) -> str:
    """Run `worker` until the turn is no longer running (bounded); the turn's status."""
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(20):
            while (status := (await runtime.turn(turn_id)).status) == "running":
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await running
    return status


async def test_a_claim_that_fails_unexpectedly_is_logged_and_the_worker_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver error no outage check knows (asyncpg's state errors during a restart)."""
    model = ScriptedModel([ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}")
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        claim = runtime.store.claim
        failures = [RuntimeError("cannot switch to state 12; another operation is in progress")]

        async def flaky(*args: object, **kwargs: object) -> object:
            if failures:
                raise failures.pop()
            return await claim(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(runtime.store, "claim", flaky)
        sub = await runtime.submit("s-1", "hi")
        worker = Worker(runtime, poll_interval_s=0.05, sweep_interval_s=3600)
        with caplog.at_level(logging.WARNING, logger="turnkit"):
            assert await _status_once_driven(runtime, worker, sub.turn_id) == "succeeded"
    assert failures == []
    assert "claiming failed; retrying with backoff" in caplog.text
    assert "the database is" not in caplog.text  # not reported as an outage


async def test_a_sweep_that_keeps_failing_does_not_stop_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}")
    async with SessionRuntime(agent=Agent(model=model), config=config) as runtime:
        worker = Worker(runtime, poll_interval_s=0.05, sweep_interval_s=0.05)

        async def broken() -> list[str]:
            raise RuntimeError("a sweep statement the database refuses")

        monkeypatch.setattr(worker, "sweep", broken)
        sub = await runtime.submit("s-1", "hi")
        with caplog.at_level(logging.WARNING, logger="turnkit"):
            assert await _status_once_driven(runtime, worker, sub.turn_id) == "succeeded"
    assert "the sweep failed" in caplog.text
    assert "claiming failed" not in caplog.text


async def _drive_one_submitted_elsewhere(
    pg_schema: str,
    *,
    listen: bool,
    poll_interval_s: float,
    prepare: Callable[[SessionRuntime, SessionRuntime], Awaitable[None]] | None = None,
) -> str:
    """A worker on PostgreSQL and a message another process queues: the turn's status.

    `prepare(worker_side, api_side)` runs before the worker starts.
    """
    model = ScriptedModel([ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=pg_schema)
    async with (
        SessionRuntime(agent=Agent(model=model), config=config) as worker_side,
        SessionRuntime(agent=Agent(model=model), config=config) as api_side,
    ):
        if prepare is not None:
            await prepare(worker_side, api_side)
        stop = asyncio.Event()
        worker = Worker(
            worker_side, poll_interval_s=poll_interval_s, sweep_interval_s=3600, listen=listen
        )
        running = asyncio.create_task(worker.run(stop))
        try:
            await asyncio.sleep(0.3)  # the worker found nothing and waits
            began = time.monotonic()
            sub = await api_side.submit("s-1", "hi")  # queued, not claimed
            while (await api_side.turn(sub.turn_id)).status == "running":
                assert time.monotonic() - began < 20, "the worker waited for its poll"
                await asyncio.sleep(0.01)
            return (await api_side.turn(sub.turn_id)).status
        finally:
            stop.set()
            await running


async def test_a_waiting_worker_on_postgres_claims_a_new_message_at_once(
    pg_schema: str, sent: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """It hears the message's commit (LISTEN) instead of waiting out its 60 s poll."""
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    status = await _drive_one_submitted_elsewhere(pg_schema, listen=True, poll_interval_s=60)
    assert status == "succeeded"
    assert 'LISTEN "turnkit_work"' in sent
    said = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    assert said.count("listening for new turns (LISTEN turnkit_work)") == 1


async def test_a_listening_worker_takes_a_turn_handed_over_at_once(pg_schema: str) -> None:
    """A turn another worker left at its shutdown is heard, not found at the next 60 s poll."""
    model = ScriptedModel([ModelStep.text_reply("Done.")])
    config = RuntimeConfig(database_url=POSTGRES_URL, database_schema=pg_schema)
    async with (
        SessionRuntime(agent=Agent(model=model), config=config) as worker_side,
        SessionRuntime(agent=Agent(model=model), config=config) as api_side,
    ):
        sub = await api_side.submit("s-left", "hi")
        lease = await api_side.store.claim("leaving", ttl_s=600, max_attempts=3)
        assert lease is not None
        stop = asyncio.Event()
        worker = Worker(worker_side, poll_interval_s=60, sweep_interval_s=3600, listen=True)
        running = asyncio.create_task(worker.run(stop))
        try:
            await asyncio.sleep(0.5)  # the worker found nothing claimable and waits
            assert await api_side.store.hand_over(lease)
            async with asyncio.timeout(20):  # far below the 60 s poll
                while (await api_side.turn(sub.turn_id)).status == "running":
                    await asyncio.sleep(0.01)
            assert (await api_side.turn(sub.turn_id)).status == "succeeded"
        finally:
            stop.set()
            await running


async def test_a_worker_told_not_to_listen_only_polls(pg_schema: str, sent: list[str]) -> None:
    status = await _drive_one_submitted_elsewhere(pg_schema, listen=False, poll_interval_s=0.05)
    assert status == "succeeded"
    assert not [query for query in sent if query.startswith("LISTEN")]


async def test_a_worker_on_postgres_starts_a_turn_from_what_its_claim_read(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim returns the turn's row: the driver does not read the turn again."""
    reads: list[str] = []

    async def prepare(worker_side: SessionRuntime, api_side: SessionRuntime) -> None:
        probe = await api_side.submit("s-probe", "hi")  # queued, not claimed
        lease = await worker_side.store.claim(
            "probe", ttl_s=60, max_attempts=3, turn_id=probe.turn_id
        )
        assert lease is not None
        assert lease.record is not None
        assert lease.record == await api_side.store.get_turn(probe.turn_id)
        assert lease.record.lease_epoch == lease.epoch
        get_turn = worker_side.store.get_turn

        async def counted(turn_id: TurnId) -> TurnRecord | None:
            reads.append(turn_id)
            return await get_turn(turn_id)

        monkeypatch.setattr(worker_side.store, "get_turn", counted)

    status = await _drive_one_submitted_elsewhere(
        pg_schema, listen=True, poll_interval_s=0.05, prepare=prepare
    )
    assert status == "succeeded"
    assert reads == []


async def test_a_stopping_worker_hands_the_turns_it_leaves_over_at_once(
    db: tuple[str, str | None], caplog: pytest.LogCaptureFixture
) -> None:
    """Left at its drain timeout, a turn is claimable now, not once its lease lapses; the
    next worker says it was handed over, not that its driver died."""
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    from turnkit import tool
    from turnkit.testing import call

    first_run = asyncio.Event()

    @tool
    async def slow_once(x: int) -> int:
        """Take long the first time only."""
        if not first_run.is_set():
            first_run.set()
            await asyncio.sleep(60)
        return x

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow_once", x=1)), ModelStep.text_reply("Done.")],
        repeat_last=True,
    )
    agent = Agent(model=model, tools=[slow_once], skip_stages=frozenset({"anchor-plan"}))
    url, schema = db
    config = RuntimeConfig(
        database_url=url, database_schema=schema, run_in_process=False, lease_ttl_s=60
    )
    async with SessionRuntime(agent=agent, config=config) as runtime:
        turn = await runtime.submit("s-1", "go")
        stop = asyncio.Event()
        leaving = Worker(runtime, concurrency=1, poll_interval_s=0.02, drain_timeout_s=0.1)
        running = asyncio.create_task(leaving.run(stop))
        async with asyncio.timeout(20):
            await first_run.wait()  # the tool runs: the turn is mid-flight
        stop.set()
        await running
        record = await runtime.turn(turn.turn_id)
        assert record.status == "running"
        assert record.lease_expires_at is not None
        assert record.lease_expires_at <= runtime.clock.now()  # free now, not in 60 s
        assert (
            await _status_once_driven(runtime, Worker(runtime, poll_interval_s=0.02), turn.turn_id)
            == "succeeded"
        )
        recovering = [e async for e in runtime.events(turn.turn_id) if e.type == "turn.recovering"]
    assert [(e.attempt, e.cause) for e in recovering] == [(2, "handed-over")]  # type: ignore[attr-defined]
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    assert (
        f"recovering turn {turn.turn_id} (session s-1): attempt 2, handed over by a process "
        "that shut down"
    ) in lines
    # An operator reading the turn sees the takeover and the call it ran again.
    flags = db_flags(url, schema)
    shown = io.StringIO()
    assert await asyncio.to_thread(main, ["events", turn.turn_id, *flags], out=shown) == 0
    assert (
        "↻ attempt 2 took the turn over (a worker that shut down handed it over), from its "
        "checkpoint\n  ? slow_once may have run in the attempt before: it runs again with the "
        "same idempotency key\n"
    ) in shown.getvalue()
    listed = io.StringIO()
    assert await asyncio.to_thread(main, ["turns", "--session", "s-1", *flags], out=listed) == 0
    assert "· 2 attempts" in listed.getvalue()


async def test_a_worker_stopped_while_it_waits_for_the_database_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Started before PostgreSQL answers and stopped before it did: its last line says it
    stopped, as a worker that ran does, and that it never reached the database."""
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    config = RuntimeConfig(database_url="postgresql://postgres@127.0.0.1:1/test")
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    worker = Worker(runtime, poll_interval_s=0.02)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(20):
            while "the database is unavailable" not in caplog.text:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        async with asyncio.timeout(20):
            await running
        await runtime.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    assert lines[-1] == f"worker {worker.owner} stopped before the database could be reached"


async def test_a_worker_waiting_for_the_database_says_so_again_while_it_waits(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database down at start is waited out, and the wait is not silent: a warning
    says it is still unavailable, and for how long, every `STILL_AWAY_EVERY_S`."""
    monkeypatch.setattr("turnkit.runtime.worker.STILL_AWAY_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    config = RuntimeConfig(database_url="postgresql://postgres@127.0.0.1:1/test")
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    stop = asyncio.Event()
    running = asyncio.create_task(Worker(runtime).run(stop))
    try:
        await until(
            lambda: caplog.text.count("the database is still unavailable after") >= 2,
            "the wait is told again",
        )
    finally:
        stop.set()
        async with asyncio.timeout(20):
            await running
        await runtime.close()
    assert caplog.text.count("the database is unavailable (") == 1


async def test_a_database_host_that_does_not_resolve_stops_a_starting_worker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped host is no outage to wait out for long: once the grace a platform's
    name may need to appear is over, the worker raises (the CLI: one line, exit 2),
    where it used to retry forever after one warning."""
    import socket

    from turnkit.errors import ConfigurationError

    found = socket.getaddrinfo
    asked: list[float] = []

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "db.mistyped":
            asked.append(time.monotonic())
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return found(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr("turnkit.runtime.worker.UNRESOLVED_GRACE_S", 0.5)
    caplog.set_level(logging.WARNING, logger="turnkit.worker")
    config = RuntimeConfig(database_url="postgresql://postgres@db.mistyped/test")
    runtime = SessionRuntime(agent=Agent(model=ScriptedModel([])), config=config)
    try:
        with pytest.raises(ConfigurationError, match="'db.mistyped' does not resolve"):
            async with asyncio.timeout(20):
                await Worker(runtime).run(asyncio.Event())
        assert len(asked) > 1  # asked again through the grace, not stopped at the first
        assert asked[-1] - asked[0] >= 0.5
        assert "the database is unavailable (" in caplog.text  # waited as for an outage
        with pytest.raises(StoreUnavailableError, match="its host name does not resolve"):
            await runtime.open()  # the Python API: the same outage error, named
    finally:
        await runtime.close()


def _no_such_name() -> StoreUnavailableError:
    """What a store raises when its database host name does not resolve."""
    import socket

    from turnkit.store.sql import unavailable

    cause = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    try:
        raise unavailable(cause) from cause
    except StoreUnavailableError as exc:
        return exc


async def test_a_database_host_name_that_appears_during_the_grace_is_reached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A compose peer or a StatefulSet's pod has no name until it is up: a starting
    process waits for it, warning as for an outage, and goes on once it resolves."""
    from turnkit.runtime.worker import until_reached

    tries: list[int] = []

    async def attempt() -> None:
        tries.append(len(tries))
        if len(tries) < 3:
            raise _no_such_name()

    caplog.set_level(logging.WARNING, logger="turnkit.worker")
    async with asyncio.timeout(20):
        assert await until_reached(attempt, "postgresql://db.later/x", asyncio.Event())
    assert len(tries) == 3
    assert "the database is unavailable (the database cannot be reached: its host" in caplog.text


async def test_a_tls_certificate_that_fails_verification_stops_a_starting_worker(
    tmp_path: Path,
) -> None:
    """A CA the URL does not trust, or a certificate for another name, is no outage: the
    worker raises at once (the CLI: one line, exit 2), where it retried forever."""
    from tests.support.tls_server import tls_postgres
    from turnkit.errors import ConfigurationError

    with tls_postgres(tmp_path) as (port, cert):
        url = f"postgresql://u@127.0.0.1:{port}/x?sslmode=verify-full&sslrootcert={cert}"
        runtime = SessionRuntime(
            agent=Agent(model=ScriptedModel([])), config=RuntimeConfig(database_url=url)
        )
        try:
            with pytest.raises(ConfigurationError) as raised:
                async with asyncio.timeout(20):
                    await Worker(runtime).run(asyncio.Event())
        finally:
            await runtime.close()
    said = str(raised.value)
    assert said.startswith("the database's TLS certificate cannot be verified ("), said
    assert "check sslmode and sslrootcert in the database URL" in said


async def test_no_root_certificate_to_verify_with_stops_a_starting_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sslmode=verify-full` with no `sslrootcert` and none where libpq looks by default
    (`~/.postgresql/root.crt`): the driver cannot use the URL, and no wait mends that."""
    from turnkit.errors import ConfigurationError

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PGSSLROOTCERT", raising=False)
    url = f"{POSTGRES_URL}?sslmode=verify-full"
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([])), config=RuntimeConfig(database_url=url)
    )
    try:
        with pytest.raises(ConfigurationError, match="the database URL cannot be used \\(root"):
            async with asyncio.timeout(20):
                await Worker(runtime).run(asyncio.Event())
    finally:
        await runtime.close()


def test_tls_failures_are_told_from_a_connection_lost_mid_handshake() -> None:
    """Settings the two sides disagree on mend by no wait; a handshake cut short does."""
    import ssl

    from turnkit.store.sql import tls_refused, unavailable

    def wrapped(error: BaseException) -> BaseException:
        try:
            try:
                raise error
            except OSError as exc:
                raise unavailable(exc) from None  # only the context leads to it
        except StoreUnavailableError as outer:
            return outer

    verify = ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed")
    assert "cannot be verified" in (tls_refused(wrapped(verify)) or "")
    refused = ssl.SSLError(1, "[SSL: TLSV1_ALERT_PROTOCOL_VERSION] tlsv1 alert")
    assert "handshake with the database fails" in (tls_refused(wrapped(refused)) or "")
    assert tls_refused(wrapped(ssl.SSLEOFError(8, "EOF occurred"))) is None
    # A proxy whose server is not up yet, a record cut short: outages, waited out.
    alert = ssl.SSLError(1, "[SSL: TLSV1_ALERT_INTERNAL_ERROR] tlsv1 alert internal error")
    assert tls_refused(wrapped(alert)) is None
    assert tls_refused(wrapped(ssl.SSLError(1, "[SSL: BAD_RECORD_MAC] bad record mac"))) is None
    early = ssl.SSLCertVerificationError(1, "certificate verify failed: not yet valid")
    early.verify_code = 9  # at boot, before the clock is synced
    assert tls_refused(wrapped(early)) is None
    assert tls_refused(wrapped(ConnectionResetError(104, "reset"))) is None
    assert tls_refused(_no_such_name()) is None


def test_a_tls_file_is_blamed_only_when_the_driver_reads_it_and_it_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Unix socket not there yet is an outage (FileNotFoundError too); so is any failure
    under `sslmode=disable`, or under `prefer`, where the driver reads no `sslrootcert`."""
    from turnkit.store.sql import tls_file_refused, unavailable

    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCRL"):
        monkeypatch.delenv(name, raising=False)

    def wrapped(error: OSError) -> BaseException:
        try:
            try:
                raise error
            except OSError as exc:
                raise unavailable(exc) from None  # only the context leads to it
        except StoreUnavailableError as outer:
            return outer

    gone = wrapped(FileNotFoundError(2, "No such file or directory"))
    missing, there = tmp_path / "ca.pem", tmp_path / "there.pem"
    there.write_text("-----BEGIN CERTIFICATE-----\n")
    base = "postgresql://u@/x?host=/run/postgresql"
    said = tls_file_refused(gone, f"{base}&sslmode=require&sslrootcert={missing}")
    assert said == (
        f"sslrootcert in the database URL names '{missing}', which does not exist: check the "
        "path, and that the file is there for this process (a mounted secret, a container's "
        "volume)"
    )
    assert tls_file_refused(gone, base) is None  # the socket is not there (yet)
    assert tls_file_refused(gone, f"{base}&sslmode=require&sslrootcert={there}") is None
    assert tls_file_refused(gone, f"{base}&sslmode=disable&sslrootcert={missing}") is None
    assert tls_file_refused(gone, f"{base}&sslmode=prefer&sslrootcert={missing}") is None
    assert tls_file_refused(wrapped(ConnectionRefusedError(111, "refused")),
                            f"{base}&sslmode=require&sslrootcert={missing}") is None  # fmt: skip
    monkeypatch.setenv("PGSSLCERT", str(missing))  # as libpq, the driver reads these too
    assert (tls_file_refused(gone, f"{base}&sslmode=prefer") or "").startswith(
        f"$PGSSLCERT names '{missing}', which does not exist"
    )


def _wrapped_in_unavailable(error: OSError) -> StoreUnavailableError:
    """What a store raises when connecting fails with `error` (its context)."""
    from turnkit.store.sql import unavailable

    try:
        try:
            raise error
        except OSError as exc:
            raise unavailable(exc) from None
    except StoreUnavailableError as outer:
        return outer


def test_a_tls_file_the_driver_does_not_read_is_never_blamed_for_a_socket_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over Unix sockets only and with no sslmode the driver uses no TLS, so a missing
    socket (a restart) is an outage whatever certificate is named; an `sslkey` is read
    only beside a certificate; a database other than PostgreSQL reads none."""
    from turnkit.store.sql import tls_file_missing, tls_file_refused

    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCRL", "PGHOST"):
        monkeypatch.delenv(name, raising=False)
    gone = _wrapped_in_unavailable(FileNotFoundError(2, "No such file or directory"))
    missing = tmp_path / "client.crt"
    for url in (
        f"postgresql://u@/x?host=/var/run/postgresql&sslcert={missing}",
        f"postgresql://u@%2Fvar%2Frun%2Fpostgresql/x?sslcert={missing}",
        f"postgresql+asyncpg://u@/x?host=/run/postgresql,/tmp&sslcert={missing}",
        f"postgresql://u@127.0.0.1/x?sslmode=require&sslkey={missing}",
        f"sqlite:///{tmp_path / 'x.db'}?sslcert={missing}",
    ):
        assert tls_file_refused(gone, url) is None, url
    monkeypatch.setenv("PGSSLCERT", str(missing))
    assert tls_file_refused(gone, "postgresql://u@/x?host=/var/run/postgresql") is None
    monkeypatch.setenv("PGHOST", "/var/run/postgresql")
    assert tls_file_refused(gone, "postgresql://u@/x") is None
    monkeypatch.delenv("PGHOST")
    # No host at all: the driver's defaults end with localhost (TCP), so it reads them.
    blamed = f"$PGSSLCERT names '{missing}', which does not exist"
    assert (tls_file_refused(gone, "postgresql://u@/x") or "").startswith(blamed)
    # Told to use TLS, the driver reads them over a socket too.
    socket = "postgresql://u@/x?host=/var/run/postgresql&sslmode=require"
    assert (tls_file_refused(gone, socket) or "").startswith(blamed)
    assert (tls_file_missing(gone, socket) or "").startswith(blamed)  # it may yet appear
    monkeypatch.setenv("PGSSLMODE", "prefer")
    assert (tls_file_refused(gone, "postgresql://u@/x?host=/tmp") or "").startswith(blamed)


def test_verify_full_with_an_underscore_reads_the_root_certificate(tmp_path: Path) -> None:
    """The driver takes `verify_full` as `verify-full`: a missing `sslrootcert` is named."""
    from turnkit.store.sql import tls_file_refused

    gone = _wrapped_in_unavailable(FileNotFoundError(2, "No such file or directory"))
    for mode in ("verify_full", "verify_ca"):
        url = f"postgresql://u@db/x?sslmode={mode}&sslrootcert={tmp_path / 'ca.pem'}"
        assert (tls_file_refused(gone, url) or "").startswith("sslrootcert in the database URL")


async def test_a_tls_file_that_appears_during_the_grace_is_used_and_one_that_does_not_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A certificate a sidecar writes after the start is waited for, as a host name that
    does not resolve yet; one still missing after the grace stops the start, and one
    with no certificate in it stops it at once."""
    import ssl

    from turnkit.errors import ConfigurationError
    from turnkit.runtime.worker import until_reached

    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCRL"):
        monkeypatch.delenv(name, raising=False)
    ca = tmp_path / "ca.pem"
    url = f"postgresql://u@db/x?sslmode=verify-full&sslrootcert={ca}"
    tries: list[float] = []

    async def attempt() -> None:
        tries.append(time.monotonic())
        if len(tries) == 3:
            ca.write_text("-----BEGIN CERTIFICATE-----\n")  # the sidecar wrote it
        if not ca.exists():
            raise _wrapped_in_unavailable(FileNotFoundError(2, "No such file or directory"))

    caplog.set_level(logging.WARNING, logger="turnkit.worker")
    async with asyncio.timeout(20):
        assert await until_reached(attempt, url, asyncio.Event())
    assert len(tries) == 3
    assert f"names '{ca}', which does not exist: check the path" in caplog.text

    ca.unlink()
    tries.clear()
    monkeypatch.setattr("turnkit.runtime.worker.UNRESOLVED_GRACE_S", 0.5)

    async def never() -> None:
        tries.append(time.monotonic())
        raise _wrapped_in_unavailable(FileNotFoundError(2, "No such file or directory"))

    with pytest.raises(ConfigurationError, match=f"names '{ca}', which does not exist"):
        async with asyncio.timeout(20):
            await until_reached(never, url, asyncio.Event())
    assert len(tries) > 1
    assert tries[-1] - tries[0] >= 0.5

    ca.write_text("")
    tries.clear()

    async def unparsed() -> None:
        tries.append(time.monotonic())
        error = ssl.SSLError(136, "[X509: NO_CERTIFICATE_OR_CRL_FOUND] no certificate")
        error.library = "X509"
        raise _wrapped_in_unavailable(error)

    with pytest.raises(ConfigurationError, match="a TLS file the database URL names cannot"):
        async with asyncio.timeout(20):
            await until_reached(unparsed, url, asyncio.Event())
    assert len(tries) == 1


class _HungBuffer:
    """A replay buffer behind a Redis that stopped answering (hung, or a network that
    drops packets): publishing and releasing wait until `answers` is set."""

    def __init__(self) -> None:
        from turnkit.replay.memory import InMemoryReplayBuffer

        self.inner = InMemoryReplayBuffer()
        self.answers = asyncio.Event()

    async def publish(self, turn_id: TurnId, entries: Any) -> None:
        await self.answers.wait()
        self.inner.publish_now(turn_id, entries)

    async def tail(self, turn_id: TurnId) -> str:
        return await self.inner.tail(turn_id)

    async def read(self, turn_id: TurnId, *, after: str, wait_s: float, limit: int = 500) -> Any:
        return await self.inner.read(turn_id, after=after, wait_s=wait_s, limit=limit)

    async def release(self, turn_id: TurnId) -> None:
        await self.answers.wait()
        await self.inner.release(turn_id)

    async def ping(self) -> None:
        pass

    async def drop(self, turn_id: TurnId) -> None:
        await self.inner.drop(turn_id)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_worker_stopping_while_redis_does_not_answer_still_stops_and_hands_over(
    db: tuple[str, str | None],
) -> None:
    """SIGTERM while the replay buffer hangs: the drain ends (a turn's last entries are
    left to the Store, not waited for) and hands the turn over, so a process manager's
    stop timeout does not kill the worker with the turn's lease still held."""
    from turnkit import tool
    from turnkit.testing import call

    first_run = asyncio.Event()

    @tool
    async def slow_once(x: int) -> int:
        """Take long the first time only."""
        if not first_run.is_set():
            first_run.set()
            await asyncio.sleep(60)
        return x

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("slow_once", x=1)), ModelStep.text_reply("Done.")],
        repeat_last=True,
    )
    agent = Agent(model=model, tools=[slow_once], skip_stages=frozenset({"anchor-plan"}))
    url, schema = db
    config = RuntimeConfig(
        database_url=url, database_schema=schema, run_in_process=False, lease_ttl_s=60
    )
    buffer = _HungBuffer()
    async with SessionRuntime(agent=agent, config=config, replay=buffer) as runtime:
        turn = await runtime.submit("s-1", "go")
        stop = asyncio.Event()
        leaving = Worker(runtime, concurrency=1, poll_interval_s=0.02, drain_timeout_s=0.1)
        running = asyncio.create_task(leaving.run(stop))
        try:
            async with asyncio.timeout(20):
                await first_run.wait()  # mid-turn, its events not yet in the buffer
            stop.set()
            async with asyncio.timeout(30):  # before: waited for the buffer for ever
                await running
        finally:
            buffer.answers.set()
            await asyncio.gather(running, return_exceptions=True)
        record = await runtime.turn(turn.turn_id)
        assert record.status == "running"
        assert record.lease_expires_at is not None
        assert record.lease_expires_at <= runtime.clock.now()  # handed over, not held
        assert (
            await _status_once_driven(runtime, Worker(runtime, poll_interval_s=0.02), turn.turn_id)
            == "succeeded"
        )


async def test_a_turn_stopped_from_another_process_is_logged_cancelled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stop pressed on an API process: the worker says `cancelled`, not that it left it."""
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    url = f"sqlite:///{tmp_path / 'w.db'}"
    agent = Agent(model=ScriptedModel([ModelStep.hang()]), skip_stages=frozenset({"anchor-plan"}))
    api_config = RuntimeConfig(database_url=url, run_in_process=False)
    worker_config = RuntimeConfig(database_url=url, lease_ttl_s=0.3)
    async with (
        SessionRuntime(agent=agent, config=api_config) as api,
        SessionRuntime(agent=agent, config=worker_config) as hosting,
    ):
        turn = await api.submit("s-1", "wait for me")
        stop = asyncio.Event()
        worker = Worker(hosting, concurrency=1, poll_interval_s=0.02, sweep_interval_s=3600)
        running = asyncio.create_task(worker.run(stop))
        try:
            async with asyncio.timeout(20):
                while f"claimed turn {turn.turn_id}" not in caplog.text:
                    await asyncio.sleep(0.02)
                assert await api.cancel(turn.turn_id) in ("running", "cancelled")
                while f"finished turn {turn.turn_id}" not in caplog.text:
                    await asyncio.sleep(0.02)
        finally:
            stop.set()
            await running
        assert (await api.turn(turn.turn_id)).status == "cancelled"
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    [done] = [line for line in lines if line.startswith(f"finished turn {turn.turn_id} ")]
    assert re.fullmatch(
        rf"finished turn {turn.turn_id} \(session s-1\): cancelled in (\d+ ms|\d+\.\d s)", done
    ), done


async def test_a_turn_whose_model_this_worker_does_not_serve_fails_unknown_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The API process serves `fast` (`models=`), the worker does not: the turn says so."""
    caplog.set_level(logging.INFO, logger="turnkit.worker")
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'w.db'}", run_in_process=False)
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]))
    fast = ScriptedModel([ModelStep.text_reply("Fast.")])
    async with SessionRuntime(agent=agent, config=config, models={"fast": fast}) as api:
        submission = await api.submit("s1", "hello", model="fast")
    async with SessionRuntime(agent=agent, config=config) as worker_runtime:
        await _until_finished(worker_runtime, caplog, turns=1)
        record = await worker_runtime.turn(submission.turn_id)
    assert (record.status, record.error_code) == ("failed", "unknown-model")
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkit.worker"]
    [done] = [line for line in lines if line.startswith(f"finished turn {submission.turn_id} ")]
    assert "failed (unknown-model)" in done


def test_a_worker_drives_turns_with_the_runtime_its_flag_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--runtime`: the app's own runtime (its deps, served models, callback secret) drives
    the turns; the flags that would build another are refused beside it."""
    (tmp_path / "myapp.py").write_text(
        "from turnkit import Agent, RuntimeConfig, SessionRuntime, ToolContext, tool\n"
        "from turnkit.testing import ModelStep, ScriptedModel, call\n"
        "@tool\n"
        "async def whoami(ctx: ToolContext[dict]) -> str:\n"
        "    '''Who is asking.'''\n"
        "    return ctx.deps['user'] + ' / ' + str(ctx.callback_token is not None)\n"
        "fast = ScriptedModel([ModelStep.tool_call_reply(call('whoami')),\n"
        "                      ModelStep.text_reply('Done.')], name='fast')\n"
        "agent = Agent(model='openai/gpt-4o-mini', tools=[whoami],\n"
        "              skip_stages=frozenset({'anchor-plan'}))\n"
        f"URL = 'sqlite:///{tmp_path / 'app.db'}'\n"
        "def build() -> SessionRuntime:\n"
        "    config = RuntimeConfig(database_url=URL, run_in_process=False,\n"
        "                           recover_in_process=True,  # as the API's app has it\n"
        "                           callback_secret='s3cret-s3cret-s3cret-s3cret')\n"
        "    return SessionRuntime(agent=agent, config=config, models={'fast': fast},\n"
        "                          deps=lambda scope: {'user': 'ada'})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import importlib

    myapp = importlib.import_module("myapp")

    async def submit() -> str:
        async with myapp.build() as api:
            return (await api.submit("s1", "who am I?", model="fast")).turn_id

    turn_id = asyncio.run(submit())
    for flag in (["--database-url=sqlite:///x.db"], ["--database-u", "sqlite:///x.db"]):
        code = main(["worker", "--runtime", "myapp:build", *flag])
        assert code == 2  # a database beside the runtime's own: refused, in one line
        assert capsys.readouterr().err.startswith(
            "turnkit: --database-url cannot be given with --runtime: the runtime your function "
        )
    assert main(["worker", "--runtime", "myapp:build", "--budget", "enforce"]) == 2
    assert "--budgets cannot be given" in capsys.readouterr().err
    out = io.StringIO()
    out = io.StringIO()
    returned = threading.Event()

    def stop_soon() -> None:
        def watch() -> None:  # stop the worker once the turn has ended (20 s at most)
            import sqlite3

            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                with sqlite3.connect(tmp_path / "app.db") as db:
                    [(status,)] = db.execute(
                        "SELECT status FROM tk_turns WHERE turn_id = ?", (turn_id,)
                    ).fetchall()
                if status != "running":
                    break
                time.sleep(0.05)
            if not returned.is_set():  # (a worker that stopped on its own has no handler)
                os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()

    stop_soon()
    # An empty --agent is none (compose passes `--agent ${TURNKIT_AGENT:-}`, unset).
    argv = ["worker", "--runtime", "myapp:build", "--agent", "", "--poll-interval", "0.05"]
    code = main(argv, out=out)
    returned.set()
    assert code == 0
    said = capsys.readouterr().err
    assert "/recovery started" not in said  # the worker is the claim loop: no second one
    assert "worker " in said
    assert out.getvalue().startswith("turnkit worker ")
    assert "hosting assistant" in out.getvalue()  # the agent the runtime hosts

    async def read() -> tuple[TurnRecord, list[str]]:
        async with myapp.build() as runtime:
            record = await runtime.turn(turn_id)
            events = [e async for e in runtime.events(turn_id)]
            results = [e.result.output for e in events if e.type == "tool.completed"]
            return record, results

    record, results = asyncio.run(read())
    assert record.status == "succeeded"
    assert results == ["ada / True"]  # the app's deps and callback secret, in the worker


async def test_a_worker_stopping_while_a_turn_s_driver_is_being_built_hands_it_over(
    db: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while a claimed turn's driver is still being built: the drain hands that
    turn over too, so another worker takes it at once instead of after its lease lapses."""
    from turnkit.runtime._runner import TurnRunner

    building = asyncio.Event()
    built = TurnRunner.driver

    async def slow_build(self: TurnRunner, *args: Any, **kwargs: Any) -> Any:
        building.set()
        await asyncio.sleep(60)  # loading the agent's deps, say
        return await built(self, *args, **kwargs)

    agent = Agent(
        model=ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True),
        skip_stages=frozenset({"anchor-plan"}),
    )
    url, schema = db
    config = RuntimeConfig(
        database_url=url, database_schema=schema, run_in_process=False, lease_ttl_s=60
    )
    async with SessionRuntime(agent=agent, config=config) as runtime:
        turn = await runtime.submit("s-1", "go")
        stop = asyncio.Event()
        monkeypatch.setattr(TurnRunner, "driver", slow_build)
        leaving = Worker(runtime, concurrency=1, poll_interval_s=0.02, drain_timeout_s=0.1)
        running = asyncio.create_task(leaving.run(stop))
        try:
            async with asyncio.timeout(20):
                await building.wait()
            stop.set()
            async with asyncio.timeout(30):
                await running
        finally:
            await asyncio.gather(running, return_exceptions=True)
        monkeypatch.setattr(TurnRunner, "driver", built)
        record = await runtime.turn(turn.turn_id)
        assert record.status == "running"
        assert record.lease_expires_at is not None
        assert record.lease_expires_at <= runtime.clock.now()  # handed over, not held
        assert (
            await _status_once_driven(runtime, Worker(runtime, poll_interval_s=0.02), turn.turn_id)
            == "succeeded"
        )
