"""What never reaches clients (raw reasoning, planner output), and calls that always audit."""

from __future__ import annotations

from tests.conftest import RuntimeFactory
from turnkit import Agent, ModelFamily, ProviderError
from turnkit.events import ErrorEvent, MessageDeltaEvent, encode_event
from turnkit.testing import ModelStep, ScriptedModel, collect_events


async def test_raw_reasoning_never_leaves_the_runtime(runtime_factory: RuntimeFactory) -> None:
    model = ScriptedModel([ModelStep.text_reply("Paris.", thinking="SECRET chain of thought")])
    runtime = runtime_factory(Agent(model=model))
    events = await collect_events(runtime.execute_message("s1", "Capital of France?"))
    assert not [e for e in events if e.type.startswith("thinking.")]  # type: ignore[attr-defined]
    assert all(b"SECRET" not in encode_event(e) for e in events)
    stored = [e async for e in runtime.events(events[0].turn_id)]
    assert all(b"SECRET" not in encode_event(e) for e in stored)  # type: ignore[arg-type]


async def test_the_planners_output_is_not_streamed_as_prose(
    runtime_factory: RuntimeFactory,
) -> None:
    planner = ScriptedModel([ModelStep.text_reply('{"intent": "greet", "depth": "none"}')])
    model = ScriptedModel([ModelStep.text_reply("Hello!")])
    runtime = runtime_factory(Agent(model=model, utility_model=planner))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    deltas = [e for e in events if isinstance(e, MessageDeltaEvent)]
    assert {d.stage_id for d in deltas} == {"synthesize"}
    rows = await runtime.audit(events[0].turn_id)
    plan = rows[0].payloads.plan_generation
    assert plan is not None
    assert plan.intent == "greet"


async def test_a_model_call_that_crashes_still_leaves_its_audit_row(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.fail(RuntimeError("client bug"))])
    runtime = runtime_factory(Agent(model=model))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert error.code == "internal-error"
    rows = [r for r in await runtime.audit(events[0].turn_id) if r.call is not None]
    assert len(rows) == len(model.calls) == 1
    assert rows[0].call is not None
    assert (rows[0].call.outcome, rows[0].call.error_code) == ("error", "internal-error")


async def test_error_events_carry_the_errors_details(runtime_factory: RuntimeFactory) -> None:
    rungs = [
        ScriptedModel([ModelStep.fail(ProviderError("busy", status_code=503))], name="a"),
        ScriptedModel([ModelStep.fail(ProviderError("busy", status_code=503))], name="b"),
    ]
    runtime = runtime_factory(Agent(model=ModelFamily("fam", rungs)))
    events = await collect_events(runtime.execute_message("s1", "hi"))
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert error.details == {"family": "fam", "attempts": ["a", "b"]}
