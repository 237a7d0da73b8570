"""The `turnkit` command: what each command does, and `main` (its arguments: `_args`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from pydantic import ValidationError

from turnkit.agent import load_agent
from turnkit.budgets import BudgetLimit
from turnkit.cli._args import parser as _parser
from turnkit.cli._copy import copy_database
from turnkit.cli._export import export_session, export_target
from turnkit.cli._inspect import (
    Printer,
    existing_database,
    existing_store,
    list_sessions,
    session_turns,
    show_events,
    stuck_turns,
)
from turnkit.cli._logs import (
    announce,
    info_logs_to_stderr,
    log_format,
    notices,
    uvicorn_log_config,
)
from turnkit.cli._pauses import (
    PAUSES,
    Pause,
    answer_turn,
    list_pauses,
    misused_answer_flag,
    waiting,
)
from turnkit.cli._settings import (
    GC_THRESHOLDS,
    ceiling,
    gc_mode,
    hosting,
    install_command,
    load_runtime,
    named_agents,
    refuse_beside_runtime,
    runtime_config,
    tune_gc,
)
from turnkit.cli._tidy import prune_sessions, sweep
from turnkit.cli._worker import work
from turnkit.config import (
    env_idle_window_s,
    env_plugins,
    is_loopback_host,
)
from turnkit.demo import DEMO_MODEL_NAME, demo_agent
from turnkit.errors import (
    ConfigurationError,
    StoreError,
    StoreUnavailableError,
    TurnkitError,
)
from turnkit.events import DoneEvent
from turnkit.ids import TurnId, uuid7
from turnkit.models import ModelClient, ModelSettings
from turnkit.models.litellm import ModelEndpoint
from turnkit.replay import replay_from_url
from turnkit.runtime import SessionRuntime
from turnkit.runtime._validate import check_session_id
from turnkit.runtime.budget_pauses import resume_budget_pauses
from turnkit.runtime.worker import until_reached
from turnkit.store.migrate import head_revision, is_newer, refuse_newer
from turnkit.store.sql import SqlStore, shown_url

__all__ = ("GC_THRESHOLDS", "main")

log = logging.getLogger("turnkit.cli")


async def _run(args: argparse.Namespace, out: TextIO) -> int:
    model = args.model or os.environ.get("TURNKIT_MODEL", "").strip() or None  # blank: demo
    if model is None and (args.api_base or args.api_key_env):
        flag = "--api-base" if args.api_base else "--api-key-env"
        raise ConfigurationError(f"{flag} is for --model (or $TURNKIT_MODEL): name the model")
    agent = load_agent(args.agent) if args.agent else demo_agent()
    served: dict[str, str | ModelClient | ModelEndpoint] = {}
    if model is not None:
        served[model] = ModelEndpoint(
            model=model, api_base=args.api_base, api_key_env=args.api_key_env
        )
    settings = ModelSettings(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
    )
    printer = Printer(out)
    plugins = env_plugins(os.environ)
    async with SessionRuntime(
        agent=agent, models=served, config=runtime_config(args), plugins=plugins
    ) as runtime:
        if model is None and not args.agent:  # once nothing can refuse the settings
            out.write(
                f"model: {DEMO_MODEL_NAME} — the OFFLINE DEMO model: fixed rules, not an LLM "
                "(use --model provider/name for a real one)\n"
            )
        status = "failed"
        events = runtime.execute_message(
            f"cli-{uuid7()}" if args.session is None else args.session,
            args.message,
            model=model,
            settings=settings if settings != ModelSettings() else None,
        )
        # Closed here even when printing fails (`| head`): the turn stops before the runtime
        # closes, not in asyncio's shutdown with the runtime gone.
        paused: Pause | None = None
        async with contextlib.aclosing(events):
            async for event in events:
                printer.show(event)
                if isinstance(event, DoneEvent):
                    status = event.status
                elif isinstance(event, PAUSES):
                    paused = event
        if paused is not None and status == "failed":  # the stream ended at the pause
            out.write(waiting(paused))
        await runtime.wait_background()  # a new session's name, asked after its first turn
    return 0 if status == "succeeded" else 1


async def _pauses(args: argparse.Namespace, out: TextIO) -> int:
    session = check_session_id(args.session) if args.session is not None else None
    async with existing_store(args.database_url, args.database_schema) as store:
        return await list_pauses(store, out, session_id=session, limit=args.limit)


async def _answer(args: argparse.Namespace, out: TextIO) -> int:
    config = runtime_config(args)
    if args.queue:
        config = dataclasses.replace(config, run_in_process=False)
    return await answer_turn(args, out, config)


async def _sweep(args: argparse.Namespace, out: TextIO) -> int:
    return await sweep(runtime_config(args), out)


async def _turns(args: argparse.Namespace, out: TextIO) -> int:
    async with existing_store(args.database_url, args.database_schema) as store:
        if args.session is not None:
            return await session_turns(store, out, check_session_id(args.session))
        most = ceiling(args, env_idle_window_s(os.environ))
        return await stuck_turns(store, out, ceiling_s=most, unclaimed_s=args.unclaimed_after)


async def _sessions(args: argparse.Namespace, out: TextIO) -> int:
    if args.sessions_command == "prune":
        return await prune_sessions(args, out)
    if args.sessions_command == "export":
        session_id = check_session_id(args.session_id)
        with export_target(args.output, out) as target:
            async with existing_store(args.database_url, args.database_schema) as store:
                return await export_session(store, target, session_id)
    async with existing_store(args.database_url, args.database_schema) as store:
        return await list_sessions(
            store,
            out,
            principal=args.principal,
            organisation=args.organisation,
            limit=args.limit or 50,
        )


async def _events(args: argparse.Namespace, out: TextIO) -> int:
    async with existing_store(args.database_url, args.database_schema) as store:
        return await show_events(store, out, TurnId(args.turn_id), as_json=args.json)


async def _budgets(args: argparse.Namespace, out: TextIO) -> int:
    url, schema = args.database_url, args.database_schema
    if args.budgets_command == "set" and not await _holds_turnkit(url, schema):
        # A limit may come before the first start: said, not refused, so a typo shows.
        out.write(f"no turnkit database at {shown_url(url)} yet: creating it\n")
        async with SqlStore.from_url(url, schema=schema) as store:
            return await _budget_limits(args, store, out)
    # Never migrated, as the reading commands: processes on its schema may still run.
    async with existing_store(url, schema) as store:
        return await _budget_limits(args, store, out)


async def _holds_turnkit(url: str, schema: str | None) -> bool:
    """Whether turnkit's tables are at `url` (in `schema`), at any revision."""
    try:
        await existing_database(url, schema)
    except StoreUnavailableError:
        raise
    except StoreError:
        return False
    if not url.startswith("sqlite"):
        return True
    store = SqlStore.from_url(url, schema=schema)  # a file is there: turnkit's?
    try:
        return await store.schema_revision() is not None
    finally:
        await store.close()


