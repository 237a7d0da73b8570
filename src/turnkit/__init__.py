"""turnkit: LLM agent turns that survive refreshes, crashes and restarts.

The quickstart surface is re-exported here; everything else lives in its concept module
(`turnkit.events`, `turnkit.audit`, `turnkit.errors`, `turnkit.models`, `turnkit.tools`, …).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnkit.agent import Agent, Effort
    from turnkit.blocks import ImagePart, TextPart
    from turnkit.budgets import BudgetLimit
    from turnkit.config import RuntimeConfig
    from turnkit.errors import (
        AdmissionRefusedError,
        AgentNotAllowedError,
        AgentNotFoundError,
        AnswerMissingError,
        ApproverRequiredError,
        AttachmentNotIndexedError,
        BudgetExceededError,
        BudgetPolicyMissingError,
        CallbackTokenError,
        ConfigurationError,
        ContentFilteredError,
        ContentTooLargeError,
        DeadlineExceededError,
        DepartmentUnknownError,
        DuplicateToolError,
        EmptyContentError,
        FamilyExhaustedError,
        GuardrailBlockedError,
        InternalError,
        InvalidInputError,
        InvalidSessionIdError,
        ModelCredentialsError,
        ModelNotAllowedError,
        ModelUnreachableError,
        NotFoundError,
        OutputInvalidError,
        OutputLimitExceededError,
        PauseAnsweredError,
        PauseNotFoundError,
        PluginFailedError,
        PrefixRewriteError,
        ProviderError,
        ReplayCursorError,
        RequestConflictError,
        RuntimeClosedError,
        SessionNotFoundError,
        StaleEpochError,
        StoreError,
        StoreUnavailableError,
        ToolCallError,
        TurnError,
        TurnkitError,
        TurnNotFoundError,
        TurnNotRunningError,
        UnknownModelError,
        UserAbortedError,
    )
    from turnkit.events import DurableEvent, EphemeralEvent, StreamEvent
    from turnkit.models import ModelSettings
    from turnkit.models.family import ModelFamily
    from turnkit.models.litellm import LiteLLMClient, ModelEndpoint
    from turnkit.output import AnswerContext
    from turnkit.pauses import Answer, Approve, Deny
    from turnkit.runtime import CancelToken, SessionRuntime, TurnHistory
    from turnkit.runtime.admission import AdmissionCheck, AdmissionRequest
    from turnkit.runtime.agents import AgentCatalog, AgentData, ToolAccessRequest
    from turnkit.runtime.deps import DepsScope
    from turnkit.tenancy import Department, Organisation, Principal, Tenancy
    from turnkit.tools import ToolClass, ToolContext, tool

__all__ = (
    "AdmissionCheck",
    "AdmissionRefusedError",
    "AdmissionRequest",
    "Agent",
    "AgentCatalog",
    "AnswerContext",
    "AgentData",
    "AgentNotAllowedError",
    "AgentNotFoundError",
    "ApproverRequiredError",
    "Answer",
    "AnswerMissingError",
    "Approve",
    "AttachmentNotIndexedError",
    "BudgetExceededError",
    "BudgetLimit",
    "BudgetPolicyMissingError",
    "CallbackTokenError",
    "CancelToken",
    "ConfigurationError",
    "ContentFilteredError",
    "ContentTooLargeError",
    "DeadlineExceededError",
    "Deny",
    "Department",
    "DepartmentUnknownError",
    "DepsScope",
    "DuplicateToolError",
    "DurableEvent",
    "Effort",
    "EmptyContentError",
    "EphemeralEvent",
    "FamilyExhaustedError",
    "GuardrailBlockedError",
    "ImagePart",
    "InternalError",
    "InvalidInputError",
    "InvalidSessionIdError",
    "LiteLLMClient",
    "ModelCredentialsError",
    "ModelEndpoint",
    "ModelFamily",
    "ModelNotAllowedError",
    "ModelSettings",
    "ModelUnreachableError",
    "NotFoundError",
    "Organisation",
    "OutputInvalidError",
    "OutputLimitExceededError",
    "PauseAnsweredError",
    "PauseNotFoundError",
    "PluginFailedError",
    "PrefixRewriteError",
    "Principal",
    "ProviderError",
    "ReplayCursorError",
    "RequestConflictError",
    "RuntimeClosedError",
    "RuntimeConfig",
    "SessionNotFoundError",
    "SessionRuntime",
    "StaleEpochError",
    "StoreError",
    "StoreUnavailableError",
    "StreamEvent",
    "Tenancy",
    "TextPart",
    "ToolAccessRequest",
    "ToolCallError",
    "ToolClass",
    "ToolContext",
    "TurnError",
    "TurnHistory",
    "TurnNotFoundError",
    "TurnNotRunningError",
    "TurnkitError",
    "UnknownModelError",
    "UserAbortedError",
    "tool",
)

__version__ = "0.1.0"

_HOMES: dict[str, tuple[str, ...]] = {
    "turnkit.agent": ("Agent", "Effort"),
    "turnkit.blocks": ("ImagePart", "TextPart"),
    "turnkit.budgets": ("BudgetLimit",),
    "turnkit.config": ("RuntimeConfig",),
    "turnkit.errors": (
        "AdmissionRefusedError",
        "AgentNotAllowedError",
        "AgentNotFoundError",
        "AnswerMissingError",
        "ApproverRequiredError",
        "AttachmentNotIndexedError",
        "BudgetExceededError",
        "BudgetPolicyMissingError",
        "CallbackTokenError",
        "ConfigurationError",
        "ContentFilteredError",
        "ContentTooLargeError",
        "DeadlineExceededError",
        "DepartmentUnknownError",
        "DuplicateToolError",
        "EmptyContentError",
        "FamilyExhaustedError",
        "GuardrailBlockedError",
        "InternalError",
        "InvalidInputError",
        "InvalidSessionIdError",
        "ModelCredentialsError",
        "ModelNotAllowedError",
        "ModelUnreachableError",
        "NotFoundError",
        "OutputInvalidError",
        "OutputLimitExceededError",
        "PauseAnsweredError",
        "PauseNotFoundError",
        "PluginFailedError",
        "PrefixRewriteError",
        "ProviderError",
        "ReplayCursorError",
        "RequestConflictError",
        "RuntimeClosedError",
        "SessionNotFoundError",
        "StaleEpochError",
        "StoreError",
        "StoreUnavailableError",
        "ToolCallError",
        "TurnError",
        "TurnkitError",
        "TurnNotFoundError",
        "TurnNotRunningError",
        "UnknownModelError",
        "UserAbortedError",
    ),
    "turnkit.events": ("DurableEvent", "EphemeralEvent", "StreamEvent"),
    "turnkit.models": ("ModelSettings",),
    "turnkit.models.family": ("ModelFamily",),
    "turnkit.models.litellm": ("LiteLLMClient", "ModelEndpoint"),
    "turnkit.output": ("AnswerContext",),
    "turnkit.pauses": ("Answer", "Approve", "Deny"),
    "turnkit.runtime": ("CancelToken", "SessionRuntime", "TurnHistory"),
    "turnkit.runtime.admission": ("AdmissionCheck", "AdmissionRequest"),
    "turnkit.runtime.agents": ("AgentCatalog", "AgentData", "ToolAccessRequest"),
    "turnkit.runtime.deps": ("DepsScope",),
    "turnkit.tenancy": ("Department", "Organisation", "Principal", "Tenancy"),
    "turnkit.tools": ("ToolClass", "ToolContext", "tool"),
}
"""The module each name of `__all__` comes from.

A name is imported when it is first used, not with the package: `turnkit.errors` or
`turnkit.ids` alone do not load the runtime, and Ctrl-C while `python -m turnkit` loads
is the command's (status 130, no traceback), as for the installed `turnkit` script.
"""
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        if not name.startswith("_"):  # `import turnkit` then `turnkit.errors.…`, as before
            try:
                return importlib.import_module(f"turnkit.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"turnkit.{name}":
                    raise  # a module of ours that needs something not installed
        raise AttributeError(f"module 'turnkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
