"""Planning tiers: none, a task list, or spec → plan → task list; skills picked by `/slug`."""

from __future__ import annotations

from pathlib import Path

from turnkit import Agent, Principal, RuntimeConfig, SessionRuntime
from turnkit.errors import ProviderError
from turnkit.events import (
    ApprovalRequestedEvent,
    DoneEvent,
    StreamEvent,
    TasksUpdatedEvent,
)
from turnkit.ids import SessionId
from turnkit.models import ModelRequest, text_of
from turnkit.skills import Skill
from turnkit.tenancy import Organisation, Tenancy
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


def _utility(depth: str, tasks: list[str] | None = None) -> ScriptedModel:
    plan = {"intent": "work", "depth": depth, "tasks": tasks or []}

    def answer(request: ModelRequest) -> ModelStep:
        if request.purpose == "plan":
            import json

            return ModelStep.text_reply(json.dumps(plan))
        return ModelStep.text_reply("Working on it.")  # thinking summaries

    return ScriptedModel([ModelStep.respond(answer)], name="utility", repeat_last=True)


def _runtime(tmp_path: Path, agent: Agent, **kw: object) -> SessionRuntime:
    config = RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'plan.db'}")
    return SessionRuntime(agent=agent, config=config, **kw)  # type: ignore[arg-type]


def _system_notes(request: ModelRequest) -> str:
    return "\n".join(text_of(m.content) for m in request.messages if m.role == "system")


SPEC = "# Spec\nGoal: a one-page market report.\nDone when: three sources are cited."
PLAN = "1. Gather three sources (inputs: spec.md; output: notes.md; check: 3 links)"
TASKS = [
    {"id": "t1", "title": "Gather sources", "inputs": ["spec.md"], "output": "notes.md",
     "check": "three links"},
    {"id": "t2", "title": "Write the report", "inputs": ["notes.md"], "output": "the answer",
     "check": "cites all three"},
]  # fmt: skip


async def test_a_heavy_request_runs_spec_then_plan_then_tasks(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("write_file", path="spec.md", content=SPEC)),
            ModelStep.tool_call_reply(
                call("write_file", path="plan.md", content=PLAN),
                call("update_tasks", tasks=TASKS),
            ),
            ModelStep.tool_call_reply(
                call("update_tasks", tasks=[{**t, "status": "done"} for t in TASKS])
            ),
            ModelStep.text_reply("Here is the report."),
        ]
    )
    agent = Agent(
        model=model,
        utility_model=_utility("spec_plan_tasks"),
        planning=True,
        approval="always",  # the built-in planning tools never wait for a person
    )
    async with _runtime(tmp_path, agent) as runtime:
        events: list[StreamEvent] = await collect_events(
            runtime.execute_message("s1", "Write a market report on e-bikes in Europe")
        )
        spec = await runtime.store.read_file(SessionId("s1"), "spec.md")
        plan = await runtime.store.read_file(SessionId("s1"), "plan.md")
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]

    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert not any(isinstance(e, ApprovalRequestedEvent) for e in events)
    assert spec is not None
    assert spec.content == SPEC
    assert plan is not None
    assert plan.content == PLAN
    updates = [e for e in events if isinstance(e, TasksUpdatedEvent)]
    assert [[t.status for t in u.tasks] for u in updates] == [
        ["pending", "pending"],
        ["done", "done"],
    ]
    assert updates[0].tasks[0].inputs == ("spec.md",)
    first = model.calls[0]
    assert "Step 1 — Brainstorming" in _system_notes(first)
    assert "Step 2 — Writing plans" in _system_notes(first)
    assert {"update_tasks", "write_file", "read_file", "list_files"} <= {
        t.name for t in first.tools
    }
    # every call offers the same tools: the prompt prefix holds
    assert len({tuple(t.name for t in c.tools) for c in model.calls}) == 1
    plans = [r.payloads.plan_generation for r in rows if r.payloads.plan_generation]
    assert plans[0].depth == "spec_plan_tasks"