async def _budget_limits(args: argparse.Namespace, store: SqlStore, out: TextIO) -> int:
    """`turnkit budgets list|set|delete` on an open store."""
    if args.budgets_command == "set":
        limit = BudgetLimit(
            scope=args.scope,
            organisation=args.organisation,
            key=args.key,
            period=args.period,
            usd=args.usd,
            tokens=args.tokens,
        )
        await store.set_budget_limit(limit)
        resumed = await resume_budget_pauses(store, limit.organisation)
        out.write(f"set the {limit.scope} budget of {limit.key!r} ({limit.period})\n")
        out.write("".join(f"  resumed {turn_id}\n" for turn_id in resumed))
    elif args.budgets_command == "delete":
        found = await store.delete_budget_limit(
            args.scope, args.organisation, args.key, args.period
        )
        out.write("deleted\n" if found else "no such limit\n")
        return 0 if found else 1
    else:
        uses = await store.budget_report(args.organisation)
        if not uses:
            out.write("no budget limits\n")
        for use in uses:
            out.write(f"  {use.limit.organisation}  {use.describe()}\n")
    return 0


async def _db(args: argparse.Namespace, out: TextIO) -> int:
    if args.db_command == "current":
        return await _db_current(args, out)
    if args.db_command == "copy":
        return await copy_database(args, out)
    return await _db_upgrade(args, out)


async def _db_current(args: argparse.Namespace, out: TextIO) -> int:
    """`turnkit db current`: where the schema is, against this turnkit's; 1 unless equal."""
    store = SqlStore.from_url(args.database_url, schema=args.database_schema)
    try:
        if args.database_url.startswith("sqlite"):  # opening a missing file would make it
            await existing_database(args.database_url, args.database_schema, store)
        revision = await store.schema_revision()
    finally:
        await store.close()
    head = head_revision()
    if revision == head:
        out.write(f"schema: {revision} (this turnkit: {head}): up to date\n")
        return 0
    if revision is not None and is_newer(revision):
        out.write(
            f"schema: {revision} (this turnkit: {head}): written by a newer turnkit; use it, "
            "or downgrade with it\n"
        )
    else:
        out.write(
            f"schema: {revision or 'empty'} (this turnkit: {head}): behind; "
            "`turnkit db upgrade` brings it up to date\n"
        )
    return 1


async def _db_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    store = SqlStore.from_url(args.database_url, schema=args.database_schema)
    try:
        before = await store.schema_revision()
        await store.setup()
        after = await store.schema_revision()
    finally:
        await store.close()
    out.write(f"schema: {before or 'empty'} → {after}\n")
    return 0


