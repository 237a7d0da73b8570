"""Plugins: typed hooks at every stage, validated when they register, run in order.

Subclass `Plugin`, set `name`, and override the hooks you need (every hook is a no-op by
default). A method that looks like a hook (`on_`, `before_`, `after_`, `check_`,
`enrich_`) but is not one is refused at registration, so a typo never silently does
nothing.

| hook | when | may |
|---|---|---|
| `before_model_request` | before each model call of a stage | append notes (never rewrite) |
| `after_model_response` | after each model call of a stage | observe |
| `before_tool_call` | before a tool runs | deny it with a reason the model reads |
| `after_tool_call` | after a tool ran | observe |
| `on_event` | after each durable event is committed | observe |
| `enrich_message` | post-turn, on the answer | add citations and entities |
| `check_input`, `check_tool_result`, `check_answer` | guardrails | allow, redact or block |

`answer_hold` (a plain method, not a hook) tells the runtime how much of the streamed
answer's end to hold back while it may still become something `check_answer` changes.

A hook that raises is logged and audited (`plugin_payloads`) and the turn goes on, unless
the plugin sets `required = True`: then the turn ends `plugin-failed`. Every hook gets a
`PluginContext` to write its own audit payload or emit `plugin.<name>.*` events.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from pydantic import JsonValue

from turnkit.blocks import TextBlock, ToolResultBlock
from turnkit.errors import ConfigurationError
from turnkit.events import Citation, DurableStreamEvent, Entity
from turnkit.ids import SessionId, TurnId
from turnkit.tenancy import Principal

__all__ = (
    "ENTRY_POINT_GROUP",
    "HOOKS",
    "Enrichment",
    "ModelCallView",
    "Note",
    "Plugin",
    "PluginContext",
    "PluginValidationError",
    "ToolCall",
    "Verdict",
    "discover_plugins",
    "merge_plugins",
    "overrides",
    "validate_plugins",
)

ENTRY_POINT_GROUP = "turnkit.plugins"
"""The entry-point group installed plugins register under (name = plugin name)."""

HOOKS = frozenset(
    {
        "before_model_request",
        "after_model_response",
        "before_tool_call",
        "after_tool_call",
        "on_event",
        "enrich_message",
        "check_input",
        "check_tool_result",
        "check_answer",
    }
)
_HOOKISH = re.compile(r"^(on|before|after|enrich|check)_")


class PluginValidationError(ConfigurationError):
    """A plugin that cannot be registered (typo'd hook, duplicate name, wrong signature)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Enrichment:
    """What an enrichment plugin adds to the answer."""

    citations: tuple[Citation, ...] = ()
    entities: tuple[Entity, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A tool call as plugins see it."""

    tool_call_id: str
    name: str
    arguments: Mapping[str, JsonValue]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallView:
    """A reasoning call as plugins see it: the messages' text and the response."""

    stage_id: str
    messages: tuple[tuple[str, str], ...]
    """(role, text) of each message sent, oldest first."""
    response_text: str = ""
    tool_calls: tuple[str, ...] = ()
    """Names of the tools the response called."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A guardrail's finding.

    Attributes:
        action: `allow` (recorded only), `redact` (the text is replaced by `replacement`)
            or `block` (the turn ends `guardrail-blocked`).
        kind: What was found, e.g. `email`, `card-number`, `prompt-injection`.
        subject: Where, in a few words (never the text itself).
        replacement: The redacted text, for `redact`.
    """

    action: Literal["allow", "redact", "block"]
    kind: str
    subject: str = ""
    replacement: str | None = None

    def __post_init__(self) -> None:
        if self.action not in ("allow", "redact", "block"):
            raise ValueError(f"a verdict's action is allow, redact or block, not {self.action!r}")
        for field in ("kind", "subject"):
            if not isinstance(getattr(self, field), str):
                raise TypeError(f"a verdict's `{field}` is a string, not {getattr(self, field)!r}")
        if self.action == "redact" and not isinstance(self.replacement, str):
            raise ValueError("a `redact` verdict needs the `replacement` text")
        if self.replacement is not None and not isinstance(self.replacement, str):
            raise TypeError(f"a verdict's `replacement` is a string, not {self.replacement!r}")


@dataclass(frozen=True, slots=True)
class Note:
    """A note `before_model_request` appends, as a plain string is, with how long it stays.

    `standing=True`: the turn works by it, as by the plan: compaction inside the turn keeps
    it where it was added, whole, instead of summarizing it with its round. When a later
    turn's compaction summarizes the earlier turns, it goes with them, as the plan does;
    a plugin that adds its note when the request lacks it puts it back on the next
    request. Keep standing notes short, and add each once.
    """

    text: str
    standing: bool = False


class PluginContext(Protocol):
    """What a hook may use: the turn it runs in, its own audit payload and events."""

    @property
    def session_id(self) -> SessionId:
        """The session of the turn."""
        ...

    @property
    def turn_id(self) -> TurnId:
        """The turn the hook runs in."""
        ...

    @property
    def agent(self) -> str:
        """The agent's name."""
        ...

    @property
    def principal(self) -> str | None:
        """Who sent the message."""
        ...

    @property
    def caller(self) -> Principal | None:
        """Who sent the message, whole (organisation, department, roles; None: anonymous)."""
        ...

    @property
    def deps(self) -> object:
        """The app's dependencies for this turn, as its tools get them (None: none given)."""
        ...

    def audit(self, payload: JsonValue) -> None:
        """Write `payload` into the audit under this plugin's name (`plugin_payloads`)."""
        ...

    async def emit(self, name: str, data: Mapping[str, JsonValue], *, durable: bool = True) -> None:
        """Emit `plugin.<plugin name>.<name>` (durable: committed and replayed)."""
        ...


class Plugin:
    """Base class for plugins.

    Set `name` (unique), `order` (lower runs first), and `required = True` to make a
    failure of this plugin fail the turn.
    """

    name: ClassVar[str] = ""
    order: ClassVar[int] = 0
    required: ClassVar[bool] = False

    def settings(self) -> Mapping[str, JsonValue]:
        """What this instance was configured with, where it differs from the defaults.

        It is part of the version of an agent the plugin is registered on, so a turn
        paused under one configuration does not resume under another. Default: nothing.
        """
        return {}

    async def before_model_request(
        self, ctx: PluginContext, call: ModelCallView
    ) -> Sequence[str | Note] | None:
        """Before a stage's model call: notes to append to the message list (kept for good).

        The stages' calls are anchor-plan's planning call (its notes go to that call
        only), then each tool-loop and synthesize call; `call.stage_id` says which. A
        string is a note that goes with its round when the history is compacted; a
        `Note(text, standing=True)` stays through compaction.
        """
        return None

    async def after_model_response(self, ctx: PluginContext, call: ModelCallView) -> None:
        """After a stage's model call answered (the view carries the response)."""
        return None

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        """Before a tool runs: a reason to deny it (the model reads it), or None to allow."""
        return None

    async def after_tool_call(
        self, ctx: PluginContext, call: ToolCall, result: ToolResultBlock
    ) -> None:
        """After a tool ran (or failed)."""
        return None

    async def on_event(self, ctx: PluginContext, event: DurableStreamEvent) -> None:
        """After each durable event of the turn is committed (narrow it on `event.type`)."""
        return None

    async def enrich_message(
        self, ctx: PluginContext, answer: TextBlock, sources: Sequence[ToolResultBlock]
    ) -> Enrichment | None:
        """Post-turn: citations or entities for the answer.

        `sources` are the turn's tool results, in call order.
        """
        return None

    async def check_input(self, ctx: PluginContext, text: str) -> Verdict | None:
        """Guardrail on the user's message, before the turn's first stage."""
        return None

    async def check_tool_result(
        self, ctx: PluginContext, call: ToolCall, text: str
    ) -> Verdict | None:
        """Guardrail on a tool's result, before the model reads it."""
        return None

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        """Guardrail on assistant text: each chunk before it goes out, and the whole block."""
        return None

    def answer_hold(self, text: str) -> int:
        """How many characters at the end of the answer so far may still become a finding.

        `check_answer` sees the text as it streams; a value only part of which has arrived
        (`jane.doe@exam`) matches nothing yet. The runtime holds back this many trailing
        characters of `text` until more text settles them or the block ends, and runs the
        guardrails on the rest, so no part of what `check_answer` redacts or blocks is
        ever shown. The default, 0, holds nothing. A plain function: it runs per chunk.
        """
        return 0


def validate_plugins(plugins: Iterable[Plugin]) -> tuple[Plugin, ...]:
    """Check plugins when they register; return them in run order (order, then as given)."""
    if isinstance(plugins, str | Plugin):  # one plugin (or one name): not a list of them
        raise PluginValidationError(f"plugins are a list, such as [{plugins!r}]")
    seen: set[str] = set()
    checked: list[Plugin] = []
    for plugin in plugins:
        name = _checked_name(plugin)
        if name in seen:
            raise PluginValidationError(f"two plugins are named {name!r}")
        seen.add(name)
        _check_hooks(type(plugin))
        checked.append(plugin)
    return tuple(sorted(checked, key=lambda p: type(p).order))  # stable: ties keep their order


def _checked_name(plugin: object) -> str:
    """A plugin's name, once it is known to be a plugin with a valid name and order."""
    if isinstance(plugin, str):
        raise PluginValidationError(
            f"{plugin!r} is a name: pass a plugin instance, or name installed plugins "
            "with `SessionRuntime(plugins=[...])` or `discover_plugins([...])`"
        )
    if isinstance(plugin, type) and issubclass(plugin, Plugin):
        raise PluginValidationError(
            f"{plugin.__name__} is a plugin class: pass an instance, {plugin.__name__}()"
        )
    if not isinstance(plugin, Plugin):
        raise PluginValidationError(f"{plugin!r} is not a turnkit.plugins.Plugin")
    cls = type(plugin)
    if not cls.name:
        hint = " (on the class, not set in `__init__`)" if vars(plugin).get("name") else ""
        raise PluginValidationError(f"plugin class {cls.__name__} needs a `name`{hint}")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", cls.name):
        raise PluginValidationError(
            f"plugin name {cls.name!r} must be lower-case letters, digits, '-' or '_'"
        )
    if not isinstance(cls.order, int) or isinstance(cls.order, bool):
        raise PluginValidationError(
            f"plugin {cls.name!r}: `order` is a whole number (lower runs first), not {cls.order!r}"
        )
    try:
        settings: object = plugin.settings()
    except Exception as exc:  # the plugin's own bug, said at registration
        raise PluginValidationError(f"plugin {cls.name!r}: `settings()` raised {exc!r}") from exc
    if not isinstance(settings, Mapping):
        raise PluginValidationError(
            f"plugin {cls.name!r}: `settings()` returns {type(settings).__name__}; return a dict "
            "of what differs from the defaults (`{}` for nothing)"
        )
    try:
        json.dumps(dict(settings))
    except (TypeError, ValueError) as exc:
        raise PluginValidationError(
            f"plugin {cls.name!r}: `settings()` returns what is not JSON ({exc})"
        ) from exc
    return cls.name


def _check_hooks(cls: type[Plugin]) -> None:
    """Every hook-like method is a hook, and every hook takes what it is passed."""
    for klass in cls.__mro__:
        if klass in (Plugin, object):
            continue
        for attr, value in vars(klass).items():
            if _HOOKISH.match(attr) and attr not in HOOKS and callable(value):
                raise PluginValidationError(
                    f"plugin {cls.name!r} defines {attr!r}, which is not a hook "
                    f"(hooks: {sorted(HOOKS)}); a typo would silently never run"
                )
            if attr in HOOKS or attr == "answer_hold":
                _check_signature(cls.name, attr, value)


def merge_plugins(first: Iterable[Plugin], then: Iterable[Plugin]) -> tuple[Plugin, ...]:
    """Two already validated lists as one, in run order (names must stay unique)."""
    merged = (*first, *then)
    names = [type(p).name for p in merged]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise PluginValidationError(f"two plugins are named {twice[0]!r}")
    return tuple(sorted(merged, key=lambda p: type(p).order))


def overrides(plugin: Plugin, hook: str) -> bool:
    """Whether `plugin` implements `hook` (so a runner can skip the no-op default)."""
    return getattr(type(plugin), hook) is not getattr(Plugin, hook)


def discover_plugins(names: Iterable[str]) -> tuple[Plugin, ...]:
    """Plugins installed under the `turnkit.plugins` entry-point group, picked by name.

    Nothing is loaded unless named (opt-in).

    Raises:
        PluginValidationError: a name no installed plugin has.
    """
    from importlib.metadata import entry_points

    if isinstance(names, str):  # one name would be taken letter by letter
        raise PluginValidationError(f"plugin names are a list, such as [{names!r}]")
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    out: list[Plugin] = []
    for name in names:
        if name not in found:
            raise PluginValidationError(
                f"no installed plugin is named {name!r} (installed: {sorted(found)})"
            )
        target = found[name].load()
        plugin = target() if isinstance(target, type) else target
        loaded = getattr(type(plugin), "name", None)
        if isinstance(plugin, Plugin) and loaded and loaded != name:
            raise PluginValidationError(
                f"the entry point {name!r} loads a plugin named {loaded!r}: register it "
                f"under its own name"
            )
        out.append(plugin)
    return validate_plugins(out)


def _check_signature(name: str, hook: str, value: object) -> None:
    """A hook is `async def` (`answer_hold` a plain `def`) taking what it is passed.

    Hooks are called positionally: parameter names are the plugin's own, their number and
    kind are not.
    """
    expected = inspect.signature(getattr(Plugin, hook))
    if hook == "answer_hold":
        if inspect.iscoroutinefunction(value):
            raise PluginValidationError(
                f"plugin {name!r}: answer_hold must be a plain `def` (it runs for every "
                "streamed chunk)"
            )
    elif not inspect.iscoroutinefunction(value):
        raise PluginValidationError(f"plugin {name!r}: {hook} must be `async def`")
    if not callable(value) or not _takes(inspect.signature(value), len(expected.parameters)):
        raise PluginValidationError(
            f"plugin {name!r}: {hook}{inspect.signature(value)} does not match the hook "  # type: ignore[arg-type]
            f"{hook}{expected}"
        )


def _takes(signature: inspect.Signature, count: int) -> bool:
    """Whether a function of `signature` can be called with `count` positional arguments."""
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True