async def test_clear_work_gets_a_task_list_the_ui_can_draw_at_once(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(
                call("update_tasks", tasks=[
                    {"id": "t1", "title": "Compare prices", "status": "done"},
                    {"id": "t2", "title": "Pick one", "status": "in_progress"},
                ])
            ),
            ModelStep.text_reply("Pick the second one."),
        ]
    )  # fmt: skip
    agent = Agent(
        model=model, utility_model=_utility("task_list", ["Compare prices", "Pick one"]),
        planning=True,
    )  # fmt: skip
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", "Help me pick a laptop"))
    updates = [e for e in events if isinstance(e, TasksUpdatedEvent)]
    assert updates[0].stage_id == "anchor-plan"
    assert updates[0].tool_call_id is None
    assert [t.title for t in updates[0].tasks] == ["Compare prices", "Pick one"]
    assert [t.status for t in updates[-1].tasks] == ["done", "in_progress"]
    assert "update_tasks" in _system_notes(model.calls[0])


async def test_without_a_utility_model_a_long_request_asks_for_a_task_list(
    tmp_path: Path,
) -> None:
    """The word-count heuristic's task-list tier writes no tasks itself: it asks the model
    to set them (it did nothing at all)."""
    model = ScriptedModel([ModelStep.text_reply("On it.")], repeat_last=True)
    agent = Agent(model=model, planning=True)
    long = "Please compare these three laptops on price, weight and battery life " * 6
    async with _runtime(tmp_path, agent) as runtime:
        await collect_events(runtime.execute_message("s1", long))
        await collect_events(runtime.execute_message("s2", "Hi there"))
    assert "first set its task list with `update_tasks`" in _system_notes(model.calls[0])
    assert "update_tasks" not in _system_notes(model.calls[1])  # a short message: no tier


async def test_a_bad_task_list_is_a_failed_result_the_model_reads(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("update_tasks", tasks=[{"title": "no id"}])),
            ModelStep.tool_call_reply(call("read_file", path="../etc/passwd")),
            ModelStep.text_reply("Sorry."),
        ]
    )
    agent = Agent(model=model, planning=True, skip_stages=frozenset({"anchor-plan"}))
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", "go"))
    failed = [e for e in events if e.type == "tool.failed"]
    assert "the task list is not valid" in failed[0].result.error  # type: ignore[union-attr]
    assert "path" in failed[1].result.error  # type: ignore[union-attr]
    assert not any(isinstance(e, TasksUpdatedEvent) for e in events)
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]


async def test_a_message_starting_with_a_slug_picks_the_skill(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Spring rain...")], repeat_last=True)
    haiku = Skill(
        slug="haiku", name="Haiku", description="Answer in a haiku.",
        instructions="Answer in one haiku: 5, 7 and 5 syllables.",
    )  # fmt: skip

    def catalogue(principal: Principal | None) -> list[Skill]:
        return [haiku] if principal is not None and principal.id == "poet" else []

    agent = Agent(model=model)
    async with _runtime(tmp_path, agent, skills=catalogue) as runtime:
        assert [s.ref for s in await runtime.skills("poet")] == [
            "haiku",
            "builtin:brainstorming",
            "builtin:writing-plans",
        ]
        poet = await collect_events(
            runtime.execute_message("s1", "/haiku spring", principal="poet")
        )
        other = await collect_events(runtime.execute_message("s2", "/haiku spring"))
        rows = await runtime.audit(poet[0].turn_id)  # type: ignore[union-attr]
    assert "5, 7 and 5 syllables" in _system_notes(model.calls[0])
    assert "syllables" not in _system_notes(model.calls[1])  # not in that caller's catalogue
    plans = [r.payloads.plan_generation for r in rows if r.payloads.plan_generation]
    assert plans[0].skill == "haiku"
    assert other[-1].status == "succeeded"  # type: ignore[union-attr]


async def test_a_catalogue_tells_the_same_id_in_two_organisations_apart(tmp_path: Path) -> None:
    """`alice` of `acme` and `alice` of `globex` are two callers: a catalogue that offers
    acme's skill to acme's alice must be able to keep it from globex's."""
    model = ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True)
    pricing = Skill(
        slug="pricing", name="Pricing", description="Quote a price.",
        instructions="ACME ONLY: the margin floor is 37%.",
    )  # fmt: skip
    asked: list[Principal | None] = []

    def catalogue(principal: Principal | None) -> list[Skill]:
        asked.append(principal)
        return [pricing] if principal is not None and principal.organisation == "acme" else []

    acme, globex = (
        Principal(id="alice", organisation="acme"),
        Principal(id="alice", organisation="globex"),
    )
    tenancy = Tenancy([Organisation(name="acme"), Organisation(name="globex")])
    async with _runtime(tmp_path, Agent(model=model), skills=catalogue, tenancy=tenancy) as runtime:
        assert [s.slug for s in await runtime.skills(globex)] == ["brainstorming", "writing-plans"]
        assert [s.slug for s in await runtime.skills(acme)][0] == "pricing"
        await collect_events(runtime.execute_message("g1", "/pricing a quote", principal=globex))
        await collect_events(runtime.execute_message("a1", "/pricing a quote", principal=acme))
    assert "margin floor" not in _system_notes(model.calls[0])  # globex's alice
    assert "margin floor" in _system_notes(model.calls[1])  # acme's alice
    last = asked[-1]
    assert last is not None
    assert (last.id, last.organisation) == ("alice", "acme")


