"""The `turnkit` command's arguments: one parser, a sub-parser per command, value checks."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from typing import TYPE_CHECKING, NoReturn

from turnkit.cli._flag_types import (
    a_second_or_more,
    at_least_one,
    duration,
    json_object,
    port,
    positive_seconds,
    seconds,
)
from turnkit.config import DURABILITIES

if TYPE_CHECKING:
    _Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ("DESCRIPTION", "parser")

DESCRIPTION = """`turnkit` command line.

`turnkit run "message"` streams one turn; `turnkit pauses` lists turns waiting for a
person and `turnkit answer` answers one; `turnkit worker` drives queued turns;
`turnkit sweep` times out orphaned runs; `turnkit sessions prune` deletes idle sessions;
`turnkit sessions export ID` prints one; `turnkit db upgrade` applies migrations.
"""


def _database_args(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """`--database-url` and `--database-schema`.

    `suppress`: a sub-command's own, whose parent command has them too; unset, they leave
    the parent's value (else argparse would overwrite a flag given before the
    sub-command with the sub-command's default).
    """
    url = os.environ.get("TURNKIT_DATABASE_URL", "").strip() or "sqlite:///turnkit.db"
    parser.add_argument(
        "--database-url",
        default=argparse.SUPPRESS if suppress else url,
        help="where turns are stored (default: $TURNKIT_DATABASE_URL or sqlite:///turnkit.db)",
    )
    schema = os.environ.get("TURNKIT_DATABASE_SCHEMA", "").strip() or None
    parser.add_argument(
        "--database-schema",
        default=argparse.SUPPRESS if suppress else schema,
        help="PostgreSQL schema for turnkit's tables (default: $TURNKIT_DATABASE_SCHEMA)",
    )


def _runtime_arg(parser: argparse.ArgumentParser, role: str) -> None:
    """`--runtime`: the app's own `SessionRuntime`, whose parts `role`."""
    parser.add_argument(
        "--runtime",
        default=os.environ.get("TURNKIT_RUNTIME") or None,
        help="`package.module:name` of your app's SessionRuntime, or of a function returning "
        f"one: its agents, database, deps, served models and settings {role} "
        "(default: $TURNKIT_RUNTIME; not with --agent or the flags that build a runtime)",
    )


