"""Plugins: typed hooks, validated when they register, run in an explicit order.

Subclass `Plugin` and override the hooks you need; every hook is a no-op by default.
Today's hook is `enrich_message` (post-turn enrichment: citations and entities for the
answer). A plugin that raises is recorded (audit row + log) and the turn goes on.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from turnkit.blocks import TextBlock
from turnkit.errors import ConfigurationError
from turnkit.events import Citation, Entity
from turnkit.ids import SessionId, TurnId

__all__ = ("HOOKS", "Enrichment", "Plugin", "PluginValidationError", "validate_plugins")

HOOKS = frozenset({"enrich_message"})
_HOOKISH = re.compile(r"^(on|before|after|enrich)_")


class PluginValidationError(ConfigurationError):
    """A plugin that cannot be registered (typo'd hook, duplicate name, wrong signature)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Enrichment:
    """What an enrichment plugin adds to the answer."""

    citations: tuple[Citation, ...] = ()
    entities: tuple[Entity, ...] = ()


class Plugin:
    """Base class for plugins. Set `name` (unique) and optionally `order` (lower runs first)."""

    name: ClassVar[str] = ""
    order: ClassVar[int] = 0

    async def enrich_message(
        self, answer: TextBlock, *, session_id: SessionId, turn_id: TurnId
    ) -> Enrichment | None:
        """Post-turn: add citations or entities to the answer (no model calls here)."""
        return None


def validate_plugins(plugins: Iterable[Plugin]) -> tuple[Plugin, ...]:
    """Check plugins when they register; return them in run order (order, then as given)."""
    seen: set[str] = set()
    checked: list[Plugin] = []
    for plugin in plugins:
        cls = type(plugin)
        if not isinstance(plugin, Plugin):
            raise PluginValidationError(f"{plugin!r} is not a turnkit.plugins.Plugin")
        if not cls.name:
            raise PluginValidationError(f"plugin class {cls.__name__} needs a `name`")
        if cls.name in seen:
            raise PluginValidationError(f"two plugins are named {cls.name!r}")
        seen.add(cls.name)
        for attr, value in vars(cls).items():
            if _HOOKISH.match(attr) and attr not in HOOKS and callable(value):
                raise PluginValidationError(
                    f"plugin {cls.name!r} defines {attr!r}, which is not a hook "
                    f"(hooks: {sorted(HOOKS)}); a typo would silently never run"
                )
            if attr in HOOKS:
                _check_signature(cls.name, attr, value)
        checked.append(plugin)
    return tuple(sorted(checked, key=lambda p: type(p).order))  # stable: ties keep their order


def _check_signature(name: str, hook: str, value: object) -> None:
    expected = inspect.signature(getattr(Plugin, hook))
    if not inspect.iscoroutinefunction(value):
        raise PluginValidationError(f"plugin {name!r}: {hook} must be `async def`")
    got = inspect.signature(value)
    if list(got.parameters) != list(expected.parameters):
        raise PluginValidationError(
            f"plugin {name!r}: {hook}{got} does not match the hook {hook}{expected}"
        )
