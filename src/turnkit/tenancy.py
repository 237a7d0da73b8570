"""Who is calling: principals, their organisation and department, and the organisation's rules.

A `Principal` is what an app's `auth` returns (or what it passes to the SDK). Its
organisation and department decide which agents it may see, which models it may use and
which budgets it spends. A principal with no department sits in its organisation's default
department. Apps with one user need none of this: a bare principal id (or None) resolves to
the single `default` organisation and its `general` department.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnkit.errors import ConfigurationError, InternalError

__all__ = (
    "ADMIN_ROLE",
    "DEFAULT_DEPARTMENT",
    "DEFAULT_ORGANISATION",
    "NAME_PATTERN",
    "Department",
    "Organisation",
    "Principal",
    "AuthDependency",
    "AuthResult",
    "Tenancy",
    "anonymous",
    "principal_from_auth",
)

log = logging.getLogger("turnkit.http")

DEFAULT_ORGANISATION = "default"
DEFAULT_DEPARTMENT = "general"
ADMIN_ROLE = "admin"
"""The role that may pick any agent when the organisation pins a default agent, and may
answer every approval of its organisation that names an `approver_role`."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
"""What an organisation's or department's name may be: 1-128 letters, digits or `_ . : -`,
starting with a letter or digit."""
_NAME = NAME_PATTERN


class Principal(BaseModel):
    """A caller: an id, its organisation, its department (None: the default one) and roles."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=256)
    organisation: str = Field(default=DEFAULT_ORGANISATION, pattern=_NAME)
    department: str | None = Field(default=None, pattern=_NAME)
    roles: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        """Whether the principal holds the `admin` role."""
        return ADMIN_ROLE in self.roles

    @classmethod
    def of(cls, caller: Principal | str | None) -> Principal | None:
        """A principal from what an app passes: a `Principal`, a bare id, or None."""
        if caller is None or isinstance(caller, Principal):
            return caller
        if isinstance(caller, str):
            return cls(id=caller)
        raise TypeError(f"a principal is a turnkit.Principal, a str or None, not {caller!r}")


AuthResult = Principal | str | None
"""What an app's `auth` dependency returns: a principal, a bare principal id, None."""
AuthDependency = Callable[..., AuthResult | Awaitable[AuthResult]]
"""An app's FastAPI dependency naming the caller (every route helper takes one)."""


async def anonymous() -> AuthResult:
    """The default `auth`: every caller is anonymous."""
    return None


def principal_from_auth(found: object) -> Principal | None:
    """What an app's `auth` dependency returned, as a principal (None: anonymous).

    Raises:
        InternalError: it returned something else: the app's mistake, not the caller's,
            so a 500; the value (it may hold a token) goes to the server's log only.
    """
    try:
        return Principal.of(found)  # type: ignore[arg-type]
    except TypeError as exc:
        log.error("the app's `auth` returned %r: %s", found, exc)
        raise InternalError(
            f"the app's `auth` returned a {type(found).__name__}, not a Principal, a "
            "principal id or None (the server's log has the value)"
        ) from exc


class Department(BaseModel):
    """A department: the models it may not use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME)
    blocked_models: frozenset[str] = frozenset()


class Organisation(BaseModel):
    """An organisation: its departments and whether non-admins must use its default agent.

    Attributes:
        name: The organisation's id (a principal's `organisation`).
        departments: Its departments; the default one is added when missing.
        default_department: Where a principal with no department sits.
        default_agent: With a name here, a non-admin may use only that agent: asking for
            another is refused, never silently swapped.
        background_model: The model (a name the runtime's `models=` serves) that names
            its members' sessions after their opening turn; None: each agent's
            `utility_model` does, and an agent without one leaves the opening name.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_NAME)
    departments: tuple[Department, ...] = ()
    default_department: str = Field(default=DEFAULT_DEPARTMENT, pattern=_NAME)
    default_agent: str | None = None
    background_model: str | None = None

    @model_validator(mode="after")
    def _seed_default_department(self) -> Organisation:
        names = [d.name for d in self.departments]
        if len(set(names)) != len(names):
            raise ValueError(f"organisation {self.name!r} names a department twice: {names!r}")
        if self.default_department not in names:
            seeded = (*self.departments, Department(name=self.default_department))
            object.__setattr__(self, "departments", seeded)
        return self

    def department(self, name: str | None) -> Department | None:
        """The named department (None: the default one), or None when it does not exist."""
        wanted = self.default_department if name is None else name
        return next((d for d in self.departments if d.name == wanted), None)


class Tenancy:
    """The organisations a runtime serves (by default one, `default`, with `general`)."""

    def __init__(self, organisations: Iterable[Organisation] = ()) -> None:
        orgs: dict[str, Organisation] = {}
        for org in organisations:
            if org.name in orgs:
                raise ConfigurationError(f"organisation {org.name!r} is configured twice")
            orgs[org.name] = org
        orgs.setdefault(DEFAULT_ORGANISATION, Organisation(name=DEFAULT_ORGANISATION))
        self._organisations: Mapping[str, Organisation] = orgs

    def organisation(self, name: str) -> Organisation | None:
        """The organisation named `name`, or None."""
        return self._organisations.get(name)

    @property
    def organisations(self) -> tuple[Organisation, ...]:
        """Every organisation served."""
        return tuple(self._organisations.values())
