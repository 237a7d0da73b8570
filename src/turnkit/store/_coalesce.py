"""`Coalescer`: single-key calls made together, answered by one batched call (private).

A thousand readers following their turns each ask the Store where their turn stands about
once a second, and a thousand drivers renew their leases every few seconds. Many of those
calls fall in the same turn of the event loop; answered one by one, each is a transaction
of its own. `Coalescer` collects the keys asked for while no call is running, answers them
with one call on the next loop iteration, and wakes each asker with its answer. At low
load a batch holds one key and costs what the single call did.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ("Coalescer",)

K = TypeVar("K")
V = TypeVar("V")


class Coalescer(Generic[K, V]):
    """Coalesces `get(key)` calls into `call_many(keys)` calls of at most `most` keys."""

    def __init__(
        self, call_many: Callable[[Sequence[K]], Awaitable[dict[K, V]]], *, most: int
    ) -> None:
        self._call_many = call_many
        self._most = most
        self._waiting: dict[K, list[asyncio.Future[V | None]]] = {}
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        """Guards the three above: a store may be shared with another thread's loop."""

    async def get(self, key: K) -> V | None:
        """The answer for `key` (None when there is none), found with the others asked now."""
        future = self._enqueue(key, asyncio.get_running_loop())
        if future is None:  # another loop's batch is running: call alone
            return (await self._call_many([key])).get(key)
        return await future

    def _enqueue(self, key: K, loop: asyncio.AbstractEventLoop) -> asyncio.Future[V | None] | None:
        with self._lock:
            if self._drain is not None and self._drain.done():
                # Cancelled before it ran (as its loop closed): its askers cannot be answered.
                left, self._drain, self._waiting = self._waiting, None, {}
                if self._loop is loop:  # safe to settle only from their own loop
                    for waiting in left.values():
                        _settle(waiting, exc=asyncio.CancelledError())
            if self._drain is None:
                self._loop = loop
            elif loop is not self._loop:
                return None
            future: asyncio.Future[V | None] = loop.create_future()
            self._waiting.setdefault(key, []).append(future)
            if self._drain is None:
                self._drain = loop.create_task(self._run())
            return future

    def _next_batch(self) -> dict[K, list[asyncio.Future[V | None]]]:
        with self._lock:
            keys = list(self._waiting)[: self._most]
            return {key: self._waiting.pop(key) for key in keys}

    async def _run(self) -> None:
        try:
            while futures := self._next_batch():
                try:
                    found = await self._call_many(list(futures))
                except BaseException as exc:
                    for waiting in futures.values():
                        _settle(waiting, exc=exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for key, waiting in futures.items():
                    _settle(waiting, value=found.get(key))
        finally:
            with self._lock:
                self._drain, left = None, self._waiting
                self._waiting = {}
            for waiting in left.values():  # cancelled with keys still queued
                _settle(waiting, exc=asyncio.CancelledError())


def _settle(
    futures: list[asyncio.Future[V | None]],
    *,
    value: V | None = None,
    exc: BaseException | None = None,
) -> None:
    for future in futures:
        if future.done():  # its asker stopped waiting (a client went away)
            continue
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        elif exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)
