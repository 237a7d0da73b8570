"""turnkit: LLM agent turns that survive refreshes, crashes and restarts.

The quickstart surface is re-exported here; everything else lives in its concept module
(`turnkit.events`, `turnkit.audit`, `turnkit.errors`, `turnkit.models`, `turnkit.tools`, …).
"""

from turnkit.agent import Agent, Effort
from turnkit.blocks import ImagePart, TextPart
from turnkit.budgets import BudgetLimit
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    AdmissionRefusedError,
    AgentNotAllowedError,
    AgentNotFoundError,
    ApproverRequiredError,
    AttachmentNotIndexedError,
    BudgetExceededError,
    BudgetPolicyMissingError,
    CallbackTokenError,
    ConfigurationError,
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
from turnkit.runtime.admission import AdmissionCheck
from turnkit.runtime.agents import AgentCatalog, AgentData, ToolAccessRequest
from turnkit.runtime.deps import DepsScope
from turnkit.tenancy import Department, Organisation, Principal, Tenancy
from turnkit.tools import ToolClass, ToolContext, tool

__all__ = (
    "AdmissionCheck",
    "AdmissionRefusedError",
    "Agent",
    "AgentCatalog",
    "AnswerContext",
    "AgentData",
    "AgentNotAllowedError",
    "AgentNotFoundError",
    "ApproverRequiredError",
    "Answer",
    "Approve",
    "AttachmentNotIndexedError",
    "BudgetExceededError",
    "BudgetLimit",
    "BudgetPolicyMissingError",
    "CallbackTokenError",
    "CancelToken",
    "ConfigurationError",
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
