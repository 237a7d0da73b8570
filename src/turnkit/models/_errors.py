"""Provider failures as turnkit errors, the same for both of `LiteLLMClient`'s transports.

litellm's path raises litellm's and the openai SDK's exceptions; the direct path raises
`ChatStreamError` and httpx's. Both end here, so a status, a refused connection or a
refused key reads the same whichever transport carried the call.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from turnkit.errors import ModelCredentialsError, ModelUnreachableError, ProviderError
from turnkit.models._openai_stream import ChatStreamError
from turnkit.models._status import RETRIABLE_STATUS

__all__ = ("CallSite", "map_error")

_CONTEXT_WINDOW_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSite:
    """What an error message names: the model, its provider, address and key."""

    model: str
    provider: str
    api_base: str | None
    key_variable: str


def map_error(exc: Exception, site: CallSite, litellm: ModuleType) -> ProviderError | None:
    """A `ProviderError` for provider and transport failures; None for anything else."""
    openai = importlib.import_module("openai")
    httpx = importlib.import_module("httpx")
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException | TimeoutError) or (
        isinstance(exc, ChatStreamError) and status in (408, 504)  # litellm: `Timeout`
    ):
        status, retriable, advice = status or 408, True, "the provider timed out"
    elif _refused(exc, httpx):
        where = site.api_base or f"the {site.provider} default URL"
        return ModelUnreachableError(
            f"model {site.model!r}: the connection to {where} was refused; is the "
            "server running there, and is api_base right?",
            model=site.model,
            address=where,
        )
    elif isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError) or (
        status in (401, 403)
    ):
        return ModelCredentialsError(
            f"model {site.model!r}: the provider refused the API key (HTTP "
            f"{status or 401}); check {site.key_variable}",
            model=site.model,
            variable=site.key_variable,
            status_code=status or 401,
        )
    elif isinstance(exc, openai.APIConnectionError | httpx.TransportError | ConnectionError):
        retriable, advice = True, "the provider could not be reached"
    elif isinstance(exc, openai.RateLimitError) or status == 429:
        status, retriable, advice = status or 429, True, "the provider is rate limiting"
    elif status is not None or isinstance(exc, openai.OpenAIError | ChatStreamError):
        retriable = status is not None and (status in RETRIABLE_STATUS or status >= 500)
        advice = _advice(status, exc, litellm)
    else:
        return None
    if retriable:
        advice += "; retry later or add a fallback rung to the ModelFamily"
    detail = str(getattr(exc, "message", "") or exc).strip()
    if len(detail) > 500:
        detail = detail[:500] + "..."
    return ProviderError(
        f"model {site.model!r} (provider {site.provider!r}) failed"
        f"{f' with HTTP {status}' if status else ''}: {advice}. Provider said: {detail}",
        status_code=status,
        is_retriable=retriable,
    )


def _advice(status: int | None, exc: Exception, litellm: ModuleType) -> str:
    if (
        isinstance(exc, litellm.ContextWindowExceededError)
        or getattr(exc, "code", None) in _CONTEXT_WINDOW_CODES
    ):
        return "the request exceeds the model's context window; shorten the conversation"
    if status == 404:
        return "the provider does not know this model or endpoint; check the model and api_base"
    if status is not None and status >= 500:
        return "the provider had a server error"
    if status is not None and status in RETRIABLE_STATUS:
        return "the provider is busy"
    return "the provider rejected the request; check the messages, tools and parameters"


def _refused(exc: BaseException, httpx: ModuleType) -> bool:
    """A connection refused (nothing listens there), anywhere in the cause chain."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, ConnectionRefusedError):
            return True
        if isinstance(current, httpx.ConnectError) and "refused" in str(current).lower():
            return True
        if "connection refused" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False
