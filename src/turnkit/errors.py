"""Every error turnkit raises, each with a stable `code` from one catalog.

```
TurnkitError
 ├─ ConfigurationError        developer mistake; raised at construction, never mid-turn
 │   ├─ DuplicateToolError
 │   └─ UnknownModelError
 ├─ InvalidInputError         bad input to a public call; nothing was written (a ValueError)
 │   ├─ EmptyContentError
 │   ├─ ContentTooLargeError
 │   └─ InvalidSessionIdError
 ├─ NotFoundError
 │   ├─ SessionNotFoundError
 │   ├─ TurnNotFoundError
 │   └─ PauseNotFoundError
 ├─ PauseAnsweredError        the approval or question was answered already
 ├─ ApproverRequiredError     the approval needs a role the caller does not hold
 ├─ RequestConflictError      a request_id reused with different content
 ├─ RuntimeClosedError        the runtime was closed (shutting down); open it again
 ├─ TurnError                 ends a turn with a code → `error` event + terminal state
 │   ├─ ProviderError                 one model call failed (retriable or not)
 │   ├─ FamilyExhaustedError          every rung of the model family failed
 │   ├─ OutputLimitExceededError      the answer hit the provider's output limit
 │   ├─ OutputInvalidError            the answer never matched the agent's `output_type`
 │   ├─ AnswerMissingError            the answer was empty (or only named tools), twice
 │   ├─ ContentFilteredError          the provider's content filter left no answer
 │   ├─ ToolCallError                 truncated/malformed tool call naming no tool
 │   ├─ DeadlineExceededError         idle window or ceiling → `timed_out`
 │   ├─ UserAbortedError              the caller closed the stream or cancelled
 │   ├─ PrefixRewriteError            a hook rewrote bytes an earlier call sent (strict mode)
 │   └─ InternalError                 an unexpected exception inside the turn
 ├─ StoreError
 │   ├─ StaleEpochError       fencing rejection; the driver stops at once
 │   ├─ LeaseLostError        the turn ended under the lease; the driver stops at once
 │   └─ StoreUnavailableError the database cannot be reached (retry later)
 └─ ReplayCursorError         malformed / ahead-of-log cursor
```
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

__all__ = (
    "DOCS_URL",
    "AdmissionRefusedError",
    "AgentNotAllowedError",
    "AnswerMissingError",
    "AttachmentNotIndexedError",
    "BudgetExceededError",
    "BudgetPolicyMissingError",
    "CallbackTokenError",
    "DepartmentUnknownError",
    "ModelNotAllowedError",
    "TurnNotRunningError",
    "ConfigurationError",
    "ContentFilteredError",
    "ContentTooLargeError",
    "DeadlineExceededError",
    "DuplicateToolError",
    "EmptyContentError",
    "AgentNotFoundError",
    "ErrorCode",
    "FamilyExhaustedError",
    "GuardrailBlockedError",
    "InternalError",
    "InvalidInputError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "ModelCredentialsError",
    "ModelUnreachableError",
    "NotFoundError",
    "OutputInvalidError",
    "OutputLimitExceededError",
    "PauseAnsweredError",
    "ApproverRequiredError",
    "AskingTurnEndedError",
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
    "TurnNotFoundError",
    "TurnkitError",
    "UnknownModelError",
    "UserAbortedError",
    "error_codes",
    "missing_extra",
    "typed_message",
)

DOCS_URL = "docs/errors.md"

ErrorCode = Literal[
    "configuration-invalid",
    "duplicate-tool",
    "unknown-model",
    "invalid-input",
    "empty-content",
    "content-too-large",
    "invalid-session-id",
    "not-found",
    "session-not-found",
    "turn-not-found",
    "agent-not-found",
    "pause-not-found",
    "pause-already-answered",
    "approver-required",
    "request-id-reused",
    "tool-denied",
    "provider-error",
    "model-credentials",
    "model-unreachable",
    "family-exhausted",
    "agent_output_limit_exceeded",
    "output-invalid",
    "answer-missing",
    "content-filtered",
    "tool-call-malformed",
    "tool-arguments-invalid",
    "tool-not-found",
    "tool-failed",
    "deadline-exceeded",
    "user-aborted",
    "prefix-rewritten",
    "plugin-failed",
    "guardrail-blocked",
    "internal-error",
    "store-error",
    "stale-epoch",
    "lease-lost",
    "store-unavailable",
    "replay-cursor-invalid",
    "unauthenticated",
    "forbidden",
    "method-not-allowed",
    "not-ready",
    "admission-refused",
    "department-unknown",
    "agent-not-allowed",
    "model-not-allowed",
    "budget-policy-missing",
    "budget-exceeded",
    "attachment-not-indexed",
    "callback-token-invalid",
    "turn-not-running",
    "runtime-closed",
    "host-not-allowed",
    "cross-origin-request",
    "asking-turn-ended",
]
"""The one catalog of error codes. Codes never change meaning once published."""


def error_codes() -> tuple[str, ...]:
    """All codes of the catalog, in catalog order."""
    return get_args(ErrorCode)


def typed_message(exc: BaseException, message: str | None = None) -> str:
    """`Type: message`, or the type alone when there are no words (`TimeoutError`).

    `message` replaces the exception's own words when given.
    """
    words = str(exc) if message is None else message
    return f"{type(exc).__name__}: {words}" if words else type(exc).__name__


def missing_extra(feature: str, extra: str, cause: ImportError) -> ModuleNotFoundError:
    """What an adapter raises when the optional extra it needs is not installed."""
    return ModuleNotFoundError(
        f'{feature} cannot run without the "{extra}" extra: pip install "turnkit[{extra}]"',
        name=cause.name,
    )


class TurnkitError(Exception):
    """Root of every turnkit error. `code` is stable; `message` says what to do next."""

    code: ClassVar[ErrorCode] = "internal-error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details
        for key, value in details.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.details))

    def __str__(self) -> str:
        return f"{self.message} [{self.code}; see {DOCS_URL}#{self.code}]"


def _rebuild(cls: type[TurnkitError], message: str, details: dict[str, Any]) -> TurnkitError:
    # Not `cls(message, **details)`: a subclass's own `__init__` may take other arguments
    # than the details it keeps (ModelCredentialsError keeps `is_retriable`).
    error = cls.__new__(cls)
    TurnkitError.__init__(error, message, **details)
    return error


class ConfigurationError(TurnkitError):
    """A developer mistake found at construction or registration time."""

    code: ClassVar[ErrorCode] = "configuration-invalid"


class DuplicateToolError(ConfigurationError):
    """Two tools of one agent share a name."""

    code: ClassVar[ErrorCode] = "duplicate-tool"


class InvalidInputError(TurnkitError, ValueError):
    """Bad input to a public call; nothing was written.

    Also a `ValueError`: a message part built wrong inside a model pydantic validates
    becomes a line of that model's `ValidationError`, as any bad value does.
    """

    code: ClassVar[ErrorCode] = "invalid-input"


class EmptyContentError(InvalidInputError):
    """A message with no content (empty or only white space)."""

    code: ClassVar[ErrorCode] = "empty-content"


class ContentTooLargeError(InvalidInputError):
    """A message longer than the configured bound."""

    code: ClassVar[ErrorCode] = "content-too-large"
    chars: int
    """How long the message is (characters; bytes for a picture)."""
    limit: int
    """The bound it crossed."""


class InvalidSessionIdError(InvalidInputError):
    """A session id that does not have the session id format."""

    code: ClassVar[ErrorCode] = "invalid-session-id"


class NotFoundError(TurnkitError):
    """Something asked for does not exist (or is not visible to the caller)."""

    code: ClassVar[ErrorCode] = "not-found"


class SessionNotFoundError(NotFoundError):
    """No such session."""

    code: ClassVar[ErrorCode] = "session-not-found"


class TurnNotFoundError(NotFoundError):
    """No such turn."""

    code: ClassVar[ErrorCode] = "turn-not-found"


class PauseNotFoundError(NotFoundError):
    """No such approval or clarification request on this turn."""

    code: ClassVar[ErrorCode] = "pause-not-found"


class AdmissionRefusedError(TurnkitError):
    """A check at turn start refused the message; nothing was written.

    Apps raise it (or a subclass) from their own admission checks.
    """

    code: ClassVar[ErrorCode] = "admission-refused"


class DepartmentUnknownError(AdmissionRefusedError):
    """The caller's organisation or department is not configured."""

    code: ClassVar[ErrorCode] = "department-unknown"


