"""Planning tiers and the built-in planning tools: tasks and the session workspace.

An agent with `planning=True` is offered four built-in tools on every call (so the prompt
prefix never changes): `update_tasks` keeps the turn's task list (each call commits a
`tasks.updated` event), `write_file`, `read_file` and `list_files` work on the session's
workspace. None of them ever waits for an approval.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pydantic import JsonValue, TypeAdapter, ValidationError

from turnkit.agent import PLANNING_TOOL_NAMES
from turnkit.audit import PlanGenerationPayload
from turnkit.errors import InvalidInputError
from turnkit.events import Task, TasksUpdatedEvent
from turnkit.ids import ToolCallId
from turnkit.models import ToolCallPart, ToolSpec
from turnkit.skills import BRAINSTORMING, WRITING_PLANS, Skill, builtin_skills
from turnkit.stages._types import StageContext

__all__ = (
    "PLANNING_TOOLS",
    "is_planning_tool",
    "plan_notes",
    "planning_specs",
    "run_planning_tool",
)

PLANNING_TOOLS: Final = PLANNING_TOOL_NAMES
UPDATE_TASKS, WRITE_FILE, READ_FILE, LIST_FILES = PLANNING_TOOLS

_TASKS = TypeAdapter(tuple[Task, ...])
_PATH = {"type": "string", "description": "A relative path such as `spec.md` or `notes/a.md`."}


def planning_specs() -> tuple[ToolSpec, ...]:
    """The built-in planning tools, as offered to the model."""
    task = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "A short stable id, e.g. t1."},
            "title": {"type": "string"},
            "status": {"type": "string", "enum": ["pending", "in_progress", "done", "blocked"]},
            "inputs": {"type": "array", "items": {"type": "string"}},
            "output": {"type": "string"},
            "check": {"type": "string"},
        },
        "required": ["id", "title"],
        "additionalProperties": False,
    }
    return (
        ToolSpec(
            name=UPDATE_TASKS,
            description=(
                "Set the task list for this request: send the whole list every time, with "
                "each task's status. The person sees it update."
            ),
            parameters={
                "type": "object",
                "properties": {"tasks": {"type": "array", "items": task}},
                "required": ["tasks"],
                "additionalProperties": False,
            },
        ),
        ToolSpec(
            name=WRITE_FILE,
            description="Write a text file to the conversation's workspace (replaces it).",
            parameters={
                "type": "object",
                "properties": {"path": _PATH, "content": {"type": "string"}},
                "required": ["path", "content"],
                "additionalProperties": False,
            },
        ),
        ToolSpec(
            name=READ_FILE,
            description="Read a text file from the conversation's workspace.",
            parameters={
                "type": "object",
                "properties": {"path": _PATH},
                "required": ["path"],
                "additionalProperties": False,
            },
        ),
        ToolSpec(
            name=LIST_FILES,
            description="List the files in the conversation's workspace.",
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
        ),
    )


def is_planning_tool(ctx: StageContext, name: str) -> bool:
    """Whether `name` is a built-in planning tool this agent offers."""
    return ctx.agent.planning and name in PLANNING_TOOLS


async def run_planning_tool(
    ctx: StageContext, part: ToolCallPart, args: Mapping[str, JsonValue]
) -> tuple[str | None, JsonValue]:
    """Run one built-in planning call: (problem the model reads, or None; output)."""
    rec = ctx.recorder
    try:
        match part.name:
            case "update_tasks":
                tasks = _TASKS.validate_python(args.get("tasks"))
                rec.durable(
                    TasksUpdatedEvent,
                    "tool-loop",
                    tasks=tasks,
                    tool_call_id=ToolCallId(part.tool_call_id),
                )
                done = sum(1 for t in tasks if t.status == "done")
                return None, {"tasks": len(tasks), "done": done}
            case "write_file":
                path, content = args.get("path"), args.get("content")
                if not isinstance(path, str) or not isinstance(content, str):
                    return "`path` and `content` must both be text", None
                written = await rec.store.write_file(
                    rec.session_id, path, content, turn_id=rec.turn_id
                )
                return None, {
                    "path": written.path,
                    "version": written.version,
                    "size": written.size,
                }
            case "read_file":
                path = args.get("path")
                if not isinstance(path, str):
                    return "`path` must be text", None
                found = await rec.store.read_file(rec.session_id, path)
                if found is None:
                    names = [f.path for f in await rec.store.list_files(rec.session_id)]
                    return f"there is no file {path!r} in the workspace; files: {names}", None
                return None, {"path": found.path, "content": found.content}
            case _:
                files = await rec.store.list_files(rec.session_id)
                return None, {"files": [{"path": f.path, "size": f.size} for f in files]}
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]
        )
        return f"the task list is not valid ({problems}); send it again", None
    except InvalidInputError as exc:
        return exc.message, None


def plan_notes(ctx: StageContext, plan: PlanGenerationPayload, picked: Skill | None) -> list[str]:
    """The notes anchor-plan appends for the tier it picked (and a skill the message named).

    Stages the opening `tasks.updated` of a task-list plan.
    """
    notes: list[str] = []
    if picked is not None:
        notes.append(f"Use the skill “{picked.name}” for this request:\n\n{picked.instructions}")
    if not ctx.agent.planning:
        if plan.tasks:
            notes.append("Plan for this request:\n" + _numbered(plan.tasks))
        return notes
    if plan.depth == "spec_plan_tasks" and picked is None:
        skills = {s.slug: s for s in builtin_skills()}
        notes.append(
            "This is large or open work: write a spec, then a plan, then do the tasks.\n\n"
            f"Step 1 — {skills[BRAINSTORMING].name}:\n{skills[BRAINSTORMING].instructions}\n\n"
            f"Step 2 — {skills[WRITING_PLANS].name}:\n{skills[WRITING_PLANS].instructions}"
        )
    elif plan.depth == "task_list" and not plan.tasks:  # the heuristic's: none written
        notes.append(
            "This request takes several steps: first set its task list with `update_tasks` "
            "(ids t1, t2, ...), then keep it current: mark a task in_progress when you start "
            "it and done when it is finished."
        )
    elif plan.depth == "task_list":
        tasks = tuple(Task(id=f"t{i}", title=title) for i, title in enumerate(plan.tasks, 1))
        ctx.recorder.durable(TasksUpdatedEvent, "anchor-plan", tasks=tasks, tool_call_id=None)
        notes.append(
            "Plan for this request:\n"
            + _numbered(plan.tasks)
            + "\n\nKeep the task list current with `update_tasks` (ids t1, t2, ...): mark a "
            "task in_progress when you start it and done when it is finished."
        )
    return notes


def _numbered(items: tuple[str, ...]) -> str:
    return "\n".join(f"{i}. {item}" for i, item in enumerate(items, 1))
