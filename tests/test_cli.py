"""The `turnkit` command line, in-process."""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import io
import json
import logging
import os
import re
import select
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL, require_service
from tests.support import openai_server as fake_openai
from tests.support.openai_server import FakeOpenAIServer, Reply
from tests.support.services import free_port
from turnkit import cli
from turnkit.cli import _worker as cli_worker, main
from turnkit.cli._inspect import usd
from turnkit.cli._logs import info_logs_to_stderr
from turnkit.cli._settings import ceiling, runtime_config
from turnkit.cli._worker import hosted_agents


def test_run_streams_a_turn_on_the_offline_demo_model(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(
        ["run", "What is (12 + 3) * 7?", "--database-url", f"sqlite:///{tmp_path / 'cli.db'}"],
        out=out,
    )
    text = out.getvalue()
    assert code == 0
    assert "OFFLINE DEMO model" in text  # clearly labelled as a demo
    assert "calculator(expression='(12 + 3) * 7')" in text
    assert "→ 105" in text
    assert "[demo model]" in text
    assert "✓ succeeded" in text


def test_db_upgrade_then_sweep(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    out = io.StringIO()
    assert main(["db", "upgrade", "--database-url", url], out=out) == 0
    assert "empty →" in out.getvalue()
    again = io.StringIO()
    assert main(["db", "upgrade", "--database-url", url], out=again) == 0
    assert "→" in again.getvalue()
    swept = io.StringIO()
    assert main(["sweep", "--database-url", url], out=swept) == 0
    assert "swept 0 turn(s)" in swept.getvalue()


def test_a_bad_agent_path_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    code = main(["worker", "--agent", "nowhere", "--database-url", url], out=io.StringIO())
    assert code == 2
    assert "package.module:name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://x", "supports SQLite and PostgreSQL"),
        ("sqlite:/turnkit.db", "is not a database URL: write sqlite:///"),  # one slash
        ("postgresql:/app:S3cret@db/app", "is not a database URL: write"),  # one slash
        ("postgresql://app:S3cret@db:5432x/app", "'postgresql://***@db:5432x/app' is not a"),
        ("turnkit.db", "is a file path, not a URL: write sqlite:///turnkit.db"),
        ("sqlite://turnkit.db", "names a host, which SQLite has none of"),  # else: in memory
        ("postgresql://app:S3cret@db:port/x", "'postgresql://***@db:port/x' is not a"),
        ("sqlite:////nonexistent-dir/x.db", "does its folder exist"),
        ("postgresql://postgres@127.0.0.1:1/x", "the database cannot be reached"),
    ],
)
def test_a_bad_database_url_is_one_clear_line(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["run", "hi"], ["db", "upgrade"]):  # a runtime's config, a Store alone
        code = main([*command, "--database-url", url], out=io.StringIO())
        err = capsys.readouterr().err
        assert code == 2, command
        assert says in err, command
        assert err.count("\n") == 1, command  # one line, no traceback
        assert err.startswith("turnkit: "), command
        assert "S3cret" not in err, command


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://nobody:S3cret@127.0.0.1:5432/test", 'role "nobody" does not exist'),
        ("postgresql://postgres@127.0.0.1:5432/no_such_db", 'database "no_such_db" does not'),
    ],
)
def test_a_database_that_refuses_the_login_is_one_clear_line(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    for command in (["run", "hi"], ["db", "upgrade"]):
        code = main([*command, "--database-url", url], out=io.StringIO())
        err = capsys.readouterr().err
        assert code == 2, command
        assert err.startswith("turnkit: cannot use the PostgreSQL database postgresql://")
        assert says in err
        assert err.count("\n") == 1  # one line, no traceback
        assert "S3cret" not in err


def test_a_schema_name_that_would_need_quoting_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://postgres@127.0.0.1:5432/test"
    for schema in ('bad"name', "Mixed", "1st", "x" * 64):
        code = main(["db", "upgrade", "--database-url", url, "--database-schema", schema])
        err = capsys.readouterr().err
        assert code == 2, schema
        assert f"database schema {schema!r} is not a plain PostgreSQL name" in err
        assert err.count("\n") == 1


def _mistyped_host_is_told_apart() -> bool:
    """Whether this machine's resolver says a `.invalid` name has no address (RFC 6761)."""
    try:
        socket.getaddrinfo("nosuchhost.invalid", 5432)
    except socket.gaierror as exc:
        return exc.errno == socket.EAI_NONAME
    return False


def test_serve_stops_on_a_database_host_that_still_does_not_resolve(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Waited for through the grace a platform's name may need, then one line, exit 2."""
    if not _mistyped_host_is_told_apart():
        pytest.skip("this machine's resolver cannot answer for a name that does not exist")
    monkeypatch.setattr("turnkit.runtime.worker.UNRESOLVED_GRACE_S", 0.5)
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_ALLOWED_HOSTS"):  # serve sets them
        monkeypatch.setenv(name, "")
    url = "postgresql://postgres:S3cret@nosuchhost.invalid/x"
    code = main(["serve", "--port", "1", "--database-url", url], out=io.StringIO())
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "turnkit: the database host 'nosuchhost.invalid' does not resolve: check the host "
        "name in the database URL [configuration-invalid; see "
        "docs/errors.md#configuration-invalid]"
    )
    waited = [r for r in caplog.records if "the database is unavailable (" in r.getMessage()]
    assert waited, "no wait through the grace"
    assert "S3cret" not in caplog.text


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_database_certificate_that_fails_verification_stops_at_once(
    tmp_path: Path, command: str
) -> None:
    """A CA the URL does not trust or a certificate for another name: one line, exit 2,
    where serve and worker used to retry forever."""
    from tests.support.tls_server import tls_postgres

    env = {**os.environ, "TURNKIT_GC": "python"}
    with tls_postgres(tmp_path) as (port, cert):
        url = f"postgresql://u@127.0.0.1:{port}/x?sslmode=verify-full&sslrootcert={cert}"
        flags = ["--port", "1"] if command == "serve" else []
        done = subprocess.run(
            [sys.executable, "-m", "turnkit.cli", command, *flags, "--database-url", url],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(
        "turnkit: the database's TLS certificate cannot be verified ([SSL: CERTIFICATE_VERIFY"
    ), line
    assert line.endswith(
        "check sslmode and sslrootcert in the database URL, and the server's certificate "
        "[configuration-invalid; see docs/errors.md#configuration-invalid]"
    ), line


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_tls_file_with_no_certificate_in_it_stops_at_once(tmp_path: Path, command: str) -> None:
    """An empty `sslrootcert`: one line naming the option and the path, exit 2, where
    serve and worker retried as if the database were down.

    The driver reads the files before it connects: no server is needed (port 1).
    """
    (tmp_path / "empty.pem").write_text("")
    env = {**os.environ, "TURNKIT_GC": "python"}
    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCRL"):
        env.pop(name, None)
    flags = ["--port", "1"] if command == "serve" else []
    url = f"postgresql://u:S3cret@127.0.0.1:1/x?sslmode=verify-ca&sslrootcert={tmp_path}/empty.pem"
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", command, *flags, "--database-url", url],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "unavailable" not in done.stderr  # never taken for an outage
    [line] = done.stderr.splitlines()
    assert line.startswith(
        "turnkit: a TLS file the database URL names cannot be used ([X509: NO_CERTIFICATE_OR_CRL"
    ), line
    assert line.endswith("[configuration-invalid; see docs/errors.md#configuration-invalid]")
    assert "S3cret" not in done.stderr + done.stdout


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_tls_file_the_database_url_names_and_that_is_still_not_there_stops_after_the_grace(
    tmp_path: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A missing `sslrootcert`/`sslcert`, or a directory where it should be: waited for
    as a certificate a sidecar writes after the start may be, saying so, then one line
    naming the option and the path, exit 2.
    """
    monkeypatch.setattr("turnkit.runtime.worker.UNRESOLVED_GRACE_S", 0.5)
    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCRL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_ALLOWED_HOSTS", "TURNKIT_AGENT"):
        monkeypatch.setenv(name, "")  # serve sets the first two
    flags = ["--port", "1"] if command == "serve" else []
    missing = tmp_path / "certs" / "ca.pem"
    for query, says in (
        (f"sslmode=verify-full&sslrootcert={missing}",
         f"sslrootcert in the database URL names '{missing}', which does not exist: "),
        (f"sslmode=require&sslcert={missing}&sslkey={missing}",
         f"sslcert in the database URL names '{missing}', which does not exist: "),
        (f"sslmode=require&sslrootcert={tmp_path}",
         f"sslrootcert in the database URL names '{tmp_path}', which is a directory, not a "),
    ):  # fmt: skip
        url = f"postgresql://u:S3cret@127.0.0.1:1/x?{query}"
        out = io.StringIO()
        assert main([command, *flags, "--database-url", url], out=out) == 2
        err = capsys.readouterr().err
        first = err.splitlines()[0]  # said at once, then waited for
        assert f": {says}" in first
        assert first.endswith("waiting up to 0.5 s for it")
        line = err.splitlines()[-1]
        assert line.startswith(f"turnkit: {says}"), line
        assert line.endswith("[configuration-invalid; see docs/errors.md#configuration-invalid]")
        assert "S3cret" not in err + out.getvalue()


def test_serve_waits_for_a_database_that_refuses_connections(tmp_path: Path) -> None:
    """A database restarting under a deploy refuses connections for a while: serve waits
    (saying so) instead of exiting, as a worker does."""
    env = {**os.environ, "TURNKIT_GC": "python"}
    url = "postgresql://postgres@127.0.0.1:1/x"
    with subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", "serve", "--port", "0", "--database-url", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    ) as proc:  # fmt: skip
        try:
            assert proc.stderr is not None
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            assert ready, "serve said nothing in 60 s"
            first = proc.stderr.readline()
            assert "WARNING turnkit.cli: the database is unavailable (" in first, first
            assert "retrying with backoff" in first
            assert proc.poll() is None  # still waiting
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_serve_waits_for_a_postgresql_that_takes_no_writes(tmp_path: Path) -> None:
    """Read-only (a replica after a failover): its schema reads fine, but the app's start
    sets up checkpoint tables, a write. serve waits, as the worker does, where its
    lifespan used to fail with a traceback."""
    import asyncio

    import asyncpg
    from sqlalchemy.engine import make_url

    admin = make_url(POSTGRES_URL)
    require_service("PostgreSQL", admin.host or "127.0.0.1", admin.port or 5432)
    name = f"tk_ro_{uuid.uuid4().hex[:12]}"
    url = admin.set(database=name).render_as_string(hide_password=False)

    async def database(sql: str) -> None:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(database(f"CREATE DATABASE {name}"))
    try:
        assert main(["db", "upgrade", "--database-url", url], out=io.StringIO()) == 0
        asyncio.run(database(f"ALTER DATABASE {name} SET default_transaction_read_only = on"))
        env = {**os.environ, "TURNKIT_GC": "python"}
        with subprocess.Popen(
            [sys.executable, "-m", "turnkit.cli", "serve", "--port", "0", "--database-url", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        ) as proc:  # fmt: skip
            try:
                assert proc.stderr is not None
                ready, _, _ = select.select([proc.stderr], [], [], 60)
                assert ready, "serve said nothing in 60 s"
                first = proc.stderr.readline()
                assert "WARNING turnkit.cli: the database is unavailable (" in first, first
                assert "read-only" in first
                assert proc.poll() is None  # still waiting
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        asyncio.run(database(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def test_serve_reports_a_database_it_cannot_use_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "TURNKIT_GC": "python"}
    env.pop("TURNKIT_DATABASE_URL", None)
    for flags, says in (
        (["--database-url", "nonsense"], "'nonsense' is a file path, not a URL: write sqlite:///"),
        (["--port", "99999"], "argument --port: '99999' is not a port number (0-65535)"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "turnkit.cli", "serve", "--port", "1", *flags],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert says in done.stderr
        assert "Traceback" not in done.stderr
        assert "serving on" not in done.stdout  # it never served


def test_serve_and_worker_refuse_a_redis_database_redis_does_not_have(tmp_path: Path) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    url = "redis://127.0.0.1:6379/99"  # Redis has 16 databases unless told otherwise
    env = {**os.environ, "TURNKIT_GC": "python", "TURNKIT_REDIS_URL": url}
    env.pop("TURNKIT_DATABASE_URL", None)
    for command in (["serve", "--port", "1"], ["worker"]):
        done = subprocess.run(
            [sys.executable, "-m", "turnkit.cli", *command],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(
            "turnkit: Redis refused this replay buffer's connection: DB index is out of range"
        ), done.stderr
        assert done.stderr.count("\n") == 1  # one line, not a failed lifespan's traceback


def test_serve_refuses_an_allowed_origin_that_is_not_one_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "TURNKIT_GC": "python", "TURNKIT_ALLOWED_ORIGINS": "app.example.com"}
    env.pop("TURNKIT_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "serve", "--port", "0",
         "--database-url", f"sqlite:///{tmp_path / 'tk.db'}"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "turnkit: TURNKIT_ALLOWED_ORIGINS: 'app.example.com' is not an origin (no scheme); "
        "write scheme://host[:port], such as https://chat.example.com"
    ), done.stderr
    assert done.stderr.count("\n") == 1
    assert "serving on" not in done.stdout


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    import socket

    env = {**os.environ, "TURNKIT_GC": "python"}
    env.pop("TURNKIT_DATABASE_URL", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [sys.executable, "-m", "turnkit.cli", "serve", "--port", port,
             "--database-url", f"sqlite:///{tmp_path / 'tk.db'}"],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"turnkit: cannot listen on 127.0.0.1:{port}: Address already")
    assert done.stderr.count("\n") == 1
    assert "serving on" not in done.stdout


def test_serve_serves_the_runtime_its_flag_names(tmp_path: Path) -> None:
    """`--runtime`: the quickstart app around the app's own runtime (its deps factory)."""

    (tmp_path / "servedapp.py").write_text(
        "from turnkit import Agent, RuntimeConfig, SessionRuntime, ToolContext, tool\n"
        "from turnkit.testing import ModelStep, ScriptedModel, call\n"
        "@tool\n"
        "async def tenant(ctx: ToolContext[dict]) -> str:\n"
        "    '''The caller tenant.'''\n"
        "    return ctx.deps['tenant']\n"
        "model = ScriptedModel([ModelStep.tool_call_reply(call('tenant')),\n"
        "                       ModelStep.text_reply('Served.')])\n"
        "agent = Agent(model=model, tools=[tenant], skip_stages=frozenset({'anchor-plan'}))\n"
        f"URL = 'sqlite:///{tmp_path / 'app.db'}'\n"
        "async def build() -> SessionRuntime:\n"
        "    return SessionRuntime(agent=agent, config=RuntimeConfig(database_url=URL),\n"
        "                          deps=lambda scope: {'tenant': 'acme'})\n"
    )
    port = free_port()
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "TURNKIT_GC": "python", "PYTHONPATH": os.pathsep.join(paths)}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_MODEL", "TURNKIT_RUNTIME"):
        env.pop(name, None)
    refused = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "serve", "--runtime", "servedapp:build",
         "--agent", "servedapp:agent"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.startswith("turnkit: --agent cannot be given with --runtime")
    argv = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port)]
    log = (tmp_path / "serve.log").open("w")
    served_env = {**env, "TURNKIT_RUNTIME": "servedapp:build"}
    server = subprocess.Popen(argv, cwd=tmp_path, env=served_env, stdout=log, stderr=log)
    try:
        body = _execute_once_up(server, port, tmp_path / "serve.log")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert '"output":"acme"' in body  # the app's deps factory, not none
    assert "Served." in body
    assert (tmp_path / "app.db").exists()  # the runtime's database, not ./turnkit.db
    assert not (tmp_path / "turnkit.db").exists()
    said = (tmp_path / "serve.log").read_text()  # its first line: the runtime's own parts
    assert f"from sqlite:///{tmp_path / 'app.db'}, hosting assistant (model " in said, said


