"""Meta-tests that pin the review rules: wire names, catalogs, docs, the public surface."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

import turnkit
from turnkit import audit, errors, events

ROOT = Path(__file__).parent.parent
EVENT_CLASSES = get_args(get_args(events.StreamEvent)[0])
SCHEMA_SNAPSHOT = ROOT / "docs" / "reference" / "events.schema.json"


def _wire_type(cls: type) -> str:
    return cls.model_fields["type"].default  # type: ignore[attr-defined, no-any-return]


def test_event_class_names_follow_wire_names() -> None:
    for cls in EVENT_CLASSES:
        wire = _wire_type(cls)
        expected = "".join(part.capitalize() for part in re.split(r"[._]", wire)) + "Event"
        assert cls.__name__ == expected, wire


def test_payload_class_names_follow_kinds() -> None:
    slots = audit.AuditPayloads.model_fields
    for field in slots.values():
        cls = get_args(field.annotation)[0]
        kind = cls.model_fields["kind"].default
        assert field.alias == kind
        assert cls.__name__ == kind[0].upper() + kind[1:] + "Payload"


def test_ephemeral_events_are_exactly_the_starred_ones() -> None:
    ephemeral = {_wire_type(c) for c in EVENT_CLASSES if issubclass(c, events.EphemeralEvent)}
    assert ephemeral == {
        "message.delta",
        "message.snapshot",
        "plugin.signal",
        "thinking.delta",
        "tool.delta",
        "job.progress",
        "compaction.started",
        "heartbeat",
    }
    for cls in EVENT_CLASSES:
        assert issubclass(cls, events.DurableEvent) != issubclass(cls, events.EphemeralEvent)


def test_every_event_type_is_documented() -> None:
    text = (ROOT / "docs" / "concepts" / "events.md").read_text()
    missing = [t for t in map(_wire_type, EVENT_CLASSES) if f"`{t}`" not in text]
    assert not missing, f"add these event types to docs/concepts/events.md: {missing}"


def test_every_error_code_is_documented() -> None:
    text = (ROOT / "docs" / "errors.md").read_text()
    missing = [c for c in errors.error_codes() if f"`{c}`" not in text]
    assert not missing, f"add these codes to docs/errors.md: {missing}"


def test_every_documented_error_code_is_in_the_catalog() -> None:
    """The reverse too: a code docs/errors.md heads (one the HTTP layer answers, say) is one
    `error_codes()` lists, so a client enumerating them misses none."""
    text = (ROOT / "docs" / "errors.md").read_text()
    headed = re.findall(r"^### `([a-z-]+)`", text, flags=re.MULTILINE)
    assert headed
    missing = sorted(set(headed) - set(errors.error_codes()))
    assert not missing, f"add these codes to turnkit.errors.ErrorCode: {missing}"


def test_every_error_class_has_its_own_code() -> None:
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.TurnkitError)
    ]
    codes = [c.code for c in classes if c not in (errors.TurnError, errors.TurnkitError)]
    assert len(codes) == len(set(codes)), "two error classes share a code"
    assert set(codes) <= set(errors.error_codes())


def test_event_schema_matches_the_snapshot() -> None:
    """The wire only grows: regenerate the snapshot deliberately when it changes."""
    current = json.dumps(events.STREAM_EVENT_ADAPTER.json_schema(), indent=2, sort_keys=True)
    if not SCHEMA_SNAPSHOT.exists():  # pragma: no cover - first run writes it
        SCHEMA_SNAPSHOT.write_text(current + "\n")
        pytest.fail("wrote docs/reference/events.schema.json; commit it")
    assert SCHEMA_SNAPSHOT.read_text() == current + "\n", (
        "the event wire changed: check it only grew, then regenerate with "
        "`python -c 'import json,turnkit.events as e; print(json.dumps("
        "e.STREAM_EVENT_ADAPTER.json_schema(), indent=2, sort_keys=True))' "
        "> docs/reference/events.schema.json`"
    )


def test_the_package_loads_its_modules_on_first_use() -> None:
    """`import turnkit` alone loads no runtime, yet every name and module is reachable."""
    code = (
        "import sys, turnkit\n"
        "assert 'turnkit.runtime' not in sys.modules and 'langgraph' not in sys.modules\n"
        "assert turnkit.errors.TurnkitError is turnkit.TurnkitError\n"
        "assert turnkit.events.DoneEvent.__name__ == 'DoneEvent'\n"
        "assert turnkit.SessionRuntime.__name__ == 'SessionRuntime'\n"
        "assert not hasattr(turnkit, 'no_such_module')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def test_public_api_is_pinned() -> None:
    assert sorted(turnkit.__all__) == [
        "AdmissionCheck",
        "AdmissionRefusedError",
        "AdmissionRequest",
        "Agent",
        "AgentCatalog",
        "AgentData",
        "AgentNotAllowedError",
        "AgentNotFoundError",
        "Answer",
        "AnswerContext",
        "AnswerMissingError",
        "Approve",
        "ApproverRequiredError",
        "AttachmentNotIndexedError",
        "BudgetExceededError",
        "BudgetLimit",
        "BudgetPolicyMissingError",
        "CallbackTokenError",
        "CancelToken",
        "ConfigurationError",
        "ContentFilteredError",
        "ContentTooLargeError",
        "DeadlineExceededError",
        "Deny",
        "Department",
        "DepartmentUnknownError",
        "DepsScope",
        "DuplicateToolError",
        "DurableEvent",
        "Effort",
        "EmptyContentError",
        "EphemeralEvent",
        "FamilyExhaustedError",
        "GuardrailBlockedError",
        "ImagePart",
        "InternalError",
        "InvalidInputError",
        "InvalidSessionIdError",
        "LiteLLMClient",
        "ModelCredentialsError",
        "ModelEndpoint",
        "ModelFamily",
        "ModelNotAllowedError",
        "ModelSettings",
        "ModelUnreachableError",
        "NotFoundError",
        "Organisation",
        "OutputInvalidError",
        "OutputLimitExceededError",
        "PauseAnsweredError",
        "PauseNotFoundError",
        "PluginFailedError",
        "PrefixRewriteError",
        "Principal",
        "ProviderError",
        "ReplayCursorError",
        "RequestConflictError",
        "RuntimeClosedError",
        "RuntimeConfig",
        "SessionNotFoundError",
        "SessionRuntime",
        "StaleEpochError",
        "StoreError",
        "StoreUnavailableError",
        "StreamEvent",
        "Tenancy",
        "TextPart",
        "ToolAccessRequest",
        "ToolCallError",
        "ToolClass",
        "ToolContext",
        "TurnError",
        "TurnHistory",
        "TurnNotFoundError",
        "TurnNotRunningError",
        "TurnkitError",
        "UnknownModelError",
        "UserAbortedError",
        "tool",
    ]
    for name in turnkit.__all__:
        assert hasattr(turnkit, name)


def test_public_modules_declare_all() -> None:
    for path in (ROOT / "src" / "turnkit").rglob("*.py"):
        if path.name.startswith("_") and path.name != "__init__.py" or "migrations" in path.parts:
            continue
        text = path.read_text()
        if "def " in text or "class " in text:
            assert re.search(r"^__all__ = \(", text, re.M), f"{path} has no __all__ tuple"


@pytest.mark.parametrize("package", ["turnkit.models", "turnkit.tools"])
def test_no_import_circles_inside(package: str) -> None:
    import itertools

    import grimp  # installed with import-linter, which enforces the same layers in CI

    graph = grimp.build_graph("turnkit", cache_dir=None)
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    circles = [
        (a, b)
        for a, b in itertools.combinations(modules, 2)
        if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)
    ]
    assert circles == []


_CITATION = re.compile(r"\bseeds? ?0\d\d|\bthe seeds?'s?\b|\bDESIGN\b|design brief|§|\bissue #\d")
"""What points a reader at the project's planning notes instead of explaining itself."""


def test_source_and_docs_stand_alone() -> None:
    """Docstrings, comments, messages and docs explain themselves: no planning-note citations."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("src", "examples", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in {".py", ".md", ".js", ".html", ".css", ".toml"}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _CITATION.search(line)
    ]
    assert not found, "\n".join(found)


def test_no_field_description_is_lost() -> None:
    """A field's docstring follows the field: two in a row leave one field undescribed.

    (Pydantic reads the string right after a field as its description, in the published
    schemas and the API docs; a second string is dropped silently.)
    """
    lost = []
    for path in sorted((ROOT / "src" / "turnkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            body = node.body
            for before, after in zip(body, body[1:], strict=False):
                if _is_text(before) and _is_text(after) and before is not body[0]:
                    lost.append(f"{path.relative_to(ROOT)}:{after.lineno} ({node.name})")
    assert not lost, lost


def _is_text(node: object) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )
