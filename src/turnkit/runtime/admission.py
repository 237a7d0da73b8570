"""Turn start: the admission chain every message passes before anything is saved.

Five checks run in order — department, agent visibility, model, budget policy,
attachments — and the first that fails stops the message with a stable error code. Apps
add their own checks at a declared position. The HTTP routes, `start`, `execute_message`
and any app share the chain because it runs inside `SessionRuntime.submit`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from turnkit.agent import Agent
from turnkit.budgets import BudgetSubject, BudgetUse
from turnkit.config import RuntimeConfig
from turnkit.errors import (
    AgentNotAllowedError,
    AgentNotFoundError,
    AttachmentNotIndexedError,
    BudgetExceededError,
    BudgetPolicyMissingError,
    ConfigurationError,
    DepartmentUnknownError,
    InvalidInputError,
    ModelNotAllowedError,
)
from turnkit.models.family import ModelFamily
from turnkit.runtime.agents import AgentCatalog
from turnkit.store import Store
from turnkit.tenancy import DEFAULT_ORGANISATION, Department, Organisation, Principal, Tenancy

__all__ = (
    "CHECKS",
    "AdmissionCheck",
    "AdmissionRequest",
    "Admitted",
    "CheckName",
    "DocumentResolver",
    "DocumentState",
)

CheckName = Literal["department", "visibility", "model", "budget", "attachments"]
CHECKS: tuple[CheckName, ...] = ("department", "visibility", "model", "budget", "attachments")
"""The built-in checks, in the order they run."""

DocumentState = Literal["indexed", "reading", "missing"]
DocumentResolver = Callable[[str, Principal | None], Awaitable[DocumentState]]
"""The app's answer for one attached document id: indexed, still being read, or missing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRequest:
    """A message on its way in, with what the checks so far have settled.

    `department` is set once the department check ran; `agent` once visibility ran;
    `model` is the message's model override (None: the agent's own).
    """

    session_id: str
    content: str
    principal: Principal | None
    organisation: Organisation
    department: Department | None = None
    agent: Agent | None = None
    model: str | None = None
    documents: tuple[str, ...] = ()

    @property
    def subject(self) -> BudgetSubject:
        """Who the turn would spend for."""
        assert self.department is not None, "the department check runs first"
        return BudgetSubject(
            organisation=self.organisation.name,
            department=self.department.name,
            principal=self.principal.id if self.principal else None,
            session_id=self.session_id,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionCheck:
    """An app's own check, run after (or before) a built-in one.

    The function raises `AdmissionRefusedError` (or any turnkit error) to refuse the
    message; returning lets it through.
    """

    name: str
    check: Callable[[AdmissionRequest], Awaitable[None]]
    after: CheckName | None = None
    before: CheckName | None = None

    def __post_init__(self) -> None:
        if (self.after is None) == (self.before is None):
            raise ConfigurationError(
                f"admission check {self.name!r} needs exactly one of `after=` or `before=` "
                f"(one of {list(CHECKS)!r})"
            )
        if (self.after or self.before) not in CHECKS:
            raise ConfigurationError(
                f"admission check {self.name!r}: {self.after or self.before!r} is not one of "
                f"{list(CHECKS)!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """What the chain settled: the turn's agent, its model override and who spends."""

    agent: Agent
    model: str | None
    principal: Principal | None
    organisation: Organisation
    department: Department
    documents: tuple[str, ...] = ()

    @property
    def subject_fields(self) -> dict[str, str | list[str]]:
        """What the turn's pinned configuration keeps of the caller."""
        return {
            "organisation": self.organisation.name,
            "department": self.department.name,
            "roles": sorted(self.principal.roles) if self.principal else [],
        }


AgentLookup = Callable[[str | Agent | None], Awaitable[Agent]]
ModelResolver = Callable[[str | object], ModelFamily]


@dataclass(kw_only=True)
class Admission:
    """The chain, bound to one runtime's agents, models, store and the app's checks."""

    tenancy: Tenancy
    agents: AgentCatalog
    lookup: AgentLookup
    served: Callable[[], Collection[str]]
    family: ModelResolver
    store: Callable[[], Store]
    config: RuntimeConfig
    documents: DocumentResolver | None = None
    checks: Sequence[AdmissionCheck] = field(default_factory=tuple)

    async def admit(
        self,
        *,
        session_id: str,
        content: str,
        principal: Principal | None,
        agent: str | Agent | None,
        model: str | None,
        documents: Sequence[str] = (),
    ) -> Admitted:
        """Run every check in order; the first failure raises (nothing is written)."""
        organisation = self.tenancy.organisation(
            principal.organisation if principal else DEFAULT_ORGANISATION
        )
        if organisation is None:
            assert principal is not None
            raise DepartmentUnknownError(
                f"organisation {principal.organisation!r} is not served here",
                organisation=principal.organisation,
            )
        request = AdmissionRequest(
            session_id=session_id,
            content=content,
            principal=principal,
            organisation=organisation,
            model=model,
            documents=tuple(documents),
        )
        for name in CHECKS:
            await self._app_checks(request, before=name)
            request = await self._builtin(name, request, agent)
            await self._app_checks(request, after=name)
        assert request.agent is not None
        assert request.department is not None
        return Admitted(
            agent=request.agent,
            model=request.model,
            principal=principal,
            organisation=organisation,
            department=request.department,
            documents=request.documents,
        )

    async def recheck(
        self,
        agent: Agent,
        *,
        session_id: str,
        content: str,
        principal: Principal | None,
        organisation: str,
        department: str | None,
        model: str | None,
    ) -> str | None:
        """Run the built-in checks that depend on the agent again, for `agent` instead.

        For a turn admitted with another version of `agent` (gone since) that has not
        started: the caller's agent visibility and the message's model (its override, or
        the new version's own models against the department's blocked ones). Returns the
        model override as it stands for `agent` (None: the agent's own). The department
        must still exist; the budget and attachment checks and the app's own checks do not
        run again (they do not depend on the agent's version).
        """
        served = self.tenancy.organisation(organisation)
        found = served.department(department) if served is not None else None
        if served is None or found is None:
            raise DepartmentUnknownError(
                f"the turn's department {department!r} of organisation {organisation!r} is "
                "not served here any more",
                department=department,
                organisation=organisation,
            )
        request = AdmissionRequest(
            session_id=session_id,
            content=content,
            principal=principal,
            organisation=served,
            department=found,
            model=model,
        )
        request = replace(request, agent=await self._visible_agent(request, agent))
        return self._model(request)

    async def budget_uses(self, principal: Principal | None, session_id: str) -> list[BudgetUse]:
        """Each limit a message of `principal` in `session_id` would spend against, as used.

        Empty for an organisation not served here: no limit applies to a message that
        cannot be admitted.
        """
        organisation = self.tenancy.organisation(
            principal.organisation if principal else DEFAULT_ORGANISATION
        )
        if organisation is None:
            return []
        department = organisation.department(principal.department if principal else None)
        subject = BudgetSubject(
            organisation=organisation.name,
            department=department.name if department else organisation.default_department,
            principal=principal.id if principal else None,
            session_id=session_id,
        )
        return await self.store().budget_uses(subject)

    async def _app_checks(
        self,
        request: AdmissionRequest,
        *,
        before: CheckName | None = None,
        after: CheckName | None = None,
    ) -> None:
        for check in self.checks:
            if (before is not None and check.before == before) or (
                after is not None and check.after == after
            ):
                await check.check(request)

    async def _builtin(
        self, name: CheckName, request: AdmissionRequest, agent: str | Agent | None
    ) -> AdmissionRequest:
        match name:
            case "department":
                return replace(request, department=self._department(request))
            case "visibility":
                return replace(request, agent=await self._visible_agent(request, agent))
            case "model":
                return replace(request, model=self._model(request))
            case "budget":
                await self._budget(request)
                return request
            case "attachments":
                await self._attachments(request)
                return request

    def _department(self, request: AdmissionRequest) -> Department:
        wanted = request.principal.department if request.principal else None
        department = request.organisation.department(wanted)
        if department is None:
            raise DepartmentUnknownError(
                f"department {wanted!r} does not exist in organisation "
                f"{request.organisation.name!r}",
                department=wanted,
                organisation=request.organisation.name,
            )
        return department

    async def _visible_agent(self, request: AdmissionRequest, agent: str | Agent | None) -> Agent:
        principal, organisation = request.principal, request.organisation
        pinned_default = organisation.default_agent
        is_admin = principal is not None and principal.is_admin
        # An agent a hosted tool asks (`Agent.as_tool`) comes as an object, from that tool:
        # a delegation, not a caller's pick (a name of an asked-only agent is refused).
        delegated = isinstance(agent, Agent) and self.agents.is_asked(agent)
        if pinned_default is not None and not is_admin and not delegated:
            asked = agent.name if isinstance(agent, Agent) else agent
            if asked is not None and asked != pinned_default:
                raise AgentNotAllowedError(
                    f"organisation {organisation.name!r} uses its default agent "
                    f"{pinned_default!r}; only an admin may pick {asked!r}",
                    agent=asked,
                )
            agent = pinned_default
        found = await self.lookup(agent)
        if not _visible(found, principal, organisation, request.department):
            # "Not visible" answers exactly like "not found".
            raise AgentNotFoundError(f"no agent {found.name!r}", agent=found.name)
        return found

    def _model(self, request: AdmissionRequest) -> str | None:
        agent, model = request.agent, request.model
        assert agent is not None
        assert request.department is not None
        own = self.family(agent.model)
        if model == own.name:
            model = None  # the agent's own: no override (one of its rungs is served or not)
        if model is not None and model not in self.served():
            raise ModelNotAllowedError(
                f"model {model!r} is not served here (served: {sorted(self.served())!r}); "
                "a message may only pick a model the host serves",
                model=model,
            )
        names = {model} if model is not None else {own.name, *(r.model for r in own.rungs)}
        blocked = sorted(names & request.department.blocked_models)
        if blocked:
            raise ModelNotAllowedError(
                f"department {request.department.name!r} may not use {blocked!r}",
                model=blocked[0],
                department=request.department.name,
            )
        if model is not None:
            self.family(model)  # unresolvable: UnknownModelError
        return model

    async def _budget(self, request: AdmissionRequest) -> None:
        if self.config.budgets == "off":
            return
        uses = await self.store().budget_uses(request.subject)
        if not uses:
            subject = request.subject
            raise BudgetPolicyMissingError(
                f"no budget covers organisation {subject.organisation!r}, department "
                f"{subject.department!r}, principal {subject.principal!r} or this session; "
                "budgets fail closed: an administrator must set a limit",
                department=subject.department,
            )
        for use in uses:
            if not use.fits():
                raise BudgetExceededError(
                    f"{use.describe()}; raise the limit or wait for the period to roll over",
                    scope=use.limit.scope,
                    key=use.limit.key,
                )

    async def _attachments(self, request: AdmissionRequest) -> None:
        if not request.documents:
            return
        if self.documents is None:
            raise InvalidInputError(
                "this runtime takes no attached documents (it has no `documents` resolver)"
            )
        for document in request.documents:
            state = await self.documents(document, request.principal)
            if state == "missing":
                raise AttachmentNotIndexedError(
                    f"document {document!r} has no indexed copy; index it, then send again",
                    document=document,
                )


def _visible(
    agent: Agent,
    principal: Principal | None,
    organisation: Organisation,
    department: Department | None,
) -> bool:
    match agent.visibility:
        case "organisation":
            return True
        case "department":
            home = agent.department or organisation.default_department
            return department is not None and home == department.name
        case "private":
            return principal is not None and agent.owner == principal.id