class AgentNotAllowedError(AdmissionRefusedError):
    """The organisation pins its default agent and the caller (not an admin) asked for another."""

    code: ClassVar[ErrorCode] = "agent-not-allowed"


class ModelNotAllowedError(AdmissionRefusedError):
    """The model is not served here, is blocked for the department, or would widen the agent's."""

    code: ClassVar[ErrorCode] = "model-not-allowed"


class BudgetPolicyMissingError(AdmissionRefusedError):
    """Budgets are enforced and no limit covers the caller: refused (budgets fail closed)."""

    code: ClassVar[ErrorCode] = "budget-policy-missing"


class BudgetExceededError(AdmissionRefusedError):
    """A budget covering the caller has no room left this period."""

    code: ClassVar[ErrorCode] = "budget-exceeded"
    scope: Literal["organisation", "department", "principal", "session"]
    """The scope of the limit with no room left."""
    key: str
    """The scope's member the limit covers (a department, a principal id, a session id)."""


class AttachmentNotIndexedError(AdmissionRefusedError):
    """An attached document has no indexed copy (one still being read is fine)."""

    code: ClassVar[ErrorCode] = "attachment-not-indexed"
    document: str
    """The attached document with no indexed copy."""


class CallbackTokenError(TurnkitError):
    """A callback's token does not match its turn."""

    code: ClassVar[ErrorCode] = "callback-token-invalid"