def test_serve_hosts_the_agents_its_flags_name(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    (tmp_path / "my_agents.py").write_text(
        "from turnkit import Agent\n"
        "from turnkit.testing import ModelStep, ScriptedModel\n"
        "helper = Agent(name='helper', model=ScriptedModel([ModelStep.text_reply("
        "'Hello from my agent.')], repeat_last=True), skip_stages=frozenset({'anchor-plan'}))\n"
    )
    port = free_port()
    env = {**os.environ, "TURNKIT_GC": "python"}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_MODEL"):
        env.pop(name, None)
    db = f"sqlite:///{tmp_path / 's.db'}"
    argv = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port),
            "--agent", "my_agents:helper", "--database-url", db]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        body = _execute_once_up(server, port, tmp_path / "serve.log")
        assert "Hello from my agent." in body
        assert '"agent":"helper"' in body
        # Served on loopback, it answers to loopback names only (against DNS rebinding).
        rebound = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/harness/sessions",
            headers={"Host": f"attacker.example:{port}"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=30)
        assert refused.value.code == 400
        assert b'"code":"host-not-allowed"' in refused.value.read()
        named = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/harness/sessions", headers={"Host": f"localhost:{port}"}
        )
        with urllib.request.urlopen(named, timeout=30) as response:
            assert response.status == 200
        # A page on another site cannot make a browser create or stop anything here.
        forged = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/harness/sessions",
            method="POST",
            headers={"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged, timeout=30)
        assert refused.value.code == 403
        assert b'"code":"cross-origin-request"' in refused.value.read()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_serve_on_loopback_with_an_empty_allowed_hosts_answers_loopback_names_only(
    tmp_path: Path,
) -> None:
    """`TURNKIT_ALLOWED_HOSTS=` (an env file's blank, compose's unset `${…:-}`) is unset."""
    import urllib.error
    import urllib.request

    port = free_port()
    env = {**os.environ, "TURNKIT_GC": "python", "TURNKIT_ALLOWED_HOSTS": " \t"}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_MODEL", "TURNKIT_RUNTIME"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port),
            "--database-url", f"sqlite:///{tmp_path / 's.db'}"]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        _execute_once_up(server, port, tmp_path / "serve.log")
        rebound = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/harness/sessions",
            headers={"Host": f"attacker.example:{port}"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=30)
        assert refused.value.code == 400
        assert b'"code":"host-not-allowed"' in refused.value.read()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_a_missing_extra_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "redis", None)  # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    monkeypatch.delitem(sys.modules, "turnkit.replay.redis", raising=False)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    code = main(
        ["worker", "--redis-url", "redis://127.0.0.1:1", "--database-url", url], out=io.StringIO()
    )
    err = capsys.readouterr().err
    assert code == 2
    assert 'pip install "turnkit[redis]"' in err
    assert err.count("\n") == 1

    monkeypatch.setitem(sys.modules, "asyncpg", None)
    code = main(["db", "upgrade", "--database-url", "postgresql://postgres@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith('turnkit: A PostgreSQL database cannot run without the "postgres"')
    assert 'pip install "turnkit[postgres]"' in err


async def _abandoned_turn(url: str, *, lease_ttl_s: float = 0.2, claims: int = 1) -> str:
    """A turn claimed `claims` times and never driven: no attempt commits any progress."""
    import asyncio

    from turnkit import Agent, RuntimeConfig, SessionRuntime
    from turnkit.testing import ModelStep, ScriptedModel

    config = RuntimeConfig(database_url=url, lease_ttl_s=lease_ttl_s)
    runtime = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.hang("...")])), config=config
    )
    async with runtime:
        submission = await runtime.submit("s1", "hi", claim=True)  # claimed, never driven
        for _ in range(claims - 1):  # the lease lapses; another attempt claims it, dies too
            await asyncio.sleep(lease_ttl_s + 0.1)
            lease = await runtime.store.claim("other:1:x", ttl_s=30, max_attempts=5)
            assert lease is not None
            assert lease.turn_id == submission.turn_id
    return submission.turn_id


