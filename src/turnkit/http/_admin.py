"""Routes beside the chat ones: budget limits (admins) and callbacks (turn tokens)."""

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Response
from pydantic import ValidationError

from turnkit.budgets import BudgetLimit, BudgetUse
from turnkit.errors import AdmissionRefusedError, InvalidInputError
from turnkit.http.models import (
    BudgetLimitBody,
    BudgetListOut,
    BudgetOut,
    CallbackBody,
    CallbackOut,
)
from turnkit.runtime import SessionRuntime
from turnkit.tenancy import Principal

__all__ = ("CALLBACK_TOKEN_HEADER", "add_budget_routes", "add_callback_routes", "require_admin")

CALLBACK_TOKEN_HEADER = "X-Turnkit-Callback-Token"


def require_admin(caller: Principal | None) -> Principal:
    """The caller, when it holds the `admin` role (else a 403 `admission-refused`)."""
    if caller is None or not caller.is_admin:
        raise AdmissionRefusedError("this needs the admin role of your organisation")
    return caller


def _out(use: BudgetUse) -> BudgetOut:
    limit = use.limit
    return BudgetOut(
        scope=limit.scope,
        organisation=limit.organisation,
        key=limit.key,
        period=limit.period,
        usd=limit.usd,
        tokens=limit.tokens,
        spent_usd=use.spent_usd,
        spent_tokens=use.spent_tokens,
        reserved_usd=use.reserved_usd,
        reserved_tokens=use.reserved_tokens,
    )


def add_budget_routes(
    router: APIRouter,
    runtime: SessionRuntime,
    who: Callable[..., Awaitable[Principal | None]],
) -> None:
    """`GET`/`PUT /budgets` and `DELETE /budgets/{scope}/{period}` for the caller's org."""
    Admin = Annotated[Principal | None, Depends(who)]

    async def listing(organisation: str, resumed: list[str] | None = None) -> BudgetListOut:
        uses = await runtime.store.budget_report(organisation)
        return BudgetListOut(budgets=[_out(u) for u in uses], resumed=resumed or [])

    @router.get("/budgets", response_model=BudgetListOut, summary="Budget limits and use")
    async def budgets(caller: Admin) -> BudgetListOut:
        return await listing(require_admin(caller).organisation)

    @router.put("/budgets", response_model=BudgetListOut, summary="Set a budget limit")
    async def set_budget(body: BudgetLimitBody, caller: Admin) -> BudgetListOut:
        organisation = require_admin(caller).organisation
        try:
            limit = BudgetLimit(organisation=organisation, **body.model_dump())
        except ValidationError as exc:  # its findings, without pydantic's links
            found = "; ".join(
                e["msg"].removeprefix("Value error, ") for e in exc.errors(include_url=False)
            )
            raise InvalidInputError(f"a bad budget limit: {found}") from exc
        return await listing(organisation, await runtime.set_budget_limit(limit))

    @router.delete("/budgets/{scope}/{period}", status_code=204, summary="Remove a limit")
    async def delete_budget(
        scope: Literal["organisation", "department", "principal", "session"],
        period: Literal["day", "month", "total"],
        caller: Admin,
        key: str = "",
    ) -> Response:
        organisation = require_admin(caller).organisation
        await runtime.delete_budget_limit(scope, organisation=organisation, key=key, period=period)
        return Response(status_code=204)


def add_callback_routes(router: APIRouter, runtime: SessionRuntime) -> None:
    """`POST /turns/{turn_id}/callback`: authenticated by the turn's token, not by `auth`."""

    @router.post(
        "/turns/{turn_id}/callback",
        response_model=CallbackOut,
        status_code=202,
        summary="Report a job's progress to its running turn (turn-token auth)",
    )
    async def callback(
        turn_id: str,
        body: CallbackBody,
        token: Annotated[str, Header(alias=CALLBACK_TOKEN_HEADER, max_length=256)] = "",
    ) -> CallbackOut:
        scope = await runtime.report_job_progress(
            turn_id,
            token,
            job_id=body.job_id,
            tool_call_id=body.tool_call_id,
            progress=body.progress,
            message=body.message,
        )
        return CallbackOut(
            turn_id=scope.turn_id,
            session_id=scope.session_id,
            principal=scope.principal.id if scope.principal else None,
            organisation=scope.organisation,
            department=scope.department,
        )
