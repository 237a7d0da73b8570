"""Typed errors and the attributes docs/errors.md documents (type-checked, never run)."""

from __future__ import annotations

from typing import Literal, assert_type

from turnkit import (
    AgentNotFoundError,
    ApproverRequiredError,
    AttachmentNotIndexedError,
    BudgetExceededError,
    ContentFilteredError,
    ContentTooLargeError,
    FamilyExhaustedError,
    GuardrailBlockedError,
    ModelCredentialsError,
    ModelUnreachableError,
    OutputInvalidError,
    PluginFailedError,
    ProviderError,
    SessionRuntime,
    TurnkitError,
)
from turnkit.errors import AskingTurnEndedError, ErrorCode


async def send(runtime: SessionRuntime) -> None:  # noqa: C901 - one branch per error
    try:
        async for _ in runtime.execute_message("s1", "hello"):
            pass
    except ContentTooLargeError as exc:
        assert_type(exc.chars, int)
        assert_type(exc.limit, int)
        print(exc.lmit)  # type: ignore[attr-defined]  # a typo is caught, not an Any
    except BudgetExceededError as exc:
        assert_type(exc.scope, Literal["organisation", "department", "principal", "session"])
        assert_type(exc.key, str)
    except AttachmentNotIndexedError as exc:
        assert_type(exc.document, str)
    except ApproverRequiredError as exc:
        assert_type(exc.role, str)
    except AgentNotFoundError as exc:
        assert_type(exc.agent, str)
        assert_type(exc.version, str | None)
    except ModelCredentialsError as exc:
        assert_type(exc.model, str)
        assert_type(exc.variable, str)
    except ModelUnreachableError as exc:
        assert_type(exc.model, str)
        assert_type(exc.address, str)
    except ProviderError as exc:
        assert_type(exc.status_code, int | None)
        assert_type(exc.is_retriable, bool)
        assert_type(exc.retry_after_s, float | None)
    except FamilyExhaustedError as exc:
        assert_type(exc.family, str)
        assert_type(exc.attempts, tuple[str, ...])
        assert_type(exc.retry_after_s, float | None)
    except PluginFailedError as exc:
        assert_type(exc.plugin, str)
        assert_type(exc.hook, str)
    except GuardrailBlockedError as exc:
        assert_type(exc.plugin, str)
        assert_type(exc.checkpoint, Literal["input", "tool_result", "answer"])
        assert_type(exc.kind, str)
    except OutputInvalidError as exc:
        assert_type(exc.problems, list[str])
    except ContentFilteredError as exc:
        assert_type(exc.stop_reason, str)
        assert_type(exc.refusal, str | None)
    except AskingTurnEndedError as exc:
        assert_type(exc.turn_id, str)
        assert_type(exc.stop_pending, bool)
    except TurnkitError as exc:
        assert_type(exc.code, ErrorCode)
        assert_type(exc.message, str)