def test_turns_stuck_lists_a_turn_no_process_claimed(tmp_path: Path) -> None:
    """No worker runs: the session's next turn waits for ever, and says so; not the one
    waiting behind it, which waits its turn."""
    import asyncio
    import time

    from turnkit import Agent, RuntimeConfig, SessionRuntime
    from turnkit.testing import ModelStep, ScriptedModel

    url = f"sqlite:///{tmp_path / 'unclaimed.db'}"

    async def submit() -> list[str]:
        config = RuntimeConfig(database_url=url, run_in_process=False)
        agent = Agent(model=ScriptedModel([ModelStep.text_reply("never")]))
        async with SessionRuntime(agent=agent, config=config) as runtime:
            first = await runtime.submit("s1", "hi")
            second = await runtime.submit("s1", "and then")
        return [first.turn_id, second.turn_id]

    first, second = asyncio.run(submit())
    assert _stuck(url) == (0, "no stuck turns\n")  # just sent: a worker may claim it yet
    time.sleep(0.3)
    code, out = _stuck(url, "--unclaimed-after", "0.2")
    assert code == 1
    assert f"{first}  session s1  attempt 0" in out
    assert re.search(r"no process claimed it in \d+ s", out), out  # 0 s, or 1 under load
    assert second not in out


def _stuck(url: str, *flags: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["turns", "--stuck", "--database-url", url, *flags], out=out)
    return code, out.getvalue()


def test_commands_that_read_a_database_refuse_one_that_is_not_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "turnkti.db"
    url = f"sqlite:///{typo}"
    for command in (
        ["turns", "--stuck"],
        ["turns", "--session", "s1"],
        ["sessions"],
        ["events", "turn_x"],
        ["sweep"],
        ["budgets", "list"],
    ):
        assert main([*command, "--database-url", url], out=io.StringIO()) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"turnkit: there is no database at {str(typo)!r} (a typo?")
        assert not typo.exists()  # not created empty, to answer "no stuck turns"


def test_commands_that_read_postgres_refuse_a_schema_turnkit_never_set_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import asyncio

    import asyncpg

    require_service("PostgreSQL", "127.0.0.1", 5432)
    typo = f"tk_typo_{uuid.uuid4().hex[:8]}"
    for command in (["turns", "--stuck"], ["sweep"], ["budgets", "list"]):
        flags = ["--database-url", POSTGRES_URL, "--database-schema", typo]
        assert main([*command, *flags], out=io.StringIO()) == 2, command
        err = capsys.readouterr().err
        assert f"has no turnkit tables in schema {typo!r} (a typo?" in err

    async def schemas() -> int:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            query = "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1"
            return int(await conn.fetchval(query, typo))
        finally:
            await conn.close()

    assert asyncio.run(schemas()) == 0  # not created, to answer "no stuck turns"


def test_turns_stuck_lists_a_turn_with_no_live_driver(tmp_path: Path) -> None:
    import asyncio
    import time

    url = f"sqlite:///{tmp_path / 'stuck.db'}"
    assert main(["db", "upgrade", "--database-url", url], out=io.StringIO()) == 0
    assert _stuck(url) == (0, "no stuck turns\n")
    turn_id = asyncio.run(_abandoned_turn(url))
    time.sleep(0.3)  # its lease lapses
    code, out = _stuck(url)
    assert code == 1
    assert turn_id in out
    assert "no live driver" in out


def test_turns_stuck_lists_a_turn_past_the_ceiling(tmp_path: Path) -> None:
    import asyncio
    import time

    url = f"sqlite:///{tmp_path / 'ceiling.db'}"
    turn_id = asyncio.run(_abandoned_turn(url, lease_ttl_s=60))  # its lease is still live
    assert _stuck(url) == (0, "no stuck turns\n")  # well within the default ceiling
    time.sleep(0.3)
    code, out = _stuck(url, "--ceiling", "0.2")
    assert code == 1
    [line] = [line for line in out.splitlines() if turn_id in line]
    assert line.endswith("— past the ceiling"), line  # its driver is not the problem
    assert "attempt 1" in line


def test_turns_stuck_lists_a_turn_whose_attempts_died_without_progress(tmp_path: Path) -> None:
    import asyncio

    url = f"sqlite:///{tmp_path / 'fruitless.db'}"
    turn_id = asyncio.run(_abandoned_turn(url, claims=2))  # the second lease is live (30 s)
    code, out = _stuck(url)
    assert code == 1
    [line] = [line for line in out.splitlines() if turn_id in line]
    assert line.endswith("— 1 attempt(s) died without progress"), line
    assert "attempt 2" in line
    assert "owner other:1:x" in line


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"turnkit {importlib.metadata.version('turnkit')}\n"


