"""Model families by the name (or client) an agent gives: resolved once per model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from turnkit.models import ModelClient
from turnkit.models.family import ModelFamily, resolve_family
from turnkit.models.litellm import ModelEndpoint

__all__ = ("ModelFamilies",)

Served = Mapping[str, str | ModelClient | ModelEndpoint]


class ModelFamilies:
    """Resolves a model string or client to its `ModelFamily`, caching each.

    A string names one of the runtime's served models before litellm resolves it, so an
    agent or a message override reaches that endpoint, client or family.
    """

    def __init__(self, served: Callable[[], Served]) -> None:
        self._served = served  # read at each miss: a model served later is found
        self._cache: dict[object, tuple[object, ModelFamily]] = {}

    def __call__(self, spec: str | Any) -> ModelFamily:
        key: object = spec if isinstance(spec, str) else ("client", id(spec))
        cached = self._cache.get(key)
        if cached is None:
            served = self._served().get(spec) if isinstance(spec, str) else None
            if isinstance(served, ModelEndpoint):
                served = served.client()
            family = resolve_family(served if served is not None else spec)
            if served is not None and not isinstance(served, ModelFamily):
                family = ModelFamily(spec, family.rungs)  # named as the agent names it
            # The client itself is kept with its family, so its id cannot be reused.
            cached = (spec, family)
            self._cache[key] = cached
        return cached[1]
