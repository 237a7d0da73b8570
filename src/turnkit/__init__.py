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
    AgentNotFoundError,
    BudgetExceededError,
    ConfigurationError,
    ContentTooLargeError,
    DeadlineExceededError,
    DuplicateToolError,
    EmptyContentError,
    FamilyExhaustedError,
    InternalError,
    InvalidInputError,
    InvalidSessionIdError,
    ModelCredentialsError,
    ModelUnreachableError,
    NotFoundError,
    OutputLimitExceededError,
    PauseAnsweredError,
    PauseNotFoundError,
    PrefixRewriteError,
    ProviderError,
    ReplayCursorError,
    SessionNotFoundError,
    StaleEpochError,
    StoreError,
    ToolCallError,
    TurnError,
    TurnkitError,
    TurnNotFoundError,
    UnknownModelError,
    UserAbortedError,
)
from turnkit.events import DurableEvent, EphemeralEvent, StreamEvent
from turnkit.models import ModelSettings
from turnkit.models.family import ModelFamily
from turnkit.models.litellm import LiteLLMClient, ModelEndpoint
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
    "AgentData",
    "AgentNotFoundError",
    "Answer",
    "Approve",
    "BudgetExceededError",
    "BudgetLimit",
    "CancelToken",
    "ConfigurationError",
    "ContentTooLargeError",
    "DeadlineExceededError",
    "Deny",
    "Department",
    "DepsScope",
    "DuplicateToolError",
    "DurableEvent",
    "Effort",
    "EmptyContentError",
    "EphemeralEvent",
    "FamilyExhaustedError",
    "ImagePart",
    "InternalError",
    "InvalidInputError",
    "InvalidSessionIdError",
    "LiteLLMClient",
    "ModelCredentialsError",
    "ModelEndpoint",
    "ModelFamily",
    "ModelSettings",
    "ModelUnreachableError",
    "NotFoundError",
    "Organisation",
    "OutputLimitExceededError",
    "PauseAnsweredError",
    "PauseNotFoundError",
    "PrefixRewriteError",
    "Principal",
    "ProviderError",
    "ReplayCursorError",
    "RuntimeConfig",
    "SessionNotFoundError",
    "SessionRuntime",
    "StaleEpochError",
    "StoreError",
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
    "TurnkitError",
    "UnknownModelError",
    "UserAbortedError",
    "tool",
)

__version__ = "0.1.0"