class TurnNotRunningError(TurnkitError):
    """A callback reached a turn that is not running (finished, paused or cancelled)."""

    code: ClassVar[ErrorCode] = "turn-not-running"


class AskingTurnEndedError(TurnNotRunningError):
    """An agent was to be asked as a tool by a turn that has ended; nothing was written.

    The asking turn's driver went on after its turn ended elsewhere (a Stop, the sweep,
    its lease lost), or after a Stop from another process flagged it (`stop_pending`),
    before the Stop reached it: nobody would read the asked agent's answer.
    """

    code: ClassVar[ErrorCode] = "asking-turn-ended"
    turn_id: str
    """The asking turn."""
    stop_pending: bool
    """Whether a Stop flagged it that has not reached its driver yet."""


class PauseAnsweredError(TurnkitError):
    """The approval or clarification request was answered already; nothing changed."""

    code: ClassVar[ErrorCode] = "pause-already-answered"


class ApproverRequiredError(TurnkitError):
    """The approval needs a role (`approver_role`) the caller does not hold; nothing changed."""

    code: ClassVar[ErrorCode] = "approver-required"
    role: str
    """The role that answers the approval."""


class RequestConflictError(TurnkitError):
    """A `request_id` the session already used, sent again with different content."""

    code: ClassVar[ErrorCode] = "request-id-reused"


class TurnError(TurnkitError):
    """An error that ends a turn; it becomes an `error` event and a terminal state."""

    code: ClassVar[ErrorCode] = "internal-error"


class UnknownModelError(ConfigurationError, TurnError):
    """A model string no provider resolves.

    Refused where it is given; inside a turn (a model only the process that admitted the
    message serves, driven by one that does not) it ends the turn `failed`.
    """

    code: ClassVar[ErrorCode] = "unknown-model"


class AgentNotFoundError(NotFoundError, TurnError):
    """No agent of that name (or, for a pinned turn, of that version) on this host.

    At submit it refuses the message (nothing written); for a turn pinned to an agent
    that has since gone, it ends the turn — never silently with another agent.
    """

    code: ClassVar[ErrorCode] = "agent-not-found"
    agent: str
    """The agent's name."""
    version: str | None = None
    """The version a pinned turn needs (None: no agent of that name at all)."""


class PluginFailedError(TurnError):
    """A plugin marked `required` raised in one of its hooks."""

    code: ClassVar[ErrorCode] = "plugin-failed"
    plugin: str
    """The plugin's name."""
    hook: str
    """The hook that raised."""


class GuardrailBlockedError(TurnError):
    """A guardrail blocked the user's message, a tool result or the answer."""

    code: ClassVar[ErrorCode] = "guardrail-blocked"
    plugin: str
    """The guardrail plugin's name."""
    checkpoint: Literal["input", "tool_result", "answer"]
    """What it checked."""
    kind: str
    """What it found (the verdict's `kind`)."""


