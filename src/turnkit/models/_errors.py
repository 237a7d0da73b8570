"""Provider failures as turnkit errors, the same for both of `LiteLLMClient`'s transports.

litellm's path raises litellm's and the openai SDK's exceptions; the direct path raises
`ChatStreamError` and httpx's. Both end here, so a status, a refused connection or a
refused key reads the same whichever transport carried the call.
"""

from __future__ import annotations

import email.utils
import importlib
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType
from typing import Final

from turnkit.errors import ModelCredentialsError, ModelUnreachableError, ProviderError
from turnkit.models._openai_stream import ChatStreamError
from turnkit.models._status import RETRIABLE_STATUS

__all__ = ("CallSite", "map_error", "retry_after")

_MAX_WAIT_S: Final = 86_400.0
"""A longer wait than a day is not a wait a caller should plan around: a day is reported."""

_CONTEXT_WINDOW_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSite:
    """What an error message names: the model, its provider, address and key."""

    model: str
    provider: str
    api_base: str | None
    key_variable: str
    timeout: float
    """Seconds the client waits for the provider (connect and between reads)."""
    base_source: str = "api_base"
    """What set `api_base`, in the words the user set it with (`OPENAI_BASE_URL`, ...)."""


def map_error(exc: Exception, site: CallSite, litellm: ModuleType) -> ProviderError | None:
    """A `ProviderError` for provider and transport failures; None for anything else."""
    openai = importlib.import_module("openai")
    httpx = importlib.import_module("httpx")
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    sent = not _synthetic(exc, litellm)  # whether the provider sent `status` itself
    detail = str(getattr(exc, "message", "") or exc).strip()
    if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException | TimeoutError):
        status, sent, retriable = status or 408, False, True
        advice = f"it timed out after {site.timeout:g} s waiting for the provider"
    elif isinstance(exc, ChatStreamError) and status in (408, 504):  # litellm: `Timeout`
        retriable, advice = True, "the provider timed out"
    elif _refused(exc, httpx):
        # api_base may carry a credential (`user:password@`, `?api-key=`): never repeat it.
        where = redact_secrets(site.api_base) if site.api_base else None
        where = where or f"the {site.provider} default URL"
        return ModelUnreachableError(
            f"model {site.model!r}: the connection to {where} was refused; is the "
            f"server running there, and is {site.base_source} right?",
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
    elif isinstance(exc, ChatStreamError) and exc.origin == "stream":
        retriable, advice, detail = True, exc.message, ""
    elif isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.ConnectError):
        retriable, advice = True, "the connection was cut before the answer was complete"
    elif isinstance(exc, openai.APIConnectionError | httpx.TransportError | ConnectionError):
        retriable, advice = True, "the provider could not be reached"
    elif isinstance(exc, openai.RateLimitError) or status == 429:
        status, retriable, advice = status or 429, True, "the provider is rate limiting"
    elif status is not None or isinstance(exc, openai.OpenAIError | ChatStreamError):
        retriable = status is not None and (status in RETRIABLE_STATUS or status >= 500)
        advice = _advice(status, exc, litellm, site)
        if status == 404 and sent:
            advice += _no_v1(site)
    else:
        return None
    wait = retry_after(exc) if sent else None
    return _provider_error(site, status, sent, retriable, advice, detail, wait)


def _provider_error(
    site: CallSite,
    status: int | None,
    sent: bool,
    retriable: bool,
    advice: str,
    detail: str,
    wait: float | None,
) -> ProviderError:
    """The message names the HTTP status only when the provider sent it."""
    if wait is not None:  # an HTTP date comes to a fraction of a second: not worth saying
        advice += (
            f" (it asked to wait {wait:g} s)" if wait < 10 else f" (it asked to wait {wait:.0f} s)"
        )
    detail = redact_secrets(detail)
    if len(detail) > 500:
        detail = detail[:500] + "..."
    said = f" Provider said: {detail}" if detail else ""
    shown = f"HTTP {status}: " if status and sent else ""
    retry = "; retry later, or give the agent a fallback model (a ModelFamily)" if retriable else ""
    return ProviderError(
        f"model {site.model!r} (provider {site.provider!r}) failed"
        f"{f' with HTTP {status}' if shown else ''}: {advice}{retry}.{said}",
        status_code=status,
        is_retriable=retriable,
        retry_after_s=wait,
        brief=f"{shown}{advice}.{said}",
    )


