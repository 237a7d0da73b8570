"""Prepare a call for the direct transport with litellm's own mapping, or decline it.

`prepare` turns the keyword arguments `LiteLLMClient` would pass to `litellm.acompletion`
into the HTTP request litellm would send for the `openai` provider: litellm maps the
parameters (`get_optional_params`: `max_tokens` becomes `max_completion_tokens` for
o-series models, unsupported ones are refused or dropped as `litellm.drop_params` says)
and builds the body (the provider config's `transform_request`). Only the sending and the
parsing of the stream are turnkit's own (`_openai_stream`).

It declines (returns None, and litellm's path serves the call) whenever litellm would do
more than one chat-completions request: a model litellm bridges to the Responses API,
litellm callbacks that expect to see the call, or any error while preparing (litellm then
raises its own, mapped as on its path). litellm arrives as an argument, as in `_errors`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from turnkit.models._openai_stream import ChatCall

__all__ = ("OPENAI_BASE", "prepare")

OPENAI_BASE: Final = "https://api.openai.com/v1"

_MAPPED: Final = (
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "tool_choice",
    "response_format",
    "reasoning_effort",
    "thinking",
)
"""The `acompletion` arguments turnkit sends that `get_optional_params` maps."""

_CALLBACK_LISTS: Final = (
    "callbacks",
    "input_callback",
    "success_callback",
    "failure_callback",
    "_async_success_callback",
    "_async_failure_callback",
)

_USER_AGENT: Final = "turnkit"


def _has_callbacks(litellm: ModuleType) -> bool:
    """Whether a litellm callback expects to see calls.

    litellm's own `"cache"` entry does nothing while `litellm.cache` is unset, yet any
    `Cache` object adds it, and litellm makes one when its Gemini and Vertex code is first
    imported: such a call must not move every later OpenAI call onto litellm's path.
    """
    for name in _CALLBACK_LISTS:
        found = getattr(litellm, name, None) or ()
        if any(not (entry == "cache" and litellm.cache is None) for entry in found):
            return True
    return False


_log = logging.getLogger(__name__)


def prepare(litellm: ModuleType, kwargs: Mapping[str, object], *, model: str) -> ChatCall | None:
    """The direct call for `kwargs` (as for `litellm.acompletion`), or None to use litellm.

    Args:
        litellm: The litellm module.
        kwargs: The `acompletion` keyword arguments, credentials included.
        model: The bare model name litellm resolved (without `openai/`).
    """
    if _has_callbacks(litellm):
        return None  # logging integrations see calls only on litellm's path
    api_base = _api_base(litellm, kwargs.get("api_base"))
    try:
        if _bridged(litellm, model, kwargs, api_base):
            return None
        params = {name: kwargs[name] for name in _MAPPED if name in kwargs}
        optional = dict(
            litellm.get_optional_params(model=model, custom_llm_provider="openai", **params)
        )
        extra = optional.pop("extra_body", None)
        config = litellm.ProviderConfigManager.get_provider_chat_config(
            model=model, provider=litellm.LlmProviders.OPENAI
        )
        body = dict(
            config.transform_request(
                model=model,
                messages=kwargs["messages"],
                optional_params=optional,
                litellm_params={},
                headers={},
            )
        )
    except Exception as exc:  # noqa: BLE001 - litellm's path then sends it or raises its error
        _log.debug("litellm's path serves %r: %r", model, exc)
        return None
    # As the openai SDK does with `extra_body`: its fields join the body's top level.
    for more in (extra, kwargs.get("extra_body")):
        if isinstance(more, Mapping):
            body.update(more)
    return ChatCall(
        url=_completions_url(api_base),
        endpoint=_endpoint(api_base),
        headers=_headers(litellm, kwargs),
        body=_encoded(body),
        timeout=_float(kwargs.get("timeout"), 600.0),
    )


def _encoded(body: Mapping[str, object]) -> bytes:
    """The body as UTF-8 JSON, or with non-ASCII escaped when it holds a lone surrogate.

    A lone surrogate (a file name read with `surrogateescape`, say) has no UTF-8 form;
    a JSON escape carries it, and the server decides what to make of it.
    """
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


def _api_base(litellm: ModuleType, given: object) -> str:
    """The base URL litellm's openai handler would use: argument, global, env, default."""
    for candidate in (
        given,
        getattr(litellm, "api_base", None),
        os.environ.get("OPENAI_BASE_URL"),
        os.environ.get("OPENAI_API_BASE"),
    ):
        if isinstance(candidate, str) and candidate:
            return candidate
    return OPENAI_BASE


def _bridged(litellm: ModuleType, model: str, kwargs: Mapping[str, object], api_base: str) -> bool:
    """Whether litellm would send this call to the Responses API instead (its own rule)."""
    check = getattr(getattr(litellm, "main", None), "responses_api_bridge_check", None)
    if check is None:  # an older litellm: only models mapped as `responses` are bridged
        entry = getattr(litellm, "model_cost", {}).get(model)
        return isinstance(entry, Mapping) and entry.get("mode") == "responses"
    info, _ = check(
        model=model,
        custom_llm_provider="openai",
        tools=kwargs.get("tools"),
        reasoning_effort=kwargs.get("reasoning_effort"),
        api_base=api_base,
    )
    return isinstance(info, Mapping) and info.get("mode") == "responses"


def _headers(litellm: ModuleType, kwargs: Mapping[str, object]) -> dict[str, str]:
    """Headers as the openai SDK sends them for litellm: key, organization, project, extras."""
    headers = {"content-type": "application/json", "user-agent": _USER_AGENT}
    key = (
        kwargs.get("api_key")
        or getattr(litellm, "api_key", None)
        or getattr(litellm, "openai_key", None)
        or os.environ.get("OPENAI_API_KEY")
    )
    if isinstance(key, str) and key:
        headers["authorization"] = f"Bearer {key}"
    organization = getattr(litellm, "organization", None) or os.environ.get("OPENAI_ORGANIZATION")
    if isinstance(organization, str) and organization:
        headers["openai-organization"] = organization
    project = os.environ.get("OPENAI_PROJECT_ID")
    if project:
        headers["openai-project"] = project
    for extra in (getattr(litellm, "headers", None), kwargs.get("extra_headers")):
        if isinstance(extra, Mapping):
            headers.update({str(k).lower(): str(v) for k, v in extra.items()})
    return headers


def _completions_url(api_base: str) -> str:
    """`{api_base}/chat/completions`, any query (`?api-version=…`) kept after the path."""
    parts = urlsplit(api_base)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/chat/completions"))


def _endpoint(api_base: str) -> str:
    parts = urlsplit(api_base)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _float(value: object, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default
