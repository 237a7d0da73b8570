"""The row a submitted message becomes: its turn pinned to everything a driver rebuilds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkit.agent import Agent
from turnkit.config import RuntimeConfig
from turnkit.ids import TurnId, new_turn_id
from turnkit.models import ModelSettings
from turnkit.models.family import ModelFamily
from turnkit.runtime._runner import Pinned, pinned_config
from turnkit.runtime._validate import TurnRequest
from turnkit.runtime.admission import Admitted
from turnkit.stages._titles import opening_title
from turnkit.store import ClaimRequest, Delivery, NewInput

__all__ = ("new_input",)


def new_input(
    request: TurnRequest,
    admitted: Admitted,
    *,
    turn_agent: Agent,
    family: ModelFamily,
    settings: ModelSettings | None,
    tools: Sequence[str],
    delivery: Delivery,
    config: RuntimeConfig,
    claim_for: str | None,
    anonymous: bool = False,
    asked_by: TurnId | None = None,
) -> NewInput:
    """The message, its new turn and what the turn is pinned to, ready to commit.

    `admitted.model` and `settings` are the message's overrides of the agent's;
    `claim_for` names the owner that claims the turn in the same transaction;
    `asked_by` the turn whose agent asks this one's as a tool.
    """
    effort = request.effort or turn_agent.effort
    overrides: dict[str, Any] = {}
    if admitted.model is not None:
        overrides["model"] = admitted.model
    if settings is not None:
        overrides["settings"] = settings.model_dump(exclude_none=True, mode="json")
    principal = admitted.principal.id if admitted.principal else None
    pinned = pinned_config(
        turn_agent,
        family,
        effort,
        version=admitted.agent.version,
        overrides=overrides,
        tools=tools,
        principal=principal,
        trace=Pinned.new_trace(session_id=request.session_id, agent=turn_agent.name),
    )
    if admitted.documents:
        pinned["documents"] = list(admitted.documents)
    return NewInput(
        session_id=request.session_id,
        turn_id=new_turn_id(),
        content=request.content,
        attachments=request.attachments,
        request_id=request.request_id,
        delivery=delivery,
        agent=turn_agent.name,
        model=family.name,
        effort=effort,
        pinned=pinned | admitted.subject_fields,
        principal=principal,
        organisation=admitted.organisation.name,
        department=admitted.department.name,
        create_session=config.auto_create_sessions,
        # The first of two names: read off the opening message (only an unnamed session
        # takes it); the turn's utility model may improve it.
        title=opening_title(request.content),
        anonymous_caller=anonymous,
        asked_by=asked_by,
        claim_for=ClaimRequest(
            owner=claim_for, ttl_s=config.lease_ttl_s, max_attempts=config.max_attempts
        )
        if claim_for is not None
        else None,
    )
