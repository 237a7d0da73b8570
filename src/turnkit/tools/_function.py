from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Final, cast, get_args, get_origin, get_type_hints, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PydanticUserError,
    ValidationError,
    create_model,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python

from turnkit.errors import ConfigurationError
from turnkit.models import ToolSpec
from turnkit.pauses import ApprovalPolicy, check_approval_policy, check_approver_role
from turnkit.tools._context import ToolContext
from turnkit.tools._errors import ToolArgumentsError, ToolResultError, ToolTimeoutError
from turnkit.tools._protocol import ReconcileMisfitError, Tool
from turnkit.tools._timeout import check_timeout_s, within
from turnkit.tools.cascade import ToolClass

__all__ = ("NOT_APPLIED", "FunctionTool", "Reconcile", "tool")

ToolFunction = Callable[..., Any]


class _NotApplied:
    def __repr__(self) -> str:
        return "NOT_APPLIED"


NOT_APPLIED: Final = _NotApplied()
"""What a reconcile hook returns when the call did not take effect (it runs again)."""

Reconcile = Callable[[str, dict[str, JsonValue]], Awaitable[object] | object]
"""`async (idempotency_key, arguments) -> the call's result, or NOT_APPLIED` (a plain `def`
answers at once)."""
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "arguments"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def _param_docs(doc: str) -> dict[str, str]:
    """Descriptions of `Args:` entries in a Google-style docstring."""
    docs: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args and stripped.endswith(":") and " " not in stripped:
            break  # the next section (Returns:, Raises:)
        if not in_args or not stripped:
            continue
        match = re.match(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
        if match and line.startswith((" ", "\t")) and len(line) - len(line.lstrip()) <= 8:
            current = match.group(1)
            docs[current] = match.group(2)
        elif current:
            docs[current] = f"{docs[current]} {stripped}".strip()
    return docs


def _is_context(annotation: object) -> bool:
    """`ToolContext`, `ToolContext[Deps]`, or either inside `X | None`."""
    if annotation is ToolContext or get_origin(annotation) is ToolContext:
        return True
    return any(_is_context(arg) for arg in get_args(annotation) if arg is not type(None))


def _deps_type(annotation: object) -> type | None:
    """`Deps` of a `ToolContext[Deps]` annotation when it is a class (not None, not Any)."""
    if get_origin(annotation) is ToolContext:
        (deps,) = get_args(annotation)
        return deps if isinstance(deps, type) and deps is not type(None) else None
    for arg in get_args(annotation):
        found = _deps_type(arg)
        if found is not None:
            return found
    return None


def _deps_label(annotation: object, written: object) -> str | None:
    """The deps type a context parameter asks for, by name (None: it asks for none).

    `annotation` as resolved; `written` as in the source, for a `ToolContext[...]` whose
    deps type did not resolve (it resolved to a plain `ToolContext`).
    """
    deps = _deps_type(annotation)
    if deps is not None:
        return deps.__name__
    return _deps_named(written) if annotation is ToolContext else None


def _deps_named(hint: object) -> str | None:
    """The deps a hint written `ToolContext[Deps]` names, when `Deps` did not resolve.

    Imported for type checking only, it still asks for deps (its name, for the check), as
    a resolved one does, also inside `| None`.
    """
    if not isinstance(hint, str) or not _names_context(hint):
        return None
    context = next(part for part in hint.split("|") if _names_context(part)).strip()
    if "[" not in context:
        return None
    inner = context.split("[", 1)[1].split("]", 1)[0].strip()
    return None if inner in ("None", "Any", "typing.Any", "") else inner


def _hints(fn: ToolFunction, name: str) -> dict[str, Any]:
    """`fn`'s type hints, resolved.

    A `ToolContext[...]` hint naming a type imported only for type checking (under
    `if TYPE_CHECKING:`) is taken as a plain `ToolContext`: its deps type plays no part in
    the schema.
    """
    try:
        return get_type_hints(fn, include_extras=True)
    except NameError as exc:
        unresolved = exc
    patched = {
        param: ToolContext if isinstance(hint, str) and _names_context(hint) else hint
        for param, hint in inspect.get_annotations(fn).items()
    }
    holder = SimpleNamespace(__annotations__=patched, __globals__=getattr(fn, "__globals__", {}))
    try:
        return get_type_hints(holder, include_extras=True)
    except NameError:
        raise ConfigurationError(
            f"cannot resolve the type hints of tool {name!r}: {unresolved}"
        ) from unresolved


def _names_context(hint: str) -> bool:
    """A hint written as `ToolContext[...]` (or `turnkit.ToolContext[...]`, or optional)."""
    return any(
        part.split("[", 1)[0].strip().rsplit(".", 1)[-1] == "ToolContext"
        for part in hint.split("|")
    )


_TOOL_THREADS: ThreadPoolExecutor | None = None
"""Sync tools' own threads: one a timeout left running (a thread cannot be stopped) must
not hold one of the event loop's default executor, which DNS lookups need too."""


def _forget_tool_threads() -> None:
    """A forked child has none of the parent's threads: it starts a pool of its own."""
    global _TOOL_THREADS
    _TOOL_THREADS = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_tool_threads)


