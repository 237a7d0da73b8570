"""turnkit: LLM agent turns that survive refreshes, crashes and restarts.

The quickstart surface is re-exported here; everything else lives in its concept module
(`turnkit.events`, `turnkit.audit`, `turnkit.errors`, `turnkit.models`, `turnkit.tools`, …).
"""

from turnkit.agent import Agent, Effort
from turnkit.blocks import ImagePart, TextPart
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    ConfigurationError,
    ContentTooLargeError,
    DeadlineExceededError,
    DuplicateToolError,
    EmptyContentError,
    FamilyExhaustedError,
    InternalError,
    InvalidInputError,
    InvalidSessionIdError,
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
from turnkit.models.family import ModelFamily
from turnkit.pauses import Answer, Approve, Deny
from turnkit.runtime import CancelToken, SessionRuntime, TurnHistory
from turnkit.tools import ToolClass, ToolContext, tool

__all__ = (
    "Agent",
    "Answer",
    "Approve",
    "CancelToken",
    "ConfigurationError",
    "ContentTooLargeError",
    "DeadlineExceededError",
    "Deny",
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
    "ModelFamily",
    "NotFoundError",
    "OutputLimitExceededError",
    "PauseAnsweredError",
    "PauseNotFoundError",
    "PrefixRewriteError",
    "ProviderError",
    "ReplayCursorError",
    "RuntimeConfig",
    "SessionNotFoundError",
    "SessionRuntime",
    "StaleEpochError",
    "StoreError",
    "StreamEvent",
    "TextPart",
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