class ProviderError(TurnError):
    """One model call failed. `is_retriable` decides whether a family walks on."""

    code: ClassVar[ErrorCode] = "provider-error"
    status_code: int | None
    is_retriable: bool
    retry_after_s: float | None = None
    """Seconds the provider asked to wait before the next call (its `Retry-After`)."""
    brief: str | None = None
    """What went wrong without the model's name or advice, for a summary of several rungs
    (`HTTP 503: the provider had a server error`); None to use `message`."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        is_retriable: bool = False,
        retry_after_s: float | None = None,
        brief: str | None = None,
    ) -> None:
        wait = {} if retry_after_s is None else {"retry_after_s": retry_after_s}
        super().__init__(message, status_code=status_code, is_retriable=is_retriable, **wait)
        self.brief = brief


class ModelCredentialsError(ProviderError):
    """The provider key is missing or refused: a configuration error, never retried.

    `variable` names the environment variable to set (or the setting that supplied it).
    """

    code: ClassVar[ErrorCode] = "model-credentials"
    model: str
    variable: str

    def __init__(
        self, message: str, *, model: str, variable: str, status_code: int | None = None
    ) -> None:
        TurnError.__init__(
            self,
            message,
            model=model,
            variable=variable,
            status_code=status_code,
            is_retriable=False,
        )


class ModelUnreachableError(ProviderError):
    """Nothing answers at the model's address (connection refused): not retried on its rung.

    A family walks on past it to the next rung (with the default predicate).
    """

    code: ClassVar[ErrorCode] = "model-unreachable"
    model: str
    address: str

    def __init__(self, message: str, *, model: str, address: str) -> None:
        TurnError.__init__(
            self, message, model=model, address=address, status_code=None, is_retriable=False
        )


class FamilyExhaustedError(TurnError):
    """Every rung of the model family failed; the turn never widens to another family."""

    code: ClassVar[ErrorCode] = "family-exhausted"
    family: str
    """The family's name."""
    attempts: tuple[str, ...]
    """The model of each rung tried, in order."""
    retry_after_s: float | None = None
    """The shortest wait every rung asked for (None: not every rung asked)."""


class OutputLimitExceededError(TurnError):
    """The provider's output limit cut the answer, or a response that named no tool."""

    code: ClassVar[ErrorCode] = "agent_output_limit_exceeded"


class OutputInvalidError(TurnError):
    """The answer did not match the agent's `output_type`, nor did any answer asked again."""

    code: ClassVar[ErrorCode] = "output-invalid"
    problems: list[str]
    """What was wrong with the last answer."""


class AnswerMissingError(TurnError):
    """The model's answer had no text (empty, or only tools it could not call), twice."""

    code: ClassVar[ErrorCode] = "answer-missing"


class ContentFilteredError(TurnError):
    """The provider's content filter stopped the answer before any text, or the model refused.

    The words of a refusal (OpenAI's `refusal`) are in `refusal` and the message, never an
    answer.
    """

    code: ClassVar[ErrorCode] = "content-filtered"
    stop_reason: str
    refusal: str | None = None
    """The words the model declined with, when they reached turnkit (None: none did)."""


class ToolCallError(TurnError):
    """A truncated or malformed tool call that names no tool: fatal to the turn."""

    code: ClassVar[ErrorCode] = "tool-call-malformed"


class DeadlineExceededError(TurnError):
    """The idle window or the ceiling passed; the turn is `timed_out`."""

    code: ClassVar[ErrorCode] = "deadline-exceeded"


class UserAbortedError(TurnError):
    """The caller closed the stream or triggered the cancel token."""

    code: ClassVar[ErrorCode] = "user-aborted"


class PrefixRewriteError(TurnError):
    """A model request rewrote bytes an earlier request sent.

    Compaction and picture release are the only rewrites allowed. Raised only when the
    prefix check is strict (tests); in production the break is logged and audited and
    the turn goes on.
    """

    code: ClassVar[ErrorCode] = "prefix-rewritten"


class InternalError(TurnError):
    """An unexpected exception inside the turn (a bug in a tool, plugin or turnkit)."""

    code: ClassVar[ErrorCode] = "internal-error"


class StoreError(TurnkitError):
    """The Store refused or failed a write."""

    code: ClassVar[ErrorCode] = "store-error"


class StaleEpochError(StoreError):
    """A commit carried a fencing token older than the turn's current lease."""

    code: ClassVar[ErrorCode] = "stale-epoch"


class LeaseLostError(StoreError):
    """The lease's turn ended (cancelled, timed out) under it.

    Nobody else holds the turn, but there is nothing left to drive.
    """

    code: ClassVar[ErrorCode] = "lease-lost"


class StoreUnavailableError(StoreError):
    """The database cannot be reached right now; nothing was written. Retry later."""

    code: ClassVar[ErrorCode] = "store-unavailable"


class RuntimeClosedError(TurnkitError):
    """The runtime was closed (its app is shutting down); the call did nothing.

    A stream of `execute_message` raises it too when its turn was still running as the
    runtime closed: the turn was handed over, not stopped (`turn_id`, `last_seq`). It
    opens again only on purpose (`async with runtime:` or `await runtime.open()`).
    """

    code: ClassVar[ErrorCode] = "runtime-closed"


class ReplayCursorError(TurnkitError):
    """A replay cursor that is malformed or ahead of anything written."""

    code: ClassVar[ErrorCode] = "replay-cursor-invalid"