_LOGGING_COMMANDS = frozenset({"serve", "worker"})
"""The long-running commands, which log (the others print what they do)."""


@contextlib.contextmanager
def _logs(args: argparse.Namespace) -> Iterator[TextIO]:
    """The log lines of serve and worker on stderr, in `TURNKIT_LOG_FORMAT`.

    Yields where the command's own notices go (OpenTelemetry's set-up line): stderr, or
    log lines when they are JSON.
    """
    if args.command not in _LOGGING_COMMANDS:
        yield sys.stderr
        return
    chosen = args.log_format = log_format(os.environ)  # a bad value stops here, first
    with info_logs_to_stderr(chosen):
        yield notices(chosen)


@contextlib.contextmanager
def _telemetry(args: argparse.Namespace, err: TextIO) -> Iterator[None]:
    """OpenTelemetry for the command's lifetime, as its flags and `OTEL_*` ask."""
    if not hasattr(args, "otel_console"):  # a command that runs no turns
        yield
        return
    from turnkit.otel import set_capture_content
    from turnkit.otel.setup import configure

    if args.otel_capture_content:
        set_capture_content(True)
    shutdown = configure(console=args.otel_console, err=err, one_line_spans=err is not sys.stderr)
    try:
        yield
    finally:
        if shutdown is not None:
            shutdown()


async def _serve(args: argparse.Namespace, out: TextIO) -> int:
    try:
        import uvicorn
    except ImportError as exc:
        # Into this Python (a bare `pip` is often another environment's; uv's have none).
        raise ImportError(
            f"turnkit serve needs the server extra ({exc.name} is missing): "
            f"{install_command('turnkit[fastapi]')} (from a checkout: -e '.[fastapi]')"
        ) from exc

    collector = gc_mode()  # a bad value stops before anything is imported or opened
    runtime = await _served_runtime(args)
    if not is_loopback_host(args.host) and not os.environ.get("TURNKIT_AUTH"):
        log.warning(
            "serving %s with no TURNKIT_AUTH: every caller is anonymous and shares every "
            "session nobody owns (docs/guides/deployment.md#who-may-call)",
            args.host,
        )
    listed = os.environ.get("TURNKIT_ALLOWED_HOSTS", "").split(",")
    if not any(h.strip() for h in listed) and is_loopback_host(args.host):  # empty: as unset
        # Only this machine reaches the server: a page elsewhere must not reach it by a
        # name of its own that resolves here (DNS rebinding).
        from turnkit.http.trusted_hosts import LOOPBACK_HOSTS

        os.environ["TURNKIT_ALLOWED_HOSTS"] = ",".join((*LOOPBACK_HOSTS, args.host))
    config = uvicorn.Config(
        _app_around(runtime) if runtime is not None else "turnkit.quickstart:app",
        host=args.host,
        port=args.port,
        log_level="info",
        log_config=uvicorn_log_config(args.log_format) or uvicorn.config.LOGGING_CONFIG,
    )
    # Reach the database before serving: one it cannot use is one line and exit 2, not a
    # failed lifespan's traceback after "serving on". One that is down or refuses
    # connections (restarting under a deploy) is waited for, as a worker waits.
    url, schema = args.database_url, args.database_schema
    if runtime is not None:
        url, schema = runtime.config.database_url, runtime.config.database_schema

    async def check_schema() -> None:
        from turnkit.graph import open_checkpointer

        store = SqlStore.from_url(url, schema=schema)
        try:
            revision = await store.schema_revision()
            refuse_newer(revision)  # a rollback: its lifespan would fail
        finally:
            await store.close()
        if revision is None:  # a new database (or schema): the lifespan makes it
            return
        # The lifespan sets up the checkpoint tables, a write: a server that takes none now
        # (read-only after a failover) is waited for here, not a failed lifespan.
        _, close_checkpointer = await open_checkpointer(url, schema=schema)
        await close_checkpointer()

    await until_reached(check_schema, url, asyncio.Event(), logger=log)
    if runtime is None:  # the app's runtime brought its own replay buffer
        await _check_replay(os.environ.get("TURNKIT_REDIS_URL"))
    sock = _listening_socket(args.host, args.port)  # a port in use is one line, exit 2
    try:
        config.load()  # import the app now, so what it allocates is frozen with the rest
        tune_gc(collector)
        host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
        base = f"http://{host}:{sock.getsockname()[1]}"
        served = runtime or _quickstart_runtime()
        announce(
            out,
            f"turnkit serving on {base} (chat page {base}/, API {base}/api/harness) "
            f"from {shown_url(url)}, hosting {hosting(served)}",
            args.log_format,
        )
        with _drained_on_signal():
            await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
    return 0


