"""`turnkit` command line: `turnkit run "message"` streams one turn in the terminal."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from turnkit.config import RuntimeConfig
from turnkit.demo import DEMO_MODEL_NAME, demo_agent
from turnkit.errors import TurnkitError
from turnkit.events import (
    DoneEvent,
    DurableEvent,
    EphemeralEvent,
    ErrorEvent,
    MessageCompleteEvent,
    MessageDeltaEvent,
    ProviderCascadeEvent,
    StepStartEvent,
    ToolCompletedEvent,
    ToolFailedEvent,
    ToolStartedEvent,
    TurnStartedEvent,
    UsageEvent,
)
from turnkit.ids import uuid7
from turnkit.runtime import SessionRuntime

__all__ = ("main",)


class _Printer:
    """Renders events readably: stages, tool rows, the streamed answer, usage."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.streaming: str | None = None

    def _line(self, text: str) -> None:
        if self.streaming is not None:
            self.out.write("\n")
            self.streaming = None
        self.out.write(text + "\n")

    def show(self, event: DurableEvent | EphemeralEvent) -> None:  # noqa: C901 - one arm per event
        match event:
            case TurnStartedEvent():
                self._line(
                    f"turn {event.turn_id} · session {event.session_id} · model {event.model}"
                )
            case StepStartEvent(step=step, iteration=iteration):
                self._line(f"▸ {step}" + (f" #{iteration}" if iteration else ""))
            case MessageDeltaEvent(stage_id=stage, text=text):
                if self.streaming != stage:
                    self._line("") if self.streaming is not None else None
                    self.out.write("  … " if stage == "tool-loop" else "")
                    self.streaming = stage
                self.out.write(text)
            case MessageCompleteEvent():
                if self.streaming is not None:
                    self.out.write("\n")
                    self.streaming = None
            case ToolStartedEvent(block=block):
                args = ", ".join(f"{k}={v!r}" for k, v in block.arguments.items())
                self._line(f"  ⚙ {block.tool_name}({args})")
            case ToolCompletedEvent(result=result, duration_ms=ms):
                self._line(f"    → {result.output!r}  ({ms:.1f} ms)")
            case ToolFailedEvent(result=result, code=code):
                self._line(f"    ✗ {code}: {result.error}")
            case ProviderCascadeEvent():
                nxt = event.to_model or "nothing left"
                self._line(f"  ↷ {event.from_model} failed ({event.reason}); trying {nxt}")
            case UsageEvent():
                self._line(
                    f"usage: {event.model_calls} model calls · {event.input_tokens} in / "
                    f"{event.output_tokens} out tokens · ${event.cost_usd:.4f}"
                )
            case ErrorEvent(code=code, message=message):
                self._line(f"✗ error [{code}]: {message}")
            case DoneEvent(status=status):
                self._line(("✓ " if status == "succeeded" else "■ ") + status)
            case _:
                pass
        self.out.flush()


async def _run(args: argparse.Namespace, out: TextIO) -> int:
    model = args.model or os.environ.get("TURNKIT_MODEL")
    agent = demo_agent(model)
    if model is None:
        out.write(
            f"model: {DEMO_MODEL_NAME} — the OFFLINE DEMO model: fixed rules, not an LLM "
            "(use --model provider/name for a real one)\n"
        )
    config = RuntimeConfig(database_url=args.database_url)
    printer = _Printer(out)
    async with SessionRuntime(agent=agent, config=config) as runtime:
        status = "failed"
        async for event in runtime.execute_message(args.session or f"cli-{uuid7()}", args.message):
            printer.show(event)
            if isinstance(event, DoneEvent):
                status = event.status
    return 0 if status == "succeeded" else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one turn and stream it")
    run.add_argument("message", help="the user message")
    run.add_argument("--model", help="a litellm model string (default: the offline demo model)")
    run.add_argument("--session", help="session id (default: a new one)")
    run.add_argument(
        "--database-url",
        default=os.environ.get("TURNKIT_DATABASE_URL", "sqlite:///turnkit.db"),
        help="where turns are stored (default: sqlite:///turnkit.db)",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Entry point of the `turnkit` command."""
    args = _parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        return asyncio.run(_run(args, stream))
    except TurnkitError as exc:
        sys.stderr.write(f"turnkit: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