_SECRETS = (
    (  # a token has a digit or a sign in it ("Basic authentication failed" is words)
        re.compile(
            r"\b(Bearer|Basic)\s+(?=[A-Za-z0-9._~+/=-]*[0-9=+/._-])[A-Za-z0-9._~+/=-]{8,}",
            re.IGNORECASE,
        ),
        r"\1 ***",
    ),
    (re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_-]{8,}"), r"\1-***"),
    (re.compile(r"(://)[^/\s@:]+:[^/\s@]+@"), r"\1***@"),
    (
        re.compile(
            r"(\b(?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*[\"']?)"
            r"(?=[^\s\"',}]*\d)[^\s\"',}]{4,}",
            re.I,
        ),
        r"\1***",
    ),
)
"""What a provider (or a proxy before it) may echo of a credential: tokens after `Bearer`
or `Basic`, `sk-…` keys, a URL's `user:password@`, `api_key=…` and the like."""


def redact_secrets(text: str) -> str:
    """`text` with credential-shaped parts replaced by `***` (it reaches end users)."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def retry_after(exc: Exception) -> float | None:
    """The seconds a failed response's `Retry-After` asks to wait (a number or an HTTP date).

    The direct transport keeps the header on its error; litellm's and the openai SDK's
    errors carry the response. None when there is none or it is not a valid wait.
    """
    raw = getattr(exc, "retry_after", None)
    if raw is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
        raw = headers.get("retry-after") if isinstance(headers, Mapping) else None
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        wait = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        wait = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(wait):
        return None
    return round(min(max(wait, 0.0), _MAX_WAIT_S), 3)


def _synthetic(exc: Exception, litellm: ModuleType) -> bool:
    """Whether `exc`'s status was made up on this side (the provider sent no such status)."""
    if isinstance(exc, ChatStreamError):
        return exc.origin != "status"
    connection = getattr(litellm, "APIConnectionError", None)
    return isinstance(exc, _mid_stream(litellm)) or (
        isinstance(connection, type) and isinstance(exc, connection)
    )


def _mid_stream(litellm: ModuleType) -> tuple[type, ...]:
    """The error litellm raises for a stream that failed after it began (a made-up status)."""
    exceptions = getattr(litellm, "exceptions", None)
    kind = getattr(exceptions, "MidStreamFallbackError", None)
    return (kind,) if isinstance(kind, type) else ()


def _no_v1(site: CallSite) -> str:
    """For a 404 from an OpenAI-compatible server whose api_base lacks `/v1`: say so.

    `--api-base http://127.0.0.1:8000` for a server that serves `/v1/chat/completions` is
    the commonest way to get that 404; a proxy that serves the root never answers one.
    """
    if site.provider != "openai" or not site.api_base:
        return ""
    path = urllib.parse.urlsplit(site.api_base).path.rstrip("/")
    if path.endswith("/v1"):
        return ""
    base = redact_secrets(site.api_base)
    return f" ({base}: if that server serves its API under /v1, add /v1 to the address)"


def _advice(status: int | None, exc: Exception, litellm: ModuleType, site: CallSite) -> str:
    if (
        isinstance(exc, litellm.ContextWindowExceededError)
        or getattr(exc, "code", None) in _CONTEXT_WINDOW_CODES
    ):
        return "the request exceeds the model's context window; shorten the conversation"
    if isinstance(exc, _mid_stream(litellm)):
        if "repeating the same chunk" in str(exc):  # litellm's guard against a looping model
            return (
                "litellm stopped the stream: the model sent the same chunk "
                f"{getattr(litellm, 'REPEATED_STREAMING_CHUNK_LIMIT', 100)} times in a row "
                "(litellm.REPEATED_STREAMING_CHUNK_LIMIT)"
            )
        return "the stream broke off before the answer was complete"
    if status == 404:
        return (
            "the provider does not know this model or endpoint; check the model and "
            f"{site.base_source}"
        )
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
