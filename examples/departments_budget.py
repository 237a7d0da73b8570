"""Two departments, an agent only one of them sees, and a budget that pauses a turn.

Shows: `SessionRuntime(tenancy=[...])` with an organisation of two departments; the
admission chain refusing before anything is written (an agent sales may not see, a model
blocked for sales); `RuntimeConfig(budgets="enforce")` failing closed, then a department
budget that runs out mid-turn so the turn pauses `awaiting_budget`; an administrator
raising the limit and the same turn finishing; usage reported by department.

Run:  .venv/bin/python examples/departments_budget.py   (offline, scripted models)
"""

import asyncio
import dataclasses
import os
import tempfile

from turnkit import (
    Agent,
    AgentNotFoundError,
    BudgetLimit,
    Department,
    Organisation,
    Principal,
    RuntimeConfig,
    SessionRuntime,
    tool,
)
from turnkit.errors import BudgetPolicyMissingError, ModelNotAllowedError
from turnkit.events import BudgetPausedEvent
from turnkit.models import Usage
from turnkit.testing import ModelStep, ScriptedModel, call

ACME = Organisation(
    name="acme",
    departments=(
        Department(name="sales", blocked_models=frozenset({"deep-model"})),
        Department(name="research"),
    ),
)
ANN = Principal(id="ann", organisation="acme", department="sales")
ROB = Principal(id="rob", organisation="acme", department="research")
ADMIN = Principal(id="root", organisation="acme", roles=frozenset({"admin"}))


@tool
async def pipeline(region: str) -> dict[str, int]:
    """The sales pipeline of a region."""
    return {"deals": 12, "value_eur": 340_000}


def _costly(step: ModelStep, tokens: int) -> ModelStep:
    return dataclasses.replace(step, usage=Usage(input_tokens=tokens, output_tokens=100))


def models() -> dict[str, ScriptedModel]:
    fast = ScriptedModel(
        [
            _costly(ModelStep.tool_call_reply(call("pipeline", region="north")), 2_900),
            ModelStep.text_reply("North has 12 deals worth 340,000 EUR."),
        ],
        name="fast-model",
    )
    deep = ScriptedModel([ModelStep.text_reply("The assay looks stable.")], name="deep-model")
    return {"fast-model": fast, "deep-model": deep}


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = RuntimeConfig(
            database_url=f"sqlite:///{os.path.join(tmp, 'acme.db')}",
            budgets="enforce",
            budget_reserve_tokens=200,
        )
        async with SessionRuntime(
            agents=[
                Agent(name="assistant", model="fast-model", tools=[pipeline]),
                Agent(
                    name="lab", model="deep-model", visibility="department", department="research"
                ),
            ],
            models=models(),
            tenancy=[ACME],
            config=config,
        ) as runtime:
            # Budgets fail closed: nothing covers acme yet.
            try:
                await runtime.submit("ann-1", "How is the north doing?", principal=ANN)
            except BudgetPolicyMissingError as exc:
                print("refused:", exc.code)
            await runtime.set_budget_limit(
                BudgetLimit(scope="organisation", organisation="acme", usd=50.0)
            )
            await runtime.set_budget_limit(
                BudgetLimit(scope="department", organisation="acme", key="sales", tokens=3_200)
            )

            # The admission chain, before anything is written.
            try:
                await runtime.submit("ann-1", "Check the assay", agent="lab", principal=ANN)
            except AgentNotFoundError as exc:
                print("refused:", exc.code)  # not visible answers like not found
            try:
                await runtime.submit("ann-1", "Think hard", model="deep-model", principal=ANN)
            except ModelNotAllowedError as exc:
                print("refused:", exc.code)
            print("sessions written:", len(await runtime.store.list_sessions()))

            # Research may use its lab agent.
            async for _ in runtime.execute_message(
                "rob-1", "Check the assay", agent="lab", principal=ROB
            ):
                pass
            [lab_turn] = await runtime.history("rob-1")
            print(f"rob ({lab_turn.status}): {lab_turn.answer}")

            # Sales spends its budget in the tool call; the answer's call would cross it.
            paused = None
            async for event in runtime.execute_message(
                "ann-1", "How is the north doing?", principal=ANN
            ):
                if isinstance(event, BudgetPausedEvent):
                    paused = event
            assert paused is not None
            print(f"paused: {paused.scope} {paused.key} ({paused.period})")
            print("status:", (await runtime.turn(paused.turn_id)).status)

            # An administrator raises the sales budget: the same turn goes on.
            resumed = await runtime.set_budget_limit(
                BudgetLimit(scope="department", organisation="acme", key="sales", tokens=20_000)
            )
            print("resumed:", resumed == [paused.turn_id])
            async for _ in runtime.reader().follow(paused.turn_id):
                pass
            [ann_turn] = await runtime.history("ann-1")
            print(f"ann ({ann_turn.status}): {ann_turn.answer}")

            for line in await runtime.store.usage_report(
                by="department", principal=None, organisation="acme"
            ):
                print(f"usage {line.key}: {line.turns} turn(s), {line.input_tokens} tokens in")


if __name__ == "__main__":
    asyncio.run(main())
