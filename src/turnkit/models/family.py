"""`ModelFamily`: ordered rungs with a family-strict cascade; itself a `ModelClient`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence

from turnkit.errors import (
    ConfigurationError,
    FamilyExhaustedError,
    ModelUnreachableError,
    ProviderError,
    TurnkitError,
    typed_message,
)
from turnkit.models import (
    Finish,
    ModelChunk,
    ModelClient,
    ModelRequest,
    RungFailed,
    RungStarted,
    closing_stream,
    estimate_tokens,
)
from turnkit.models._status import RETRIABLE_STATUS

__all__ = ("ModelFamily", "default_is_retriable", "resolve_family")


def default_is_retriable(exc: Exception) -> bool:
    """429, 5xx, timeouts and "overloaded": worth trying the next rung."""
    if isinstance(exc, ProviderError):
        return exc.is_retriable or (exc.status_code in RETRIABLE_STATUS)
    return isinstance(exc, TimeoutError | ConnectionError)


class ModelFamily:
    """An ordered list of rungs; retriable failures walk down, never to another family.

    The family yields a `RungStarted` before each attempt and a `RungFailed` when an
    attempt fails retriably, so the caller can void that attempt's chunks, audit the step
    and tell the client. When the last rung fails it raises `FamilyExhaustedError`.
    A non-retriable failure is raised as is: walking on would hide a real error.
    """

    def __init__(
        self,
        name: str,
        rungs: Sequence[ModelClient],
        *,
        is_retriable: Callable[[Exception], bool] = default_is_retriable,
    ) -> None:
        if not rungs:
            raise ConfigurationError(f"model family {name!r} needs at least one rung")
        for at, rung in enumerate(rungs):
            if not callable(getattr(rung, "stream", None)):
                hint = f": LiteLLMClient({rung!r})" if isinstance(rung, str) else ""
                raise ConfigurationError(
                    f"rung {at} of model family {name!r} is {type(rung).__name__}, not a "
                    f"ModelClient{hint}"
                )
        self.name = name
        self.rungs: tuple[ModelClient, ...] = tuple(rungs)
        self.is_retriable = is_retriable

    @classmethod
    def of(cls, client: ModelClient | ModelFamily) -> ModelFamily:
        """A family of one rung, or the family itself."""
        if isinstance(client, ModelFamily):
            return client
        return cls(client.model, [client])

    @property
    def model(self) -> str:
        """The first rung's model."""
        return self.rungs[0].model

    @property
    def provider(self) -> str:
        """The first rung's provider."""
        return self.rungs[0].provider

    def context_window(self) -> int | None:
        """The smallest context window a rung declares (None: no rung declares one).

        A client declares its window with a `context_window` attribute; `LiteLLMClient`
        reads it from litellm's model catalog.
        """
        windows = [
            w
            for rung in self.rungs
            if isinstance(w := getattr(rung, "context_window", None), int) and w > 0
        ]
        return min(windows) if windows else None

    def count_tokens(self, request: ModelRequest) -> int:
        """Input tokens of `request` as the first rung counts them (else an estimate).

        A client counts its own tokens with a `count_tokens(request)` method; others get
        `turnkit.models.estimate_tokens`.
        """
        counter = getattr(self.rungs[0], "count_tokens", None)
        if callable(counter):
            counted = counter(request)
            if isinstance(counted, int):
                return counted
        return estimate_tokens(request)

    def _falls_back(self, exc: Exception, next_rung: int | None) -> bool:
        """A refused connection walks on when a rung follows, under the default predicate.

        Nothing listening is how a provider's restart looks, which a fallback is for; with
        no rung after it, the refusal is raised as it is (most often a wrong `api_base`).
        """
        return (
            next_rung is not None
            and self.is_retriable is default_is_retriable
            and isinstance(exc, ModelUnreachableError)
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream the call on the first rung that answers."""
        failures: list[tuple[str, Exception]] = []  # (rung's model, its failure)
        for index, rung in enumerate(self.rungs):
            address = getattr(rung, "api_base", None)  # a `LiteLLMClient`'s
            yield RungStarted(
                rung=index,
                model=rung.model,
                provider=rung.provider,
                address=address if isinstance(address, str) else None,
            )
            started = time.perf_counter()
            try:
                async with closing_stream(rung.stream(request)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                        if isinstance(chunk, Finish):
                            return
                raise _unfinished(rung.model)
            except Exception as exc:
                nxt = index + 1 if index + 1 < len(self.rungs) else None
                if not (self.is_retriable(exc) or self._falls_back(exc, nxt)):
                    raise
                failures.append((rung.model, exc))
                yield RungFailed(
                    rung=index,
                    model=rung.model,
                    provider=rung.provider,
                    error=exc,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    next_rung=nxt,
                    next_model=self.rungs[nxt].model if nxt is not None else None,
                )
        if len(self.rungs) == 1:  # a plain model string: its own failure says it all
            said = _brief(failures[0][1], whole=True)
        else:
            said = f"every rung of model family {self.name!r} failed ({_summary(failures)}). "
            said += "Retry later, or pick another family: turnkit never widens a cascade on its own"
        wait = _shortest_wait(failures)
        raise FamilyExhaustedError(
            said,
            family=self.name,
            attempts=tuple(r.model for r in self.rungs),
            **({} if wait is None else {"retry_after_s": wait}),
        )


def _unfinished(model: str) -> ProviderError:
    """A client's stream that ended without its `Finish`: cut off, as a dropped connection."""
    return ProviderError(
        f"model {model!r} ended its stream without a Finish chunk (cut off); a ModelClient "
        "ends every stream it completes with Finish(stop_reason, usage)",
        is_retriable=True,
    )


def _shortest_wait(failures: list[tuple[str, Exception]]) -> float | None:
    """When every rung asked to wait (`Retry-After`), the first is back after the shortest."""
    waits = [getattr(exc, "retry_after_s", None) for _, exc in failures]
    known = [float(w) for w in waits if isinstance(w, int | float) and not isinstance(w, bool)]
    return min(known) if len(known) == len(waits) else None


def _brief(exc: Exception, *, whole: bool = False) -> str:
    """A rung's failure in a few words, without its model's name or advice to retry.

    `whole`: its full message instead (a family of one has nothing to summarize).
    """
    brief = getattr(exc, "brief", None)
    if isinstance(brief, str) and brief and not whole:
        return brief
    return exc.message if isinstance(exc, TurnkitError) else typed_message(exc)


def _summary(failures: list[tuple[str, Exception]]) -> str:
    """Each failure once, after the models that failed that way (in the family's order)."""
    models: dict[str, list[str]] = {}
    for model, exc in failures:
        models.setdefault(_brief(exc), []).append(model)
    return "; ".join(f"{', '.join(names)}: {brief.rstrip('.')}" for brief, names in models.items())


def resolve_family(spec: str | ModelClient) -> ModelFamily:
    """A family for a model string (through litellm), a client, or a family."""
    if isinstance(spec, str):
        from turnkit.models.litellm import LiteLLMClient

        return ModelFamily(spec, [LiteLLMClient(spec)])
    return ModelFamily.of(spec)
