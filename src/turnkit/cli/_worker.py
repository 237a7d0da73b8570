"""`turnkit worker`: claim queued turns and drive them.

With the agents its flags name, or with the app's own runtime (`--runtime`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import string
from typing import TextIO

from turnkit.agent import Agent, load_agents
from turnkit.cli._logs import announce
from turnkit.cli._settings import (
    gc_mode,
    hosting,
    load_runtime,
    named_agents,
    refuse_beside_runtime,
    runtime_config,
    tune_gc,
)
from turnkit.config import env_plugins
from turnkit.demo import demo_agent
from turnkit.replay import replay_from_url
from turnkit.runtime import SessionRuntime
from turnkit.runtime.worker import Worker
from turnkit.store.sql import shown_url

__all__ = ("hosted_agents", "work")


def hosted_agents(args: argparse.Namespace) -> tuple[Agent, ...]:
    """The agents a worker hosts: those named, else `$TURNKIT_AGENT`'s, else the demo agent.

    `$TURNKIT_AGENT` as `turnkit serve` reads it: names separated by commas.
    """
    named = named_agents(args) or os.environ.get("TURNKIT_AGENT", "").strip(string.whitespace + ",")
    model = os.environ.get("TURNKIT_MODEL", "").strip() or None  # blank: the demo model
    return load_agents(named) if named else (demo_agent(model),)


async def work(args: argparse.Namespace, out: TextIO) -> int:
    """Drive queued turns until SIGINT or SIGTERM, then leave the rest to other workers."""
    if args.runtime:
        refuse_beside_runtime(args.argv)
        runtime = await load_runtime(args.runtime)
        # This worker is the claim loop: the runtime's own would claim beside it, past
        # --concurrency, and on through the drain.
        runtime.config = dataclasses.replace(runtime.config, recover_in_process=False)
    else:
        runtime = SessionRuntime(
            agents=hosted_agents(args),
            config=runtime_config(args),
            replay=replay_from_url(args.redis_url),
            plugins=env_plugins(os.environ),
        )
    if not args.listen:  # nor for Stops of the turns the runtime drives (an asked agent's)
        runtime.config = dataclasses.replace(runtime.config, listen_for_stops=False)
    tune_gc(gc_mode())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        worker = Worker(
            runtime,
            concurrency=args.concurrency,
            poll_interval_s=args.poll_interval,
            sweep_interval_s=args.sweep_interval,
            drain_timeout_s=args.drain_timeout,
            listen=args.listen,
        )
        url = shown_url(runtime.config.database_url)
        announce(
            out,
            f"turnkit worker {runtime.owner} on {url}, hosting {hosting(runtime)}",
            args.log_format,
        )
        await worker.run(stop)  # opens the runtime, waiting out a database not yet up
        # A session named after its opening turn ended here: give the call the same grace.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.drain_timeout):
                await runtime.wait_background()
    finally:
        await runtime.close()
        await runtime.replay.close()  # built for this worker: nothing else uses it
    return 0
