"""`LiteLLMClient`: the `ModelClient` that reaches real providers through litellm.

This is the only turnkit module that calls providers through litellm (its private helpers
get litellm from it as an argument), imported lazily (the import is slow; see `_loader`),
so `import turnkit` stays fast and works without a provider key. Vendor shapes stop here:
requests go out as OpenAI chat dicts, chunks come back as turnkit's neutral chunks, and
every provider failure becomes a `ProviderError` with `is_retriable` set.

Two transports carry a call. litellm resolves the model, maps the parameters and prices
the call on both; for a model of the `openai` provider the stream itself goes over a lean
httpx client (`_direct`, `_openai_stream`), which costs a fraction of litellm's work per
chunk, and every other provider streams through `litellm.acompletion` (`_litellm_stream`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Mapping
from types import ModuleType
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from turnkit import models as _models
from turnkit.config import is_loopback_host
from turnkit.errors import (
    ConfigurationError,
    ModelCredentialsError,
    UnknownModelError,
)
from turnkit.models import (
    ModelChunk,
    ModelRequest,
)
from turnkit.models._chat_format import message_dicts, tool_dict
from turnkit.models._direct import prepare as _prepare_direct
from turnkit.models._errors import CallSite, map_error, redact_secrets
from turnkit.models._litellm_finish import estimated_usage, finish, note_output
from turnkit.models._litellm_stream import stream_litellm
from turnkit.models._loader import load_litellm as _load_litellm
from turnkit.models._openai_stream import StreamState, stream_chat

__all__ = ("LiteLLMClient", "ModelEndpoint", "Transport", "list_price_of", "resolve_model")

log = logging.getLogger("turnkit.models")

_UNKNOWN_WINDOWS: set[str] = set()
"""Models already reported as missing from litellm's catalog (once per process)."""

Transport = Literal["auto", "litellm"]
"""How calls travel: `auto` streams `openai` provider models directly, `litellm` never does."""

_ONE_SYSTEM_PROMPT = frozenset({"gemini", "vertex_ai", "vertex_ai_beta"})
"""Providers into whose one system prompt litellm moves every system message (Gemini's;
litellm keeps a later one in place itself for Anthropic, Bedrock and Claude on Vertex)."""

_MIN_THINKING_BUDGET = 1024
"""Providers with an explicit thinking budget (Anthropic, Gemini) reject smaller ones."""


def _resolve(model: str, api_base: str | None = None) -> tuple[str, str]:
    """Return `(bare model, provider)` for `model`, or raise `UnknownModelError`."""
    litellm = _load_litellm()
    try:
        bare, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base)
    except Exception as exc:
        raise UnknownModelError(
            f"cannot resolve model {model!r} to a provider: {_prefix_advice(litellm, model)} (see "
            "litellm's provider list); to run without a provider key or network: "
            "turnkit.testing.ScriptedModel in code, or the demo model (no --model, "
            "TURNKIT_MODEL unset) on the command line",
            model=model,
        ) from exc
    return str(bare), str(provider)


def _prefix_advice(litellm: ModuleType, model: str) -> str:
    """How to name the provider: an unknown prefix is named, with the OpenAI-compatible way."""
    prefix, _, rest = model.partition("/")
    if not rest or prefix in getattr(litellm, "provider_list", ()):
        return f"give it a provider prefix, e.g. 'openai/{model}' or 'anthropic/<model>'"
    return (
        f"litellm knows no provider {prefix!r}; for an OpenAI-compatible server use "
        f"'openai/{rest}' with api_base, or another provider's prefix, e.g. 'anthropic/<model>'"
    )