@contextlib.contextmanager
def _drained_on_signal() -> Iterator[None]:
    """SIGINT and SIGTERM stop the server, which drains: the command then exits 0.

    uvicorn handles them while it serves, and once it has shut down raises the signal
    again to the handler it found, which would end the process 130 or 143 after a clean
    drain; the one it finds here takes it and does nothing. Off the main thread, where
    signals cannot be handled (nor does uvicorn listen for them), nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    found = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in found.items():
            signal.signal(sig, handler)


async def _served_runtime(args: argparse.Namespace) -> SessionRuntime | None:
    """The app's runtime (`--runtime`); else None, and the flags set the environment.

    Without a runtime of its own, the quickstart app builds one from the environment.
    """
    if args.runtime:
        refuse_beside_runtime(args.argv)
        return await load_runtime(args.runtime)
    os.environ["TURNKIT_DATABASE_URL"] = (
        args.database_url
    )  # the flag wins (its default is $TURNKIT_DATABASE_URL)
    if args.database_schema:
        os.environ["TURNKIT_DATABASE_SCHEMA"] = args.database_schema
    if args.checkpoint_durability:
        os.environ["TURNKIT_CHECKPOINT_DURABILITY"] = args.checkpoint_durability
    if args.budgets:
        os.environ["TURNKIT_BUDGETS"] = args.budgets
    if named := named_agents(args):
        os.environ["TURNKIT_AGENT"] = ",".join(named)
    return None


def _quickstart_runtime() -> SessionRuntime:
    """The runtime the quickstart app built from the environment (once uvicorn loaded it)."""
    from turnkit.quickstart import app

    runtime: SessionRuntime = app.state.runtime
    return runtime


def _app_around(runtime: SessionRuntime) -> Any:
    """The quickstart app serving `runtime`, with the settings `TURNKIT_*` give the app."""
    from turnkit.quickstart import (
        allowed_hosts_from_env,
        allowed_origins_from_env,
        auth_from_env,
        create_app,
        max_body_bytes_from_env,
    )

    return create_app(
        runtime,
        max_body_bytes=max_body_bytes_from_env(),
        auth=auth_from_env(),
        allowed_hosts=allowed_hosts_from_env(),
        allowed_origins=allowed_origins_from_env(),
    )


async def _check_replay(url: str | None) -> None:
    """Refuse a Redis URL that Redis refuses (one line, exit 2); an outage is ridden out."""
    replay = replay_from_url(url)
    try:
        await replay.ping()
    except ConfigurationError:
        raise
    except Exception:  # noqa: BLE001 - the app says so when it opens, and runs on
        pass
    finally:
        await replay.close()


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` for uvicorn to listen on.

    Raises:
        ConfigurationError: the address cannot be bound (in use, not this host's, no right).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ConfigurationError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


_COMMANDS = {
    "run": _run,
    "pauses": _pauses,
    "answer": _answer,
    "worker": work,
    "sweep": _sweep,
    "db": _db,
    "turns": _turns,
    "sessions": _sessions,
    "events": _events,
    "serve": _serve,
    "budgets": _budgets,
}


def _problems(exc: ValidationError, args: argparse.Namespace) -> str:
    """A validation error's findings on one line: `field: what is wrong` each.

    A field the command took from a flag is named as that flag (`--max-tokens`).
    """
    flags = {dest: "--" + dest.replace("_", "-") for dest in vars(args)}
    found = []
    for error in exc.errors():
        msg = error["msg"].removeprefix("Value error, ")
        for dest, flag in flags.items():
            msg = msg.replace(f"`{dest}`", flag)
        field = ".".join(map(str, error["loc"]))
        field = flags.get(field, field)
        found.append(f"{field}: {msg}" if field else msg)
    return "; ".join(found)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Entry point of the `turnkit` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # which flags were given
    if args.command is None:
        parser.error("choose a command (turnkit -h says what each does)")
    if args.command == "answer" and (misused := misused_answer_flag(args)):
        parser.error(misused)
    stream = out or sys.stdout
    try:
        with _logs(args) as err, _telemetry(args, err):
            return asyncio.run(_COMMANDS[args.command](args, stream))
    except TurnkitError as exc:
        sys.stderr.write(f"turnkit: {exc}\n")
        return 2
    except ImportError as exc:  # an optional part is not installed: say which extra
        sys.stderr.write(f"turnkit: {exc}\n")
        return 2
    except ValidationError as exc:  # a setting out of range (--temperature 5)
        sys.stderr.write(
            f"turnkit: invalid setting: {_problems(exc, args)} "
            "[configuration-invalid; see docs/errors.md#configuration-invalid]\n"
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader stopped early (`| head`): as a shell tool would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        return 141
