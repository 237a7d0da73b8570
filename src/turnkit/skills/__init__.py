"""Skills: named instructions an agent follows for a kind of work.

Builtin skills ship with the package as data (`builtin:<slug>`, one Markdown file each with
a small front matter). An app supplies its own catalogue (the skills a caller may see);
the runtime merges both. A message that starts with `/slug` picks a skill directly.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Final

from turnkit.errors import ConfigurationError
from turnkit.tenancy import Principal

__all__ = (
    "BRAINSTORMING",
    "WRITING_PLANS",
    "Skill",
    "SkillSource",
    "builtin_skills",
    "picked_skill",
    "skills_for",
)

BRAINSTORMING: Final = "brainstorming"
WRITING_PLANS: Final = "writing-plans"
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_PICK = re.compile(r"^/([a-z0-9][a-z0-9-]{0,63})(?:\s|$)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Skill:
    """A named set of instructions.

    Attributes:
        slug: Lower-case letters, digits and `-`; what `/slug` picks.
        name: Shown to people.
        description: One line: when to use it (shown in a skill menu).
        instructions: What the agent is told to do when the skill is used.
        builtin: Shipped with turnkit (its reference is `builtin:<slug>`).
    """

    slug: str
    name: str
    description: str
    instructions: str
    builtin: bool = False

    def __post_init__(self) -> None:
        if not _SLUG.match(self.slug):
            raise ConfigurationError(
                f"skill slug {self.slug!r} must be lower-case letters, digits and '-'"
            )
        if not self.instructions.strip():
            raise ConfigurationError(f"skill {self.slug!r} has no instructions")

    @property
    def ref(self) -> str:
        """`builtin:<slug>` for a builtin skill, else the slug."""
        return f"builtin:{self.slug}" if self.builtin else self.slug


SkillSource = (
    Sequence[Skill] | Callable[[Principal | None], Sequence[Skill] | Awaitable[Sequence[Skill]]]
)
"""An app's skill catalogue: a list, or a function of the principal (its id, organisation,
department and roles; None: anonymous) returning the skills that caller may see (sync or
async)."""


@cache
def builtin_skills() -> tuple[Skill, ...]:
    """The skills shipped with turnkit, read from the package's Markdown files."""
    out = []
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".md"):
            out.append(_parse(entry.name[:-3], entry.read_text(encoding="utf-8")))
    return tuple(out)


def _parse(slug: str, text: str) -> Skill:
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.DOTALL)
    if match is None:
        raise ConfigurationError(f"builtin skill {slug!r} has no front matter")
    meta = dict(line.split(":", 1) for line in match.group(1).splitlines() if ":" in line)
    return Skill(
        slug=slug,
        name=meta.get("name", slug).strip(),
        description=meta.get("description", "").strip(),
        instructions=match.group(2).strip(),
        builtin=True,
    )


async def skills_for(source: SkillSource | None, principal: Principal | None) -> tuple[Skill, ...]:
    """The app's skills the caller may see, then the builtin ones.

    A catalogue function gets the whole principal: the same id in two organisations is
    two callers.
    """
    own: Sequence[Skill] = ()
    if callable(source):
        found = source(principal)
        own = await found if inspect.isawaitable(found) else found
    elif source is not None:
        own = source
    return (*own, *builtin_skills())


def picked_skill(content: str, skills: Sequence[Skill]) -> Skill | None:
    """The skill a message picks with a leading `/slug`, if it names one of `skills`."""
    match = _PICK.match(content.lstrip())
    if match is None:
        return None
    return next((s for s in skills if s.slug == match.group(1)), None)