def _positive_number(value: object) -> bool:
    """A finite number of seconds above 0 (an unbounded wait is never what was meant)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < float("inf")
    )


def resolve_model(model: str) -> str:
    """Return the provider name litellm resolves `model` to.

    Args:
        model: A litellm model string such as `"openai/gpt-4o"`.

    Returns:
        The provider name, e.g. `"openai"`.

    Raises:
        UnknownModelError: litellm cannot tell which provider serves `model`.
    """
    return _resolve(model)[1]


def _is_loopback(api_base: str | None) -> bool:
    if not api_base:
        return False
    host = urlsplit(api_base if "//" in api_base else f"//{api_base}").hostname
    return host is not None and is_loopback_host(host)


def _effort_for(budget: int) -> str:
    if budget <= 1024:
        return "low"
    if budget <= 4096:
        return "medium"
    return "high"


class LiteLLMClient:
    """A `ModelClient` for any provider litellm knows, streaming OpenAI-style chat.

    Args:
        model: A litellm model string with a provider prefix, e.g. `"openai/gpt-4o"`.
        api_base: Base URL of the provider (e.g. a proxy or a local server).
        api_key: The provider key; litellm reads the provider's env variable when omitted.
        api_key_env: The name of an environment variable holding the key, read at each
            call (so a key kept out of code can rotate); takes effect when `api_key` is
            None.
        headers: Extra HTTP headers sent with every call (a proxy's routing or auth).
        timeout: Seconds to wait for the provider (connect and between chunks); a number
            above 0.
        extra_body: Extra JSON fields sent as they are in the request body.
        num_retries: Retries litellm makes on its own; keep 0 under a `ModelFamily`, which
            walks to the next rung instead.
        context_window: Input tokens the model accepts, for a model litellm's catalog
            does not know (a local server's) or to compact sooner; default: the
            catalog's, else 128,000.
        transport: `"auto"` (the default) streams the call over turnkit's own HTTP client
            when litellm resolves the model to the `openai` provider (an `openai/...`
            model string, with or without `api_base`, or a bare OpenAI model name) and
            `num_retries` is 0; litellm still maps the parameters, builds the request
            body and prices the call. Other providers, models litellm sends to the
            Responses API, and calls while litellm callbacks are set go through
            `litellm.acompletion`. `"litellm"` sends every call through litellm.

    A missing or refused key fails the call at once with `ModelCredentialsError` (code
    `model-credentials`, naming the variable to set) and a refused connection with
    `ModelUnreachableError` (`model-unreachable`, naming the address); neither is
    retried. A family walks on past a refused connection (a provider restarting), never
    past a refused key (another attempt would be refused the same way).

    Raises:
        UnknownModelError: litellm cannot resolve `model` to a provider.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        extra_body: Mapping[str, object] | None = None,
        num_retries: int = 0,
        transport: Transport = "auto",
        context_window: int | None = None,
    ) -> None:
        if context_window is not None and (
            isinstance(context_window, bool)
            or not isinstance(context_window, int)
            or context_window < 1
        ):
            raise ConfigurationError(
                f"`context_window` must be a whole number of tokens above 0, not {context_window!r}"
            )
        if api_key_env is not None and not api_key_env.strip():
            raise ConfigurationError("`api_key_env` must name an environment variable")
        if transport not in ("auto", "litellm"):
            raise ConfigurationError(f"`transport` must be 'auto' or 'litellm', not {transport!r}")
        if not _positive_number(timeout):
            raise ConfigurationError(
                f"`timeout` must be a finite number of seconds above 0, not {timeout!r}"
            )
        self._bare_model, self._provider = _resolve(model, api_base)
        self._native_schema: bool | None = None
        """Whether litellm knows the model takes a JSON schema natively (None: not asked)."""
        self._model = model
        self._api_base = api_base
        self._api_key = api_key
        self._api_key_env = api_key_env
        self._headers = dict(headers) if headers else None
        self._keys_checked = False
        self._timeout = timeout
        self._extra_body = dict(extra_body) if extra_body else None
        self._num_retries = num_retries
        self._transport: Transport = transport
        self._direct = transport == "auto" and self._provider == "openai" and num_retries == 0
        self._notes_in_place = (
            self._provider in _ONE_SYSTEM_PROMPT and "claude" not in self._bare_model.lower()
        )
        self._context_window = context_window

    @property
    def model(self) -> str:
        """The model string as given, e.g. `"openai/gpt-4o"`."""
        return self._model

    @property
    def provider(self) -> str:
        """The provider litellm resolved, e.g. `"openai"`."""
        return self._provider

    @property
    def api_base(self) -> str | None:
        """The base URL calls go to (None: the provider's default).

        The one given, else litellm's global `api_base`, else for `openai/` models
        `$OPENAI_BASE_URL` (or `$OPENAI_API_BASE`).
        """
        return self._base_url(sys.modules.get("litellm"))

    @property
    def transport(self) -> Transport:
        """How calls travel: `"auto"` or `"litellm"` (see the class docstring)."""
        return self._transport

    def __repr__(self) -> str:
        return f"LiteLLMClient(model={self._model!r}, api_base={self._api_base!r})"

    @property
    def context_window(self) -> int:
        """Input tokens the model accepts: as given, else from litellm's model catalog.

        A model the catalog does not know (a local server's, say) counts as 128,000
        tokens, said once in a warning: give it `context_window` so compaction keeps its
        requests inside what it really takes.
        """
        if self._context_window is not None:
            return self._context_window
        from turnkit.models.catalog import DEFAULT_FACTS, model_facts

        facts = model_facts(self._model)
        if facts is DEFAULT_FACTS and self._model not in _UNKNOWN_WINDOWS:
            _UNKNOWN_WINDOWS.add(self._model)
            log.warning(
                "model %s is not in litellm's catalog: its context window counts as %d "
                "tokens; pass LiteLLMClient(..., context_window=...) if it takes fewer",
                self._model,
                facts.context_window,
            )
        return facts.context_window

    def count_tokens(self, request: ModelRequest) -> int:
        """Input tokens of `request` by litellm's `token_counter` for this model."""
        litellm = _load_litellm()
        kwargs: dict[str, object] = {
            "model": self._model,
            "messages": self._messages(request),
        }
        if request.tools:
            kwargs["tools"] = [tool_dict(t) for t in request.tools]
        try:
            return int(litellm.token_counter(**kwargs))
        except Exception:  # noqa: BLE001 - a counter that fails must not fail the turn
            return _models.estimate_tokens(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one call: text, thinking and tool-call deltas, then exactly one `Finish`.

        Raises:
            ConfigurationError: `turnkit.models.ALLOW_NETWORK` is False and the call would
                leave this machine.
            InvalidInputError: A `tool` message has no `tool_call_id`.
            ProviderError: The provider failed; `is_retriable` says whether to walk on.
        """
        litellm = _load_litellm()
        self._check_network(litellm)
        kwargs = self._call_kwargs(litellm, request)
        kwargs.update(self._credentials(litellm))
        state = StreamState()
        direct = _prepare_direct(litellm, kwargs, model=self._bare_model) if self._direct else None
        pieces = stream_chat(direct, state) if direct else stream_litellm(litellm, kwargs, state)
        written: list[str] | None = [] if direct else None  # to estimate a missing usage
        try:
            async for piece in pieces:
                if written is not None:
                    note_output(written, piece)
                yield piece
        except Exception as exc:
            mapped = map_error(exc, self._call_site(litellm), litellm)
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            await pieces.aclose()
        if state.usage is None and written is not None:  # as litellm's own path counts it
            written.append(state.refusal or "")  # a refusal's words were written too
            # In a thread: a tokenizer over a long prompt (or its first load) is slow.
            state.usage = await asyncio.to_thread(estimated_usage, litellm, kwargs, written)
        yield finish(litellm, state, model=self._bare_model, provider=self._provider)

    # ── request ─────────────────────────────────────────────────────────────────────

    def _base_url(self, litellm: ModuleType | None) -> str | None:
        """Where both transports send the call (None: the provider's default URL).

        The client's base, else litellm's global one, else (OpenAI) the environment's.
        """
        base = self._api_base or getattr(litellm, "api_base", None) or None
        if base is None and self._provider == "openai":
            base = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
        return base or None

    def _base_source(self, litellm: ModuleType) -> str | None:
        """What set this client's address, in the words the user set it with (None: unset).

        The same order as `_base_url`.
        """
        if self._api_base:
            return "api_base"
        if getattr(litellm, "api_base", None):
            return "litellm.api_base"
        if self._provider == "openai":
            for variable in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
                if os.environ.get(variable):
                    return variable
        return None

    def _check_network(self, litellm: ModuleType) -> None:
        base = self._base_url(litellm)
        if _models.ALLOW_NETWORK or _is_loopback(base):
            return
        where = f"api_base {redact_secrets(base)!r}" if base else "the provider's default URL"
        raise ConfigurationError(
            f"model {self._model!r} would call {where}, but turnkit.models.ALLOW_NETWORK is "
            "False: point api_base at a loopback server (127.0.0.1, localhost, ::1), use "
            "turnkit.testing.ScriptedModel, or set ALLOW_NETWORK = True"
        )

    def _credentials(self, litellm: ModuleType) -> dict[str, object]:
        """The key to send, or a `ModelCredentialsError` naming the variable to set."""
        if self._api_key is not None:
            return {"api_key": self._api_key}
        if self._api_key_env is not None:
            value = os.environ.get(self._api_key_env, "").strip()
            if not value:
                raise ModelCredentialsError(
                    f"model {self._model!r} needs an API key: set the environment variable "
                    f"{self._api_key_env} (named by api_key_env)",
                    model=self._model,
                    variable=self._api_key_env,
                )
            return {"api_key": value}
        if not self._keys_checked:
            missing = _missing_keys(litellm, self._model, self._api_base, self._provider)
            if missing:
                where = self._base_source(litellm)
                keyless = (
                    f"; a server at {where} that needs no key takes any text as one "
                    f"({missing[0]}=none)"
                    if where
                    else ""
                )
                raise ModelCredentialsError(
                    f"model {self._model!r} needs an API key: set the environment variable "
                    f"{' or '.join(missing)} (or pass api_key / api_key_env){keyless}",
                    model=self._model,
                    variable=missing[0],
                )
            self._keys_checked = True
        return {}

    def _call_site(self, litellm: ModuleType) -> CallSite:
        return CallSite(
            model=self._model,
            provider=self._provider,
            api_base=self._base_url(litellm),
            key_variable=self._key_variable(),
            timeout=self._timeout,
            base_source=self._base_source(litellm) or "api_base",
        )

    def _key_variable(self) -> str:
        """The variable a refused key came from, as well as it can be told."""
        if self._api_key is not None:
            return "the api_key passed to LiteLLMClient"
        if self._api_key_env is not None:
            return self._api_key_env
        # The key was set (it was refused), so litellm names no missing one: the usual name.
        return f"{self._provider.upper()}_API_KEY"

    def _messages(self, request: ModelRequest) -> list[dict[str, object]]:
        """The request's messages as this provider is sent them (and counted)."""
        return message_dicts(
            request.messages,
            notes_in_place=self._notes_in_place,
            omit_empty=self._provider == "openai",
        )

    def _call_kwargs(self, litellm: ModuleType, request: ModelRequest) -> dict[str, object]:
        kwargs: dict[str, object] = {
            "model": self._model,
            "messages": self._messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
            "timeout": self._timeout,
            "num_retries": self._num_retries,
        }
        if self._api_base is not None:
            kwargs["api_base"] = self._api_base
        if self._headers:
            kwargs["extra_headers"] = dict(self._headers)
        if request.settings is not None:
            kwargs.update(request.settings.sent())
        if request.tools:
            kwargs["tools"] = [tool_dict(t) for t in request.tools]
            if request.tool_choice != "auto":
                kwargs["tool_choice"] = request.tool_choice
        if request.output_cap() is not None:
            kwargs["max_tokens"] = request.output_cap()
        if request.output is not None and self._asks_for_shape(litellm, request):
            kwargs["response_format"] = request.output.response_format()
        kwargs.update(self._reasoning_kwargs(litellm, request))
        if self._extra_body:
            kwargs["extra_body"] = dict(self._extra_body)
        return kwargs

    def _asks_for_shape(self, litellm: ModuleType, request: ModelRequest) -> bool:
        """Whether this call sends the answer's JSON schema as `response_format`.

        Always when no tool is usable, and on OpenAI-compatible endpoints. Beside usable
        tools only for models litellm knows take a schema natively: for the others it
        forces a JSON tool call, and the agent's own tools could never be called (the
        answer is checked all the same).
        """
        if not request.tools or request.tool_choice == "none" or self._provider == "openai":
            return True
        if self._native_schema is None:  # the model's, asked of litellm's table once
            try:
                self._native_schema = bool(
                    litellm.supports_response_schema(
                        model=self._bare_model, custom_llm_provider=self._provider
                    )
                )
            except Exception:  # noqa: BLE001 - a model litellm does not know: it cannot
                self._native_schema = False
        return self._native_schema

    def _reasoning_kwargs(self, litellm: ModuleType, request: ModelRequest) -> dict[str, object]:
        """`thinking` (exact budget) or `reasoning_effort`, only for reasoning models.

        The budget is kept below `max_output_tokens` when that is set; a provider that
        takes an explicit budget gets nothing when fewer than 1024 tokens remain.
        """
        budget = request.thinking_budget
        cap = request.output_cap()
        if cap is not None:
            budget = min(budget, cap - 1)
        if budget <= 0:
            return {}
        try:
            if not litellm.supports_reasoning(model=self._model):
                return {}
            supported = litellm.get_supported_openai_params(
                model=self._bare_model, custom_llm_provider=self._provider
            )
        except Exception:  # noqa: BLE001 - unknown model facts mean: send no reasoning params
            return {}
        supported_params = set(supported or ())
        if "thinking" in supported_params:
            if budget < _MIN_THINKING_BUDGET:
                return {}
            return {"thinking": {"type": "enabled", "budget_tokens": budget}}
        if "reasoning_effort" in supported_params:
            return {"reasoning_effort": _effort_for(budget)}
        return {}


def _missing_keys(
    litellm: ModuleType, model: str, api_base: str | None, provider: str
) -> list[str]:
    """Key variables the provider needs that are not set, or set to nothing but spaces.

    litellm counts `OPENAI_API_KEY=` as set; the provider would refuse it as no key.
    """
    try:
        report = litellm.validate_environment(model=model, api_base=api_base)
    except Exception:  # noqa: BLE001 - when litellm cannot tell, let the call decide
        return []
    missing = report.get("missing_keys", ()) if isinstance(report, dict) else ()
    named = [k for k in missing if isinstance(k, str) and ("KEY" in k or "TOKEN" in k)]
    usual = f"{provider.upper()}_API_KEY"
    if not named and usual in os.environ and not os.environ[usual].strip():
        named = [usual]
    return named


class ModelEndpoint(BaseModel):
    """A model and where to reach it, as data (an agent bundle, a config file).

    `client()` builds the `LiteLLMClient`. The key is never stored: `api_key_env` names
    the environment variable that holds it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    api_base: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    transport: Transport = "auto"
    """`"litellm"` sends every call through litellm (see `LiteLLMClient`)."""
    context_window: int | None = Field(default=None, gt=0)
    """Input tokens the model accepts, when litellm's catalog does not know it."""

    def client(self) -> LiteLLMClient:
        """The client for this endpoint."""
        return LiteLLMClient(
            self.model,
            api_base=self.api_base,
            api_key_env=self.api_key_env,
            headers=self.headers or None,
            timeout=self.timeout,
            transport=self.transport,
            context_window=self.context_window,
        )


def list_price_of(client: object) -> tuple[float, float] | None:
    """A model client's `(input, output)` USD per token in litellm's price map.

    None when litellm does not price it; only a `LiteLLMClient` is looked up.
    """
    if not isinstance(client, LiteLLMClient):
        return None
    from turnkit.models.catalog import list_price

    listed = list_price(client.model, client.provider)
    return listed if listed != (0.0, 0.0) else None