def test_python_dash_m_turnkit_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnkit", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"turnkit {importlib.metadata.version('turnkit')}\n"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "turnkit: error: choose a command (turnkit -h says what each does)"),
        (["--bogus"], "turnkit: error: unrecognized arguments: --bogus"),
        (
            ["answer", "t1", "--approve", "--arguments", '{"to": 5'],
            "turnkit answer: error: argument --arguments: '{\"to\": 5' is not JSON "
            "(Expecting ',' delimiter: line 1 column 9 (char 8))",
        ),
        (
            ["budgets", "set", "--tokens", "many"],
            "turnkit budgets set: error: argument --tokens: invalid int value: 'many'",
        ),
    ],
)
def test_no_command_or_an_unknown_option_says_which(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [says]  # one line, no usage


def _options(
    parser: argparse.ArgumentParser, path: str = "turnkit"
) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action._choices_actions:  # the help line of each subcommand
                yield f"{path} {command.dest}", command
            for name, child in action.choices.items():
                yield from _options(child, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_command_and_option_has_help() -> None:
    found = list(_options(cli._parser()))
    missing = [f"{path} {action.dest}" for path, action in found if not (action.help or "").strip()]
    assert missing == []
    paths = {path for path, _ in found}
    assert {"turnkit worker", "turnkit db upgrade", "turnkit run"} <= paths  # walked them all


@pytest.mark.parametrize(
    ("cost", "shown"),
    [
        (0.0, "$0"),
        (0.00004, "$0.00004"),
        (0.0000412345, "$0.0000412"),
        (0.0123, "$0.0123"),
        (0.5, "$0.5"),
        (1.234, "$1.23"),
        (1234.5, "$1,234.50"),
    ],
)
def test_costs_print_with_significant_digits(cost: float, shown: str) -> None:
    assert usd(cost) == shown


def test_the_worker_command_shows_worker_lines_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class OneLineWorker:
        def __init__(self, runtime: object, **options: object) -> None:
            pass

        async def run(self, stop: object) -> None:
            logging.getLogger("turnkit.worker").info("claimed turn t1 (session s1, attempt 1)")
            try:
                raise ConnectionRefusedError("the server is down")
            except ConnectionRefusedError:  # as asyncpg's pool warns while reconnecting
                logging.getLogger("asyncpg.pool").warning(
                    "Failed to restore the pool connection floor; retrying", exc_info=True
                )

    monkeypatch.setattr(cli_worker, "Worker", OneLineWorker)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    seen: list[logging.LogRecord] = []
    yours = logging.Handler()  # the app's own handler, beside the command's
    yours.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("asyncpg").addHandler(yours)
    try:
        assert main(["worker", "--database-url", url], out=io.StringIO()) == 0
    finally:
        logging.getLogger("asyncpg").removeHandler(yours)
    assert seen[0].exc_info is not None  # the one-line form is the command's own
    err = capsys.readouterr().err
    assert "INFO turnkit.worker: claimed turn t1 (session s1, attempt 1)" in err
    assert (
        "WARNING asyncpg.pool: Failed to restore the pool connection floor; retrying: "
        "ConnectionRefusedError('the server is down')\n"
    ) in err
    assert "Traceback" not in err
    assert logging.getLogger("turnkit").handlers == []  # the command cleans up after itself
    assert logging.getLogger("asyncpg").handlers == []  # (ours removed above)

    out = io.StringIO()  # its first line names the database, never its password
    secret = "postgresql://app:S3cret@127.0.0.1:1/x"
    assert main(["worker", "--database-url", secret], out=out) == 0
    assert " on postgresql://app:***@127.0.0.1:1/x, hosting demo (model " in out.getvalue()
    assert "S3cret" not in out.getvalue()
    out = io.StringIO()  # nor one given in its query, nor a client key's passphrase
    query = "postgresql://app@127.0.0.1:1/x?password=S3cret&sslpassword=K3yPass&sslmode=prefer"
    assert main(["worker", "--database-url", query], out=out) == 0
    assert (
        " on postgresql://app@127.0.0.1:1/x?password=***&sslmode=prefer&sslpassword=***, "
    ) in out.getvalue()
    assert "S3cret" not in out.getvalue()
    assert "K3yPass" not in out.getvalue()


def test_a_database_url_is_shown_without_the_secrets_in_its_query() -> None:
    """A password, a client key's passphrase or a token in the query is `***`; the rest,
    file paths included, stays readable."""
    from turnkit.store.sql import shown_url

    url = (
        "postgresql+asyncpg://u:pw@db:5432/app?sslmode=verify-full&sslpassword=K3yPass"
        "&sslkey=/certs/client.key&sslcert=/certs/client.crt&sslrootcert=/certs/ca.pem"
        "&passfile=/home/u/.pgpass&application_name=api&password=S3cret&AuthToken=T0k&x_Key=z"
    )
    assert shown_url(url) == (  # as SQLAlchemy renders a query: sorted, paths quoted
        "postgresql://u:***@db:5432/app?AuthToken=***&application_name=api"
        "&passfile=%2Fhome%2Fu%2F.pgpass&password=***&sslcert=%2Fcerts%2Fclient.crt"
        "&sslkey=%2Fcerts%2Fclient.key&sslmode=verify-full&sslpassword=***"
        "&sslrootcert=%2Fcerts%2Fca.pem&x_Key=***"
    )
    # One SQLAlchemy cannot read (a port that is no number): all before the host hidden.
    assert shown_url("postgresql://u:pw@db:x/app?password=S3cret&sslmode=require") == (
        "postgresql://***@db:x/app?password=***&sslmode=require"
    )
    assert shown_url("sqlite:///tmp/app.db") == "sqlite:///tmp/app.db"


def test_the_worker_s_first_line_names_each_agent_s_model_and_the_demo_one_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Idle:
        def __init__(self, runtime: object, **options: object) -> None:
            pass

        async def run(self, stop: object) -> None:
            pass

    monkeypatch.setattr(cli_worker, "Worker", Idle)
    monkeypatch.delenv("TURNKIT_AGENT", raising=False)
    monkeypatch.delenv("TURNKIT_MODEL", raising=False)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    out = io.StringIO()
    assert main(["worker", "--database-url", url], out=out) == 0
    assert out.getvalue().endswith(
        ", hosting demo (model turnkit-demo, the OFFLINE DEMO model: fixed rules, not an LLM; "
        "set TURNKIT_MODEL or --agent for a real one)\n"
    )
    monkeypatch.setenv("TURNKIT_MODEL", "openai/gpt-4o-mini")
    out = io.StringIO()
    assert main(["worker", "--database-url", url], out=out) == 0
    assert out.getvalue().endswith(", hosting demo (model openai/gpt-4o-mini)\n")
    assert "DEMO" not in out.getvalue()


def test_a_start_up_line_names_served_models_without_their_secrets() -> None:
    from turnkit import Agent, ModelFamily, SessionRuntime
    from turnkit.cli._settings import hosting
    from turnkit.demo import DemoModel
    from turnkit.models.litellm import LiteLLMClient, ModelEndpoint

    proxy = "https://app:S3cret@llm.example.com:8443/v1?api-key=K3y"
    keyed = "https://gateway.example.com/key/sk-Pr0xyKey123/v1"
    cheap = ModelFamily("cheap", [LiteLLMClient("openai/gpt-4o-mini", api_key="sk-L34k"),
                                  DemoModel()])  # fmt: skip
    fast = ModelEndpoint(model="openai/gpt-4o", api_base=proxy, api_key_env="FAST_KEY")
    runtime = SessionRuntime(
        agents=[
            Agent(name="support", model="fast"),
            Agent(name="triage", model=cheap),
            Agent(name="plain", model="anthropic/claude-3-5-haiku"),
            Agent(name="gated", model="gated"),
        ],
        models={"fast": fast, "gated": ModelEndpoint(model="openai/gpt-4o", api_base=keyed)},
    )
    line = hosting(runtime)
    assert line == (
        "support (model fast: openai/gpt-4o at https://llm.example.com:8443/v1), "
        "triage (model family cheap: openai/gpt-4o-mini, turnkit-demo, the OFFLINE DEMO model: "
        "fixed rules, not an LLM; set TURNKIT_MODEL or --agent for a real one), "
        "plain (model anthropic/claude-3-5-haiku), "
        "gated (model gated: openai/gpt-4o at https://gateway.example.com/key/sk-***/v1)"
    )
    for secret in ("S3cret", "K3y", "sk-L34k", "Pr0xyKey123"):
        assert secret not in line


def test_the_worker_listens_unless_told_only_to_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    class Recorded:
        def __init__(self, runtime: object, **options: object) -> None:
            seen.append(options["listen"])

        async def run(self, stop: object) -> None:
            pass

    monkeypatch.setattr(cli_worker, "Worker", Recorded)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    assert main(["worker", "--database-url", url], out=io.StringIO()) == 0
    assert main(["worker", "--no-listen", "--database-url", url], out=io.StringIO()) == 0
    assert seen == [True, False]


@pytest.fixture(autouse=True)
def gc_restored() -> Iterator[None]:
    """`turnkit worker` and `serve` tune this process's collector: undo it after each test."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def _gc_seen_by_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, tuple[int, int, int], int]:
    seen: list[tuple[tuple[int, int, int], int]] = []

    class GcWorker:
        def __init__(self, runtime: object, **options: object) -> None:
            pass

        async def run(self, stop: object) -> None:
            seen.append((gc.get_threshold(), gc.get_freeze_count()))

    monkeypatch.setattr(cli_worker, "Worker", GcWorker)
    code = main(["worker", "--database-url", f"sqlite:///{tmp_path / 'gc.db'}"], out=io.StringIO())
    threshold, frozen = seen[0] if seen else ((0, 0, 0), 0)
    return code, threshold, frozen


def test_the_worker_freezes_start_up_objects_and_collects_less_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNKIT_GC", raising=False)
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    code, threshold, frozen = _gc_seen_by_worker(tmp_path, monkeypatch)
    assert code == 0
    assert threshold == cli.GC_THRESHOLDS
    assert frozen > 10_000  # the imported modules' objects are no longer scanned


def test_turnkit_gc_python_keeps_pythons_collector_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNKIT_GC", "python")
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    code, threshold, frozen = _gc_seen_by_worker(tmp_path, monkeypatch)
    assert (code, threshold, frozen) == (0, (700, 10, 10), 0)


def test_a_bad_turnkit_gc_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNKIT_GC", "fast")
    code = main(["serve", "--port", "1"], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("turnkit: TURNKIT_GC must be 'tuned' or 'python', not 'fast'")
    assert err.count("\n") == 1


def test_serve_without_the_server_extra_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    code = main(["serve", "--port", "1"], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install 'turnkit[fastapi]'" in err
    assert "uvicorn is missing" in err
    # Into the Python that runs turnkit (a bare `pip` may be another's), and from a checkout.
    assert f"{sys.executable} -m pip install 'turnkit[fastapi]'" in err
    assert "from a checkout: -e '.[fastapi]'" in err
    assert err.count("\n") == 1


def test_serve_without_the_server_extra_names_uv_in_a_venv_uv_made(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """uv's virtual environments have no pip: `python -m pip` there fails."""
    (tmp_path / "pyvenv.cfg").write_text(
        "home = /usr/bin\nimplementation = CPython\nuv = 0.5.11\nversion_info = 3.12.8\n"
    )
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    code = main(["serve", "--port", "1"], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert f"uv pip install --python {sys.executable} 'turnkit[fastapi]'" in err
    assert "-m pip" not in err
    assert err.count("\n") == 1


def test_the_install_command_fits_the_environment(tmp_path: Path) -> None:
    from turnkit.cli._settings import install_command

    made_by_venv = tmp_path / "venv"
    made_by_venv.mkdir()
    (made_by_venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    assert install_command("x[y]", prefix=str(made_by_venv), executable="/v/bin/python") == (
        "/v/bin/python -m pip install 'x[y]'"
    )
    made_by_uv = tmp_path / "uv"
    made_by_uv.mkdir()
    (made_by_uv / "pyvenv.cfg").write_text("home = /usr/bin\nuv = 0.5.11\n")
    assert install_command("x[y]", prefix=str(made_by_uv), executable="/u/bin/python") == (
        "uv pip install --python /u/bin/python 'x[y]'"
    )
    no_venv = tmp_path / "system"  # no pyvenv.cfg at all: the system's Python
    assert install_command("x", prefix=str(no_venv), executable="/usr/bin/python3") == (
        "/usr/bin/python3 -m pip install 'x'"
    )


# ── models, endpoints and agents from the command line ─────────────────────────────

openai_server = fake_openai.openai_server  # the fixture, visible to this module's tests


def test_run_reaches_an_openai_compatible_server_with_settings(
    openai_server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TK_CLI_TEST_KEY", "sk-cli")
    openai_server.script("local-model", [Reply.text("Hello from the local server.")])
    out = io.StringIO()
    code = main(
        [
            "run", "hi", "--model", "openai/local-model", "--api-base", openai_server.base_url,
            "--api-key-env", "TK_CLI_TEST_KEY", "--temperature", "0.3", "--seed", "5",
            "--database-url", f"sqlite:///{tmp_path / 'cli.db'}",
        ],
        out=out,
    )  # fmt: skip
    assert code == 0, out.getvalue()
    assert "Hello from the local server." in out.getvalue()
    assert "usage: 1 model call · " in out.getvalue()
    assert "OFFLINE DEMO" not in out.getvalue()
    answered = [r for r in openai_server.requests if r.get("tools")]  # the reasoning call
    assert answered
    assert answered[-1]["temperature"] == 0.3
    assert answered[-1]["seed"] == 5
    assert openai_server.headers[-1]["authorization"] == "Bearer sk-cli"


def test_an_api_base_without_a_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNKIT_MODEL", raising=False)
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    argv = ["run", "hi", "--api-base", "http://127.0.0.1:1/v1", "--database-url", url]
    assert main(argv, out=io.StringIO()) == 2  # not the demo model, silently
    err = capsys.readouterr().err
    assert err.startswith("turnkit: --api-base is for --model (or $TURNKIT_MODEL): name the model")


def test_run_with_a_blank_model_variable_runs_the_demo_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`TURNKIT_MODEL=" "` (a blank in a .env or a ConfigMap) is unset, as serve and the
    worker have it: the demo model answers, not an unknown model ' '."""
    monkeypatch.setenv("TURNKIT_MODEL", " \t")
    out = io.StringIO()
    assert main(["run", "What is 2 + 3?", "--database-url", f"sqlite:///{tmp_path / 'd.db'}"],
                out=out) == 0  # fmt: skip
    assert "5" in out.getvalue()


def test_run_with_a_missing_key_names_the_variable(
    openai_server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TK_CLI_UNSET_KEY", raising=False)
    out = io.StringIO()
    code = main(
        [
            "run", "hi", "--model", "openai/local-model", "--api-base", openai_server.base_url,
            "--api-key-env", "TK_CLI_UNSET_KEY",
            "--database-url", f"sqlite:///{tmp_path / 'cli.db'}",
        ],
        out=out,
    )  # fmt: skip
    assert code == 1
    assert "TK_CLI_UNSET_KEY" in out.getvalue()
    assert "model-credentials" in out.getvalue()
    assert openai_server.requests == []


def test_run_loads_an_agent_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_cli_agent.py").write_text(
        "from turnkit import Agent\n"
        "from turnkit.testing import ModelStep, ScriptedModel\n"
        "agent = Agent(name='mine', model=ScriptedModel([ModelStep.text_reply('mine says hi')]),"
        " skip_stages=frozenset({'anchor-plan'}))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    out = io.StringIO()
    code = main(["run", "hi", "--agent", "my_cli_agent:agent"], out=out)
    assert code == 0, out.getvalue()
    assert "mine says hi" in out.getvalue()


def test_a_setting_out_of_range_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    code = main(["run", "hi", "--temperature", "5", "--database-url", url], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    suffix = " [configuration-invalid; see docs/errors.md#configuration-invalid]\n"
    assert err == (
        "turnkit: invalid setting: --temperature: Input should be less than or equal to 2" + suffix
    )

    budget = ["budgets", "set", "--scope", "department", "--usd", "1", "--database-url", url]
    said = io.StringIO()
    assert main(budget, out=said) == 2
    fresh = f"no turnkit database at {url} yet: creating it\n"  # a typo'd path shows at once
    assert said.getvalue() == fresh
    err = capsys.readouterr().err  # the model's own check: no empty field, no pydantic prefix
    assert err == (
        "turnkit: invalid setting: a department limit needs a --key (which department)" + suffix
    )


def _checkpoints(db: Path) -> int:
    import sqlite3

    with sqlite3.connect(db.with_suffix(".checkpoints.db")) as conn:
        return int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])


def test_checkpoint_durability_decides_how_many_checkpoints_a_turn_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "pruned.db"
    assert main(["run", "What is 2 + 3?", "--database-url", f"sqlite:///{db}"]) == 0
    assert _checkpoints(db) == 0  # an ended turn's checkpoints are deleted
    written = {}
    monkeypatch.setenv("TURNKIT_KEEP_ENDED_CHECKPOINTS", "1")  # what the turn wrote, kept
    for durability in ("sync", "exit"):
        db = tmp_path / f"{durability}.db"
        args = ["run", "What is 2 + 3?", "--database-url", f"sqlite:///{db}"]
        out = io.StringIO()
        assert main([*args, "--checkpoint-durability", durability], out=out) == 0
        assert "✓ succeeded" in out.getvalue()
        written[durability] = _checkpoints(db)
    assert written["exit"] == 1 < written["sync"]


def test_a_bad_checkpoint_durability_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with pytest.raises(SystemExit) as stopped:  # argparse's own usage error
        main(["run", "hi", "--checkpoint-durability", "never", "--database-url", url])
    assert stopped.value.code == 2
    assert "--checkpoint-durability: invalid choice: 'never'" in capsys.readouterr().err

    from turnkit.errors import ConfigurationError
    from turnkit.quickstart import runtime_from_env

    with pytest.raises(ConfigurationError, match="checkpoint_durability 'never' is not one of"):
        runtime_from_env({"TURNKIT_CHECKPOINT_DURABILITY": "never"})


def test_an_empty_database_url_in_the_environment_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What compose passes for a variable left unset: the default, not a URL ''."""
    from turnkit.cli._args import parser
    from turnkit.quickstart import runtime_from_env

    empty = {"TURNKIT_DATABASE_URL": " ", "TURNKIT_DATABASE_SCHEMA": ""}
    assert runtime_from_env(empty).config.database_url == "sqlite:///turnkit.db"
    for name, value in empty.items():
        monkeypatch.setenv(name, value)
    args = parser().parse_args(["turns", "--stuck"])
    assert (args.database_url, args.database_schema) == ("sqlite:///turnkit.db", None)


def test_the_running_turn_limit_comes_from_the_environment() -> None:
    from turnkit.errors import ConfigurationError
    from turnkit.quickstart import runtime_from_env

    assert runtime_from_env({}).config.max_running_turns is None
    bounded = runtime_from_env({"TURNKIT_MAX_RUNNING_TURNS": "200"})
    assert bounded.config.max_running_turns == 200
    assert bounded.host.slots.ceiling == 200
    assert runtime_from_env({"TURNKIT_MAX_RUNNING_TURNS": "off"}).config.max_running_turns is None
    with pytest.raises(ConfigurationError, match="TURNKIT_MAX_RUNNING_TURNS='lots' is not a"):
        runtime_from_env({"TURNKIT_MAX_RUNNING_TURNS": "lots"})
    with pytest.raises(ConfigurationError, match="max_running_turns must be at least 1"):
        runtime_from_env({"TURNKIT_MAX_RUNNING_TURNS": "0"})


def test_budgets_are_enforced_when_the_flag_or_the_environment_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from turnkit.errors import ConfigurationError
    from turnkit.quickstart import runtime_from_env

    assert runtime_from_env({}).config.budgets == "off"
    assert runtime_from_env({"TURNKIT_BUDGETS": "enforce"}).config.budgets == "enforce"
    with pytest.raises(ConfigurationError, match="budgets 'bogus' is not"):
        runtime_from_env({"TURNKIT_BUDGETS": "bogus"})
    flags = runtime_config(cli._parser().parse_args(["worker", "--budgets", "enforce"]))
    assert flags.budgets == "enforce"
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    # Budgets fail closed: with no limit set, a message is refused before it is written.
    assert main(["run", "hi", "--budgets", "enforce", "--database-url", url]) == 2
    assert "budget-policy-missing" in capsys.readouterr().err


def test_the_default_checkpoint_durability_follows_the_database() -> None:
    from turnkit import RuntimeConfig

    pg = "postgresql://postgres@127.0.0.1:5432/test"
    assert RuntimeConfig(database_url=pg).durability == "async"  # a checkpoint: a round trip
    assert RuntimeConfig(database_url="sqlite:///t.db").durability == "sync"  # in place
    assert RuntimeConfig(database_url=pg, checkpoint_durability="sync").durability == "sync"
    args = cli._parser().parse_args(["worker", "--database-url", pg])
    assert runtime_config(args).durability == "async"


def test_a_worker_takes_its_lease_and_idle_window_from_the_shared_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """API processes and workers read one environment file: they must agree on both."""
    from turnkit.quickstart import runtime_from_env

    env = {"TURNKIT_LEASE_TTL_S": "20", "TURNKIT_IDLE_WINDOW_S": "300"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = runtime_config(cli._parser().parse_args(["worker"]))
    api = runtime_from_env(env).config
    assert (worker.lease_ttl_s, worker.idle_window_s) == (api.lease_ttl_s, api.idle_window_s)
    assert (worker.lease_ttl_s, worker.idle_window_s) == (20.0, 300.0)
    flags = runtime_config(
        cli._parser().parse_args(["worker", "--lease-ttl", "5", "--idle-window", "9"])
    )
    assert (flags.lease_ttl_s, flags.idle_window_s, flags.heartbeat_interval_s) == (5.0, 9.0, 3.0)

    from turnkit.errors import ConfigurationError

    monkeypatch.setenv("TURNKIT_LEASE_TTL_S", "soon")  # the variable is named, not the flag
    with pytest.raises(ConfigurationError, match="TURNKIT_LEASE_TTL_S='soon' is not a number"):
        runtime_config(cli._parser().parse_args(["worker"]))

    monkeypatch.setenv("TURNKIT_LEASE_TTL_S", "20")
    monkeypatch.setenv("TURNKIT_IDLE_WINDOW_S", "7200")  # longer than the hour's ceiling
    worker = runtime_config(cli._parser().parse_args(["worker"]))
    api = runtime_from_env({"TURNKIT_IDLE_WINDOW_S": "7200"}).config
    assert (worker.idle_window_s, worker.ceiling_s) == (api.idle_window_s, api.ceiling_s)
    assert worker.ceiling_s == 7200.0
    sweep = runtime_config(cli._parser().parse_args(["sweep"]))  # an operator's sweep agrees
    assert (sweep.idle_window_s, sweep.ceiling_s) == (7200.0, 7200.0)
    assert ceiling(cli._parser().parse_args(["turns", "--stuck"]), 7200.0) == 7200.0


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--concurrency", "0", "'0' is not a whole number of 1 or more"),
        ("--concurrency", "-3", "'-3' is not a whole number of 1 or more"),
        ("--poll-interval", "0", "'0' is not a number of seconds above 0"),
        ("--poll-interval", "-1", "'-1' is not a number of seconds above 0"),
        ("--drain-timeout", "-1", "'-1' is not a number of seconds (0 or more)"),
        ("--sweep-interval", "nan", "'nan' is not a number of seconds above 0"),
        ("--ceiling", "0", "'0' is not a number of seconds above 0"),
        ("--lease-ttl", "0.2", "'0.2' is below 1 s: every turn would end at once"),
        ("--idle-window", "0.5", "'0.5' is below 1 s: every turn would end at once"),
        ("--idle-window", "0", "'0' is not a number of seconds above 0"),
    ],
)
def test_a_worker_flag_out_of_range_is_refused_before_it_starts(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli._parser().parse_args(["worker", flag, value])
    assert stopped.value.code == 2
    assert f"argument {flag}: {says}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "--limit", "99999999999999999999"],
        ["pauses", "--limit", "99999999999999999999"],
        ["sweep", "--max-attempts", "99999999999999999999"],
        ["sweep", "--max-attempts", "0"],
        ["turns", "--ceiling", "1e308"],
        ["turns", "--unclaimed-after", "1e12"],
        ["pauses", "--limit", "\u00b2"],
    ],
)
def test_a_count_or_span_no_database_holds_is_one_line_not_a_traceback(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused as the flag's value, before the database is asked (which would overflow)."""
    url = f"sqlite:///{tmp_path / 'turnkit.db'}"
    assert main(["db", "upgrade", "--database-url", url], out=io.StringIO()) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--database-url", url], out=io.StringIO())
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"turnkit {argv[0]}: error: argument {argv[1]}: {argv[2]!r} is "), err
    assert err.count("\n") == 1


def test_an_empty_session_is_refused_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["run", "hi", "--session", "", "--database-url", url], out=io.StringIO()) == 2
    assert capsys.readouterr().err.startswith("turnkit: session id '' has an unknown format")


def test_an_idle_window_past_the_ceiling_is_refused_not_lowered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["worker", "--idle-window", "10", "--ceiling", "5", "--database-url", "sqlite://"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(
        "turnkit: --idle-window (10 s) cannot exceed --ceiling (5 s)"
    )
    lowered = runtime_config(cli._parser().parse_args(["worker", "--ceiling", "60"]))
    assert (lowered.idle_window_s, lowered.ceiling_s) == (60.0, 60.0)  # the default bows


def test_an_empty_agent_flag_hosts_the_demo_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose passes `--agent "${TURNKIT_AGENT:-}"`: unset, the worker runs the demo agent."""
    monkeypatch.delenv("TURNKIT_AGENT", raising=False)
    [agent] = hosted_agents(cli._parser().parse_args(["worker", "--agent", ""]))
    assert agent.name == "demo"
    # With no --agent, the worker hosts what the API processes host: $TURNKIT_AGENT.
    monkeypatch.setenv("TURNKIT_AGENT", "tests.support.worker_agent:agent")
    [shared] = hosted_agents(cli._parser().parse_args(["worker"]))
    assert shared.name == "worker-test"
    [named] = hosted_agents(
        cli._parser().parse_args(
            ["worker", "--agent", "", "--agent", "tests.support.worker_agent:agent"]
        )
    )
    assert named.name == "worker-test"


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_yes_no_setting_means_its_default(empty: str) -> None:
    """Compose passes a variable it was not given as empty: every flag then keeps its
    default, as unset (driving and recovering in process on, checkpoints not kept,
    listening for Stops on), and an empty recovery flag follows the driving one."""
    from turnkit.quickstart import runtime_from_env

    base = {"TURNKIT_DATABASE_URL": "sqlite:///:memory:"}
    flags = (
        "TURNKIT_RUN_IN_PROCESS",
        "TURNKIT_RECOVER_IN_PROCESS",
        "TURNKIT_KEEP_ENDED_CHECKPOINTS",
        "TURNKIT_LISTEN_FOR_STOPS",
    )
    unset = runtime_from_env(base).config
    for name in flags:
        assert runtime_from_env({**base, name: empty}).config == unset, name
    config = runtime_from_env({**base, **dict.fromkeys(flags, empty)}).config
    assert (config.run_in_process, config.recover_in_process) == (True, True)
    assert (config.keep_ended_checkpoints, config.listen_for_stops) == (False, True)
    off = {**base, "TURNKIT_RUN_IN_PROCESS": "0", "TURNKIT_RECOVER_IN_PROCESS": empty}
    assert runtime_from_env(off).config.recover_in_process is False  # follows driving


@pytest.mark.parametrize("blank", [" ", " , ", "\n", "\t,\n "])
def test_a_blank_agent_or_model_variable_means_the_demo_in_the_app_as_in_the_worker(
    blank: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnkit.demo import DemoModel
    from turnkit.quickstart import runtime_from_env

    env = {"TURNKIT_DATABASE_URL": "sqlite:///:memory:", "TURNKIT_AGENT": blank,
           "TURNKIT_MODEL": " \n"}  # fmt: skip
    app = runtime_from_env(env).agent
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    [worker] = hosted_agents(argparse.Namespace(agent=None))
    for agent in (app, worker):
        assert agent.name == "demo"
        assert isinstance(agent.model, DemoModel)


def test_a_yes_no_setting_or_a_redis_url_the_environment_gets_wrong_is_refused() -> None:
    from turnkit.errors import ConfigurationError
    from turnkit.quickstart import runtime_from_env

    assert runtime_from_env({"TURNKIT_RUN_IN_PROCESS": "off"}).config.run_in_process is False
    assert runtime_from_env({"TURNKIT_RUN_IN_PROCESS": "On"}).config.run_in_process is True
    with pytest.raises(ConfigurationError, match="TURNKIT_RUN_IN_PROCESS='of' is not yes or no"):
        runtime_from_env({"TURNKIT_RUN_IN_PROCESS": "of"})  # a typo never turns it on
    with pytest.raises(ConfigurationError, match="the Redis URL 'http://app:\\*\\*\\*@x'") as bad:
        runtime_from_env({"TURNKIT_REDIS_URL": "http://app:secret@x"})
    assert "secret" not in str(bad.value)
    # redis-py would take a database it cannot read as db 0: another app's, on a shared Redis.
    with pytest.raises(ConfigurationError, match="its database 'abc' is not a number"):
        runtime_from_env({"TURNKIT_REDIS_URL": "redis://:secret@127.0.0.1:6379/abc"})
    assert runtime_from_env({"TURNKIT_REDIS_URL": "redis://127.0.0.1:6379/3"}).replay


def test_a_number_the_environment_gets_wrong_is_refused_by_name() -> None:
    from turnkit.errors import ConfigurationError
    from turnkit.quickstart import runtime_from_env

    for name in ("TURNKIT_IDLE_WINDOW_S", "TURNKIT_LEASE_TTL_S"):
        with pytest.raises(ConfigurationError, match=f"{name}='2m' is not a number of seconds"):
            runtime_from_env({name: "2m"})
    assert runtime_from_env({"TURNKIT_IDLE_WINDOW_S": ""}).config.idle_window_s == 120.0
    for name in ("TURNKIT_IDLE_WINDOW_S", "TURNKIT_LEASE_TTL_S"):  # every turn would end
        with pytest.raises(ConfigurationError, match=f"{name}='0.001' is below 1 s"):
            runtime_from_env({name: "0.001"})


def test_run_read_by_a_reader_that_stops_early_ends_without_a_traceback(tmp_path: Path) -> None:
    """`turnkit run … | head -1`: exit 141 and nothing on stderr, as a shell tool does."""
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    for lines in (1, 3):
        done = subprocess.run(
            f"{sys.executable} -m turnkit.cli run 'What is (12 + 3) * 7?' --database-url {url}"
            f" | head -{lines} > /dev/null; exit ${{PIPESTATUS[0]}}",
            shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (141, ""), done.stderr


@pytest.mark.parametrize(
    ("agent", "shown", "answer"),
    [
        ("approving", "⏸ waits for approval: delete_file(path='/tmp/x.txt') · request ",
         "/approvals/"),
        ("asking", "? asks: Which unit? [EUR / USD] · request ", "/clarifications/"),
    ],
)  # fmt: skip
def test_run_says_what_a_paused_turn_waits_for_and_where_to_answer(
    tmp_path: Path, agent: str, shown: str, answer: str
) -> None:
    url = f"sqlite:///{tmp_path / 'paused.db'}"
    out = io.StringIO()
    code = main(["run", "please", "--agent", f"tests.support.asking_agent:{agent}",
                 "--database-url", url], out=out)  # fmt: skip
    text = out.getvalue()
    assert code == 1, text
    assert shown in text
    [last] = text.splitlines()[-1:]
    assert last.startswith("⏸ turn turn_")
    assert f"waits for an answer: `turnkit answer {last.split()[2]} --" in last
    assert answer in last
    printed = io.StringIO()  # the stored log shows it the same way
    turn_id = last.split()[2]
    assert main(["events", turn_id, "--database-url", url], out=printed) == 0
    assert shown in printed.getvalue()


def test_run_shows_a_fallback_once_and_no_log_line_of_it(tmp_path: Path) -> None:
    """In its own process, as a user runs it: the runtime's own log of the fallback (INFO)
    does not reach stderr in the middle of the streamed answer."""
    root = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "run", "hi", "--agent",
         "tests.support.cascade_agent:agent", "--database-url",
         f"sqlite:///{tmp_path / 'cascade.db'}"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("↷ first failed") == 1
    assert "model first failed" not in done.stderr


def test_run_says_the_text_a_failed_model_streamed_is_dropped(tmp_path: Path) -> None:
    out = io.StringIO()
    url = f"sqlite:///{tmp_path / 'cascade.db'}"
    code = main(["run", "hi", "--agent", "tests.support.cascade_agent:agent",
                 "--database-url", url], out=out)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert code == 0, lines
    at = next(i for i, line in enumerate(lines) if "↷ first failed" in line)
    assert lines[at - 1].endswith("Partial text before ")
    assert lines[at + 1] == "    (the text above is dropped: the next model writes it again)"
    assert "Hello from the second rung." in "\n".join(lines[at + 2 :])


def test_serve_and_worker_print_an_exporters_complaint_once_a_minute_in_their_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exporter = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    with info_logs_to_stderr():
        for _ in range(5):  # an exporter retrying against a backend that is down
            exporter.warning("Transient error %s encountered while exporting, retrying", "503")
        exporter.error("Failed to export span batch")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING opentelemetry\.exporter\.otlp\.proto\.http"
        r"\.trace_exporter: Transient error 503 encountered while exporting, retrying",
        lines[0],
    )
    assert lines[1].endswith("ERROR opentelemetry.exporter.otlp.proto.http.trace_exporter: "
                             "Failed to export span batch")  # fmt: skip


def test_serve_with_json_logs_writes_nothing_but_json_lines(tmp_path: Path) -> None:
    """Its own lines, uvicorn's, the access log and console spans: each one JSON object,
    a turn's lines naming the turn and the trace its spans carry."""
    import time

    port = free_port()
    env = {**os.environ, "TURNKIT_GC": "python", "TURNKIT_LOG_FORMAT": "json"}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_MODEL", "OTEL_TRACES_EXPORTER",
                 "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):  # fmt: skip
        env.pop(name, None)
    argv = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port), "--otel-console",
            "--database-url", f"sqlite:///{tmp_path / 's.db'}"]  # fmt: skip
    out, err = (tmp_path / "out.log").open("w"), (tmp_path / "err.log").open("w")
    server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=err)
    try:
        body = _execute_once_up(server, port, tmp_path / "err.log")
        assert '"type":"done"' in body
        deadline = time.monotonic() + 30
        while "finished turn" not in (tmp_path / "err.log").read_text():
            assert time.monotonic() < deadline, "no line for the finished turn"
            time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(timeout=30)
        out.close()
        err.close()
    stdout = (tmp_path / "out.log").read_text().splitlines()
    stderr = (tmp_path / "err.log").read_text().splitlines()
    assert stdout
    assert stderr
    lines = [json.loads(line) for line in [*stdout, *stderr]]  # every line is JSON
    messages = [line["message"] for line in lines]
    [up] = [m for m in messages if m.startswith(f"turnkit serving on http://127.0.0.1:{port}")]
    assert up.endswith(  # the database it serves from, the agent and its model
        f" from sqlite:///{tmp_path / 's.db'}, hosting demo (model turnkit-demo, the OFFLINE "
        "DEMO model: fixed rules, not an LLM; set TURNKIT_MODEL or --agent for a real one)"
    ), up
    assert any(m.startswith("OpenTelemetry on (console spans") for m in messages)
    assert "Application startup complete." in messages  # uvicorn's own
    assert any("POST /api/harness/sessions/s1/execute" in m for m in messages)  # its access log
    [finished] = [line for line in lines if line["message"].startswith("finished turn")]
    assert finished["session_id"] == "s1"
    assert finished["turn_id"] in body
    spans = [json.loads(m) for m in messages if m.startswith('{"name": ')]
    turn_span = next(s for s in spans if s["name"].startswith("invoke_agent"))
    assert turn_span["attributes"]["turnkit.turn_id"] == finished["turn_id"]
    assert {line["level"] for line in lines} <= {"INFO", "WARNING"}