async def _in_tool_thread(fn: ToolFunction, kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)` in a tool thread, with the caller's context (as `to_thread` does)."""
    global _TOOL_THREADS
    if _TOOL_THREADS is None:
        _TOOL_THREADS = ThreadPoolExecutor(64, thread_name_prefix="turnkit-tool")
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        _TOOL_THREADS, functools.partial(context.run, fn, **kwargs)
    )


class FunctionTool:
    """A tool made from a typed Python function (sync or async).

    `fn` is that function. Not generic over its signature: mypy would type a list of two
    tools of different signatures as `list[object]`, refusing `tools=TOOLS` in user code.
    """

    def __init__(
        self,
        fn: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
        approval: ApprovalPolicy | None = None,
        approver_role: str | None = None,
        reconcile: Reconcile | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.fn = fn
        check_timeout_s(timeout_s, name or fn.__name__)
        self.timeout_s = timeout_s
        """How long a call may run before it is stopped and fails (None: no limit)."""
        if approval is not None:
            check_approval_policy(approval, f"the tool {name or fn.__name__!r}")
        check_approver_role(approver_role, f"the tool {name or fn.__name__!r}")
        self.approval = approval
        """This tool's approval policy (None: the agent's)."""
        self.approver_role = approver_role
        """The role that answers this tool's approvals (None: the agent's)."""
        self._reconcile = reconcile
        self._name = name or fn.__name__
        if not _NAME.fullmatch(self._name):
            raise ConfigurationError(
                f"tool name {self._name!r} must be 1-64 letters, digits, `_` or `-`"
            )
        doc = inspect.getdoc(fn) or ""
        self.description = description or doc.split("\n\n", 1)[0].strip() or self._name
        self._is_async = inspect.iscoroutinefunction(fn)
        self._context_param: str | None = None
        self._deps_name: str | None = None
        """The deps type its `ToolContext[...]` names (None: it takes none)."""
        """The `Deps` of a `ToolContext[Deps]` parameter: the call needs deps."""
        try:
            self._args_model = self._build_model(fn, _param_docs(doc))
            schema = self._args_model.model_json_schema()
        except PydanticUserError as exc:  # a parameter type with no schema (a plain class)
            said = str(exc).splitlines()[0].split(". ")[0].rstrip(".")
            raise ConfigurationError(
                f"tool {self._name!r} has a parameter whose type has no JSON schema ({said}): "
                "use str, int, float, bool, lists, dicts, enums, pydantic models, dataclasses "
                "or TypedDicts"
            ) from exc
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            # Property titles repeat the names: tokens on every call, nothing for the model.
            if isinstance(prop, dict):
                prop.pop("title", None)
        self._parameters: dict[str, object] = schema
        self._spec: ToolSpec | None = None

    @property
    def name(self) -> str:
        """The name the model calls."""
        return self._name

    def _build_model(self, fn: ToolFunction, docs: dict[str, str]) -> type[BaseModel]:
        hints = _hints(fn, self._name)
        written = inspect.get_annotations(fn)
        fields: dict[str, Any] = {}
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name in ("self", "cls") and params[0].name not in hints:
            # `@tool` on a method: the class's plain function, whose `self` no model can give
            raise ConfigurationError(
                f"tool {self._name!r} takes `{params[0].name}`: `@tool` on a method makes a "
                "tool of the plain function, which no model can call; make the tool from "
                f"the bound method instead (`tool(instance.{fn.__name__})`), or decorate a "
                "function"
            )
        for param in params:
            annotation = hints.get(param.name, Any)
            if _is_context(annotation):
                self._context_param = param.name
                self._deps_name = _deps_label(annotation, written.get(param.name))
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigurationError(
                    f"tool {self._name!r} takes *args/**kwargs; give every argument a name "
                    "and a type so the model gets a schema"
                )
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, Field(default, description=docs.get(param.name)))
        model = create_model(
            f"{self._name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        return cast(type[BaseModel], model)

    def spec(self) -> ToolSpec:
        """Name, description and JSON schema, as offered to the model (built once)."""
        if self._spec is None:
            self._spec = ToolSpec(
                name=self._name, description=self.description, parameters=self._parameters
            )
        return self._spec

    def validate(self, arguments: Mapping[str, JsonValue]) -> dict[str, Any]:
        """Validated keyword arguments, or `ToolArgumentsError`."""
        try:
            parsed = self._args_model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ToolArgumentsError(self._name, _describe(exc)) from exc
        return {key: getattr(parsed, key) for key in type(parsed).model_fields}

    async def invoke(self, arguments: Mapping[str, JsonValue], ctx: ToolContext) -> JsonValue:
        """Validate the arguments, run the function, return its result as JSON."""
        kwargs = self.validate(arguments)
        if self._context_param is not None:
            if ctx.deps is None and self._deps_name is not None:
                raise ConfigurationError(
                    f"the tool {self._name!r} takes ToolContext[{self._deps_name}], "
                    "but this turn has no deps: give SessionRuntime(deps=...) a factory "
                    "(or pass deps= with the message)"
                )
            kwargs[self._context_param] = ctx
        result = await self._run(kwargs)
        try:
            return cast(JsonValue, to_jsonable_python(result))
        # bytes that are not UTF-8, a cycle, a dict keyed by a frozenset (TypeError)
        except (PydanticSerializationError, ValueError, TypeError) as exc:
            raise ToolResultError(
                f"the tool returned {type(result).__name__}, which cannot be sent as JSON "
                f"({exc}): return text, numbers, lists, dicts or pydantic models"
            ) from exc

    async def reconcile(
        self, arguments: Mapping[str, JsonValue], ctx: ToolContext
    ) -> tuple[bool, JsonValue]:
        """Ask the tool's reconcile hook whether this call already took effect.

        Returns `(True, result)` when it did (the call is not run again), `(False, None)`
        when it did not or the tool has no hook (the call runs again, same idempotency
        key).
        """
        if self._reconcile is None:
            return False, None
        found = self._reconcile(ctx.idempotency_key, dict(arguments))
        if inspect.isawaitable(found):  # a plain `def` hook answers at once
            found = await found
        if found is NOT_APPLIED:
            return False, None
        try:
            return True, cast(JsonValue, to_jsonable_python(found))
        except (PydanticSerializationError, ValueError, TypeError) as exc:
            # It took effect: running it again is the one thing not to do.
            raise ReconcileMisfitError(
                f"the reconcile hook of {self._name!r} says the call took effect, but "
                f"returned {type(found).__name__}, which cannot be sent as JSON ({exc}): "
                "return text, numbers, lists, dicts or pydantic models"
            ) from exc

    async def _run(self, kwargs: dict[str, Any]) -> Any:
        """Call the function, within `timeout_s` when it has one."""
        if self._is_async:
            call = cast(Callable[..., Awaitable[Any]], self.fn)(**kwargs)
        else:  # sync tools may block (files, HTTP): keep the event loop free
            call = _in_tool_thread(self.fn, kwargs)
        return await within(self.timeout_s, call, self._expired)

    def _expired(self) -> ToolTimeoutError:
        return ToolTimeoutError(
            f"the tool did not finish within {self.timeout_s:g} s and was stopped; it "
            "may have taken effect, so check before calling it again"
        )

    def __repr__(self) -> str:
        return f"FunctionTool({self._name!r})"


@overload
def tool(fn: ToolFunction, /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    approval: ApprovalPolicy | None = None,
    approver_role: str | None = None,
    reconcile: Reconcile | None = None,
    timeout_s: float | None = None,
) -> Callable[[ToolFunction], FunctionTool]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    fallbacks: Sequence[Tool],
    approval: ApprovalPolicy | None = None,
    approver_role: str | None = None,
    reconcile: Reconcile | None = None,
    timeout_s: float | None = None,
) -> Callable[[ToolFunction], ToolClass]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    fallbacks: Sequence[Tool] | None = None,
    approval: ApprovalPolicy | None = None,
    approver_role: str | None = None,
    reconcile: Reconcile | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Turn a typed function into a tool.

    The JSON schema comes from the signature (and `Args:` descriptions in the docstring);
    a parameter typed `ToolContext` is left out of the schema and receives the call's
    context. With `fallbacks`, the result is a `ToolClass`: when the function fails, the
    call pivots to the next fallback with the same arguments. `approval` (`"always"`,
    `"never"` or a function of name and arguments) overrides the agent's policy, and
    `approver_role` the agent's (who may answer its approvals over HTTP).
    `reconcile` is asked, when a call's earlier attempt died after the call started but
    before its result was committed, whether the call already took effect:
    `async def reconcile(idempotency_key, arguments) -> result | NOT_APPLIED`.
    `timeout_s`: a call still running after that many seconds is stopped and fails with a
    result the model reads (a `ToolClass` tries its next member).

    Example:
        ```python
        @tool
        async def get_weather(city: str, ctx: ToolContext) -> dict[str, str]:
            \"\"\"Current weather for a city.\"\"\"
            ...
        ```
    """

    def wrap(func: ToolFunction) -> Any:
        made = FunctionTool(
            func,
            name=name,
            description=description,
            approval=approval,
            approver_role=approver_role,
            reconcile=reconcile,
            timeout_s=timeout_s,
        )
        if fallbacks is None:
            return made
        return ToolClass(made.name, [made, *fallbacks])

    if fn is not None:
        return wrap(fn)
    return wrap