async def test_agent_skills_limit_which_skills_a_slug_may_pick(tmp_path: Path) -> None:
    model = ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True)
    haiku = Skill(
        slug="haiku", name="Haiku", description="Answer in a haiku.",
        instructions="Answer in one haiku: 5, 7 and 5 syllables.",
    )  # fmt: skip
    limerick = Skill(
        slug="limerick", name="Limerick", description="Answer in a limerick.",
        instructions="Answer in one limerick: five lines, AABBA.",
    )  # fmt: skip
    # By slug for the app's skill, by reference for a builtin one.
    agent = Agent(model=model, skills=["haiku", "builtin:brainstorming"])
    messages = ["/haiku spring", "/limerick spring", "/brainstorming a report",
                "/writing-plans a report"]  # fmt: skip
    picked = []
    async with _runtime(tmp_path, agent, skills=[haiku, limerick]) as runtime:
        for index, message in enumerate(messages):
            done = (await collect_events(runtime.execute_message(f"s{index}", message)))[-1]
            assert isinstance(done, DoneEvent)
            assert done.status == "succeeded"
            rows = await runtime.audit(done.turn_id)
            plans = [r.payloads.plan_generation for r in rows if r.payloads.plan_generation]
            picked.append(plans[0].skill)
    assert picked == ["haiku", None, "builtin:brainstorming", None]
    notes = [_system_notes(request) for request in model.calls]
    assert "5, 7 and 5 syllables" in notes[0]
    assert "AABBA" not in notes[1]  # the app offers it, the agent does not name it
    assert "Work out what the person actually needs" in notes[2]
    assert "Turn the spec into a plan" not in notes[3]  # a builtin the agent does not name


async def test_a_utility_outage_plans_by_the_heuristic_and_the_turn_answers(
    tmp_path: Path,
) -> None:
    """Planning is the utility model's help, not the answer: when every rung of it fails
    the turn goes on as if the agent had none, and the audit says why."""
    utility = ScriptedModel(
        [ModelStep.fail(ProviderError("overloaded", status_code=529))],
        name="utility",
        repeat_last=True,
    )
    model = ScriptedModel([ModelStep.text_reply("Here you go.")])
    long = "Please compare these three laptops on price, weight and battery life " * 6
    agent = Agent(model=model, utility_model=utility, planning=True)
    async with _runtime(tmp_path, agent) as runtime:
        events = await collect_events(runtime.execute_message("s1", long))
        rows = await runtime.audit(events[0].turn_id)  # type: ignore[union-attr]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "succeeded"
    assert "first set its task list with `update_tasks`" in _system_notes(model.calls[0])
    plans = [r.payloads.plan_generation for r in rows if r.payloads.plan_generation]
    assert len(plans) == 1
    assert plans[0].depth == "task_list"
    assert plans[0].utility_error == "family-exhausted"
    failed = [r.call for r in rows if r.call and r.identity.stage_id == "anchor-plan"]
    assert [c.outcome for c in failed] == ["error"]  # the failed call keeps its own row