def test_a_bad_log_format_is_one_line(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("TURNKIT_LOG_FORMAT", "yaml")
    for command in (["serve", "--port", "1"], ["worker"]):
        code = main(command, out=io.StringIO())
        err = capsys.readouterr().err
        assert code == 2, command
        assert err.startswith("turnkit: TURNKIT_LOG_FORMAT must be 'text' or 'json', not 'yaml'")
        assert err.count("\n") == 1


def test_a_worker_with_json_logs_announces_itself_in_json(tmp_path: Path) -> None:
    import signal

    env = {**os.environ, "TURNKIT_GC": "python", "TURNKIT_LOG_FORMAT": "json"}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_REDIS_URL"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "turnkit.cli", "worker",
            "--database-url", f"sqlite:///{tmp_path / 'w.db'}"]  # fmt: skip
    worker = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline()  # the worker is up once it says so
        worker.send_signal(signal.SIGTERM)
        stdout, rest = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0
    assert stdout == ""
    lines = [json.loads(line) for line in [first, *rest.splitlines()]]
    assert lines[0]["logger"] == "turnkit.cli"
    assert lines[0]["message"].startswith("turnkit worker ")
    assert "hosting demo" in lines[0]["message"]


def _execute_once_up(server: subprocess.Popen[bytes], port: int, log: Path) -> str:
    """POST a message to `turnkit serve` once it listens (60 s at most): the SSE body."""
    import time
    import urllib.request

    url = f"http://127.0.0.1:{port}/api/harness/sessions/s1/execute"
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, log.read_text()
        try:
            request = urllib.request.Request(
                url, data=b'{"content": "hi"}', headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                return str(response.read().decode())
        except OSError:  # not listening yet
            assert time.monotonic() < deadline, "turnkit serve did not start"
            time.sleep(0.2)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_serve_stopped_by_a_signal_drains_and_exits_0(stop: str, tmp_path: Path) -> None:
    """As the docs promise (and `turnkit worker` does): a stop is not a failure."""
    import signal
    import time
    import urllib.request

    env = {**os.environ, "TURNKIT_GC": "python"}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_AGENT", "TURNKIT_REDIS_URL", "TURNKIT_RUNTIME"):
        env.pop(name, None)
    port = free_port()
    argv = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port),
            "--database-url", f"sqlite:///{tmp_path / 's.db'}"]  # fmt: skip
    server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # until it answers: its signal handlers are uvicorn's then
            assert server.poll() is None, "turnkit serve ended before it served"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "turnkit serve never answered"
                time.sleep(0.1)
        server.send_signal(getattr(signal, stop))
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()


def test_serve_run_off_the_main_thread_leaves_signals_alone() -> None:
    """uvicorn listens for no signal there (Python allows none): neither does serve."""
    import threading

    said: list[str] = []

    def serve_part() -> None:
        try:
            with cli._drained_on_signal():
                said.append("served")
        except ValueError as exc:  # signal only works in main thread
            said.append(str(exc))

    thread = threading.Thread(target=serve_part)
    thread.start()
    thread.join()
    assert said == ["served"]


def test_run_names_the_demo_model_only_once_its_settings_are_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = io.StringIO()
    assert main(["run", "hi", "--database-url", "mysql://x"], out=refused) == 2
    assert "supports SQLite and PostgreSQL" in capsys.readouterr().err
    assert refused.getvalue() == ""  # the error alone, no banner of a run that never began
    ran = io.StringIO()
    assert main(["run", "hi", "--database-url", f"sqlite:///{tmp_path / 'd.db'}"], out=ran) == 0
    assert ran.getvalue().startswith("model: turnkit-demo — the OFFLINE DEMO model")