class _OneLineErrors(argparse.ArgumentParser):
    """A parser whose errors are one line, without the usage (`-h` shows that)."""

    def error(self, message: str) -> NoReturn:
        """Print `prog: error: message` and exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _durability_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-durability",
        choices=DURABILITIES,
        default=os.environ.get("TURNKIT_CHECKPOINT_DURABILITY") or None,
        help="when LangGraph checkpoints are written: sync (before the next step), async "
        "(while it runs) or exit (when the run stops); recovery repeats nothing either way "
        "(default: $TURNKIT_CHECKPOINT_DURABILITY, else async on PostgreSQL, sync on SQLite)",
    )


def _budgets_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budgets",
        choices=("off", "enforce"),
        default=os.environ.get("TURNKIT_BUDGETS") or None,
        help="enforce: check budget limits at turn start and before each model call, pause "
        "a turn a limit has no room for, and refuse a message no limit covers "
        "(default: $TURNKIT_BUDGETS, else off)",
    )


def _ceiling_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ceiling",
        type=positive_seconds,
        default=None,
        help="seconds a turn may run in all before it is timed out (default: 3600, or the "
        "idle window if that is longer)",
    )


def _max_attempts_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-attempts",
        type=at_least_one,
        default=3,
        help="attempts a turn gets before the sweep times it out (default: %(default)s)",
    )


def _otel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otel-console",
        action="store_true",
        help="print OpenTelemetry spans to stderr (other exporters: the OTEL_* variables, "
        "e.g. OTEL_EXPORTER_OTLP_ENDPOINT; needs opentelemetry-sdk)",
    )
    parser.add_argument(
        "--otel-capture-content",
        action="store_true",
        help="put message contents and tool arguments/results on spans "
        "(same as OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)",
    )


def _add_run(sub: _Subparsers) -> None:
    run = sub.add_parser("run", help="run one turn and stream it")
    run.add_argument("message", help="the user message")
    run.add_argument(
        "--agent",
        help="`package.module:name` of your Agent (the current directory is importable; "
        "default: the demo agent)",
    )
    run.add_argument(
        "--model",
        help="a litellm model string, e.g. openai/gpt-4o-mini (default: $TURNKIT_MODEL, "
        "else the agent's model; the demo agent's is the offline demo model)",
    )
    run.add_argument(
        "--api-base",
        help="base URL of an OpenAI-compatible server or proxy for --model, "
        "e.g. http://127.0.0.1:8000/v1",
    )
    run.add_argument(
        "--api-key-env",
        help="name of the environment variable holding the key for --model "
        "(default: the provider's own, e.g. OPENAI_API_KEY)",
    )
    run.add_argument("--temperature", type=float, help="sampling temperature, 0 to 2")
    run.add_argument("--top-p", type=float, help="nucleus sampling, above 0 up to 1")
    run.add_argument("--max-tokens", type=int, help="output tokens per model call")
    run.add_argument("--seed", type=int, help="sampling seed, for providers that take one")
    run.add_argument("--session", help="session id (default: a new one)")
    _database_args(run)
    _durability_arg(run)
    _budgets_arg(run)
    _otel_args(run)


def _add_pauses(sub: _Subparsers) -> None:
    pauses = sub.add_parser("pauses", help="list the paused turns and what each waits for")
    pauses.add_argument("--session", help="only this session's")
    pauses.add_argument(
        "--limit", type=at_least_one, default=100, help="at most this many (default: %(default)s)"
    )
    _database_args(pauses)
    answer = sub.add_parser(
        "answer", help="answer a paused turn's approval or question, then run it on here"
    )
    answer.add_argument("turn_id", help="the paused turn (`turnkit pauses` lists them)")
    kind = answer.add_mutually_exclusive_group(required=True)
    kind.add_argument("--approve", action="store_true", help="let the tool call run")
    kind.add_argument("--deny", action="store_true", help="refuse it; the model reads why")
    kind.add_argument("--reply", metavar="TEXT", help="answer the model's question")
    answer.add_argument(
        "--arguments",
        type=json_object,
        metavar="JSON",
        help="with --approve: the call's arguments as you changed them, all of them, "
        "as a JSON object (e.g. '{\"amount\": 40}')",
    )
    answer.add_argument("--note", help="with --approve or --deny: a note the model reads")
    answer.add_argument(
        "--request", help="the request to answer (default: the one the turn waits on)"
    )
    answer.add_argument("--by", help="who answers, as the turn's audit records it")
    answer.add_argument(
        "--agent",
        help="`package.module:name` of the Agent the turn runs with (default: the demo agent)",
    )
    answer.add_argument(
        "--api-base", help="base URL of the OpenAI-compatible server serving the turn's model"
    )
    answer.add_argument(
        "--api-key-env", help="name of the environment variable holding the model's key"
    )
    answer.add_argument(
        "--queue",
        action="store_true",
        help="only record the answer: a worker (`turnkit worker`) drives the turn on",
    )
    _database_args(answer)
    _durability_arg(answer)
    _budgets_arg(answer)
    _otel_args(answer)


def _add_worker(sub: _Subparsers) -> None:
    worker = sub.add_parser("worker", help="claim and drive queued turns")
    worker.add_argument(
        "--agent",
        action="append",
        help="`package.module:name` of an Agent to host; repeat it to host several (the "
        "first is the default; the current directory is importable; default: $TURNKIT_AGENT, "
        "else the demo agent)",
    )
    _runtime_arg(worker, "drive the turns")
    worker.add_argument(
        "--concurrency",
        type=at_least_one,
        default=4,
        help="turns driven at once (default: %(default)s)",
    )
    worker.add_argument(
        "--poll-interval",
        type=positive_seconds,
        default=0.2,
        help="seconds to wait when no turn is claimable (default: %(default)s)",
    )
    worker.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="only poll: do not LISTEN for new turns, nor for Stops of the turns it drives, "
        "on PostgreSQL (for a pooler that cannot relay notifications, such as PgBouncer in "
        "transaction mode)",
    )
    worker.add_argument(
        "--sweep-interval",
        type=positive_seconds,
        default=30.0,
        help="seconds between orphan sweeps (default: %(default)s)",
    )
    worker.add_argument(
        "--drain-timeout",
        type=seconds,
        default=30.0,
        help="on SIGTERM, seconds running turns may take to finish before they are left to "
        "another worker (default: %(default)s)",
    )
    worker.add_argument(
        "--lease-ttl",
        type=a_second_or_more,  # unset: $TURNKIT_LEASE_TTL_S, read where it is used
        help="seconds a claim lasts unless renewed; another worker takes a turn over after "
        "its lease lapses (default: $TURNKIT_LEASE_TTL_S, else 8)",
    )
    worker.add_argument(
        "--idle-window",
        type=a_second_or_more,  # unset: $TURNKIT_IDLE_WINDOW_S, read where it is used
        help="seconds a turn may go without producing anything before it ends timed_out; "
        "keep it the same as the API processes' (default: $TURNKIT_IDLE_WINDOW_S, else 120)",
    )
    _ceiling_arg(worker)
    _max_attempts_arg(worker)
    worker.add_argument(
        "--redis-url",
        default=os.environ.get("TURNKIT_REDIS_URL"),
        help="publish to this Redis replay buffer so API processes stream live",
    )
    _database_args(worker)
    _durability_arg(worker)
    _budgets_arg(worker)
    _otel_args(worker)


def _add_sweep(sub: _Subparsers) -> None:
    sweep = sub.add_parser("sweep", help="time out orphaned running turns once")
    _ceiling_arg(sweep)
    _max_attempts_arg(sweep)
    _database_args(sweep)


def _add_turns(sub: _Subparsers) -> None:
    turns = sub.add_parser(
        "turns", help="list turns an operator should look at, or one session's turns"
    )
    which = turns.add_mutually_exclusive_group()
    which.add_argument(
        "--stuck",
        action="store_true",
        help="running turns with no live driver, past the ceiling, with failed attempts, or "
        "that no process claimed (exit status 1 when there are any); what `turnkit turns` "
        "lists",
    )
    which.add_argument(
        "--session",
        metavar="ID",
        help="instead: this session's turns, oldest first, with each one's status and cost",
    )
    turns.add_argument(
        "--unclaimed-after",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="list a turn no process claimed after this long, when no turn of its session "
        "is before it: no worker runs, or none hosts its agent (default: 60)",
    )
    _ceiling_arg(turns)
    _database_args(turns)


def _add_sessions(sub: _Subparsers) -> None:
    sessions = sub.add_parser("sessions", help="list sessions, most recently active first")
    sessions.add_argument("--principal", metavar="ID", help="only this principal's sessions")
    sessions.add_argument(
        "--organisation",
        metavar="ORG",
        help="only sessions owned in this organisation (with --principal: that principal's there)",
    )
    sessions.add_argument(
        "--limit",
        type=at_least_one,
        default=None,  # 50 when listing; `prune` reads it as its own --limit
        help="at most this many (default: 50)",
    )
    _database_args(sessions)
    sessions_sub = sessions.add_subparsers(dest="sessions_command", metavar="{prune,export}")
    export = sessions_sub.add_parser(
        "export", help="print everything stored of one session as JSON lines (see the docs)"
    )
    export.add_argument("session_id", metavar="SESSION_ID", help="the session to export")
    export.add_argument(
        "--output", metavar="FILE", help="write to this new file, whole or not at all"
    )
    _database_args(export, suppress=True)
    prune = sessions_sub.add_parser(
        "prune",
        help="delete sessions idle for a while (never one with a running, queued or "
        "paused turn), with their turns' checkpoints; audit and usage rows stay",
    )
    prune.add_argument(
        "--idle-for",
        type=duration,
        required=True,
        metavar="DURATION",
        help="how long a session must have been idle: a number and a unit, s m h d or w "
        "(90d, 12h, 1d12h)",
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="delete nothing: list the sessions that would be deleted",
    )
    prune.add_argument(
        "--limit",
        type=at_least_one,
        default=argparse.SUPPRESS,  # as `turnkit sessions --limit N prune` gives it
        help="delete at most this many sessions, those with the oldest last message first "
        "(default: all)",
    )
    # Where `turnkit sessions` gave them: a flag before `prune` is not dropped for a default.
    _database_args(prune, suppress=True)


def _add_events(sub: _Subparsers) -> None:
    events = sub.add_parser("events", help="print one turn's committed events")
    events.add_argument("turn_id", metavar="TURN_ID", help="the turn (X-Turn-Id over HTTP)")
    events.add_argument(
        "--json",
        action="store_true",
        help="each event as the JSON a client receives, one per line",
    )
    _database_args(events)


def _add_budgets(sub: _Subparsers) -> None:
    budgets = sub.add_parser("budgets", help="budget limits: list, set, delete")
    budgets_sub = budgets.add_subparsers(dest="budgets_command", required=True)
    listing = budgets_sub.add_parser("list", help="every limit with what its period used")
    listing.add_argument("--organisation", help="only this organisation's limits")
    _database_args(listing)
    for name, helptext in (
        ("set", "create or replace a limit; resumes turns paused on a budget it now covers"),
        ("delete", "remove a limit"),
    ):
        command = budgets_sub.add_parser(name, help=helptext)
        command.add_argument(
            "--scope",
            required=True,
            choices=("organisation", "department", "principal", "session"),
            help="what the limit applies to",
        )
        command.add_argument(
            "--organisation", default="default", help="the organisation (default: %(default)s)"
        )
        command.add_argument("--key", default="", help="the department, principal id or session id")
        command.add_argument(
            "--period",
            default="month",
            choices=("day", "month", "total"),
            help="the period (default: %(default)s)",
        )
        if name == "set":
            command.add_argument("--usd", type=float, help="the cap in USD")
            command.add_argument("--tokens", type=int, help="the cap in tokens")
        _database_args(command)


def _add_serve(sub: _Subparsers) -> None:
    serve = sub.add_parser("serve", help="serve the HTTP routes (quickstart app)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument(
        "--port", type=port, default=8000, help="port to bind (default: %(default)s)"
    )
    serve.add_argument(
        "--agent",
        action="append",
        help="`package.module:name` of an Agent to host; repeat it to host several (the "
        "first is the default; default: $TURNKIT_AGENT, else the demo agent)",
    )
    _runtime_arg(serve, "are what the app serves")
    _database_args(serve)
    _durability_arg(serve)
    _budgets_arg(serve)
    _otel_args(serve)


def _add_db(sub: _Subparsers) -> None:
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply schema migrations")
    _database_args(upgrade)
    current = db_sub.add_parser(
        "current",
        help="print the schema's revision and this turnkit's; exit 1 unless they match "
        "(changes nothing)",
    )
    _database_args(current)
    _add_db_copy(db_sub)


def _add_db_copy(db_sub: _Subparsers) -> None:
    copy = db_sub.add_parser(
        "copy",
        help="copy every turnkit row and every checkpoint into an empty "
        "database (SQLite to PostgreSQL, say); the source is only read",
    )
    copy.add_argument("--from", dest="from_url", required=True, metavar="URL",
                      help="the database to copy (never written)")  # fmt: skip
    copy.add_argument("--from-schema", metavar="SCHEMA", help="its PostgreSQL schema")
    copy.add_argument("--to", dest="to_url", required=True, metavar="URL",
                      help="the database to copy into: migrated, and it must hold no "
                      "turnkit row")  # fmt: skip
    copy.add_argument("--to-schema", metavar="SCHEMA", help="its PostgreSQL schema")
    copy.add_argument(
        "--dry-run", action="store_true", help="write nothing: count what would be copied"
    )
    copy.add_argument(
        "--force",
        action="store_true",
        help="copy even while the source has running or queued turns",
    )
    copy.add_argument(
        "--batch-size",
        type=at_least_one,
        default=500,
        help="rows read and inserted at a time (default: %(default)s)",
    )


def _version() -> str:
    try:
        return importlib.metadata.version("turnkit")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


def parser() -> argparse.ArgumentParser:
    """The `turnkit` command's parser."""
    # One-line errors, for every command too (`add_subparsers` makes parsers of its class).
    parser: argparse.ArgumentParser = _OneLineErrors(prog="turnkit", description=DESCRIPTION)
    parser.add_argument(
        "--version", action="version", version=f"turnkit {_version()}", help="print the version"
    )
    # Not `required=True`: argparse would then answer `turnkit --bogus` with "the following
    # arguments are required: command" instead of naming the unknown option (main checks).
    sub = parser.add_subparsers(dest="command")
    for add in (
        _add_run,
        _add_pauses,
        _add_worker,
        _add_sweep,
        _add_turns,
        _add_sessions,
        _add_events,
        _add_budgets,
        _add_serve,
        _add_db,
    ):
        add(sub)
    return parser
