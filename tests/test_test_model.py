"""`TestModel`: the agent's tools called with arguments made from their schemas, then an
answer, with no script; and the schema values it writes."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import subprocess
import sys
import uuid
from decimal import Decimal
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import UUID4, BaseModel, Field, IPvAnyAddress, TypeAdapter
from typing_extensions import TypedDict

from tests.conftest import RuntimeFactory
from turnkit import Agent, tool
from turnkit.events import DoneEvent, ErrorEvent, StreamEvent, ToolCompletedEvent, ToolFailedEvent
from turnkit.testing import TestModel, collect_events
from turnkit.testing._schema_example import schema_example


class Address(BaseModel):
    street: str
    zip_code: Annotated[str, Field(min_length=5, max_length=5)]
    country: str = "DE"


class Seat(enum.Enum):
    WINDOW = "window"
    AISLE = "aisle"


@tool
async def weather(city: str, days: int = 1) -> str:
    """The forecast."""
    return f"sunny in {city} for {days} day(s)"


@tool
async def book(
    when: datetime.date,
    seats: Annotated[int, Field(ge=2, le=8)],
    tags: Annotated[list[str], Field(min_length=2)],
    seat: Seat,
    to: Address | None = None,
) -> dict[str, Any]:
    """Book a trip."""
    return {"when": when.isoformat(), "seats": seats, "tags": tags, "seat": seat.value}


class Forecast(BaseModel):
    city: str
    days: Annotated[int, Field(gt=0, le=14)]
    kind: Literal["sunny", "rainy"]


def _answer(events: list[StreamEvent]) -> str:
    done = events[-1]
    assert isinstance(done, DoneEvent), events[-1]
    assert done.status == "succeeded", [e for e in events if isinstance(e, ErrorEvent)]
    return "".join(e.text for e in events if e.type == "message.delta")  # type: ignore[union-attr]


async def test_every_tool_is_called_once_with_arguments_it_accepts(
    runtime_factory: RuntimeFactory,
) -> None:
    model = TestModel()
    runtime = runtime_factory(Agent(model=model, tools=[weather, book]))
    events = await collect_events(runtime.execute_message("s", "plan my trip"))

    answer = json.loads(_answer(events))
    assert not [e for e in events if isinstance(e, ToolFailedEvent)]
    completed = {e.result.tool_name for e in events if isinstance(e, ToolCompletedEvent)}
    assert completed == {"weather", "book"}
    assert answer == {
        "weather": "sunny in a for 1 day(s)",
        "book": {"when": "2024-01-01", "seats": 2, "tags": ["a", "b"], "seat": "window"},
    }
    assert [c.purpose for c in model.calls] == ["tool-loop", "tool-loop"]
    assert model.calls[0].tools  # the tools were offered on the call that used them

    # the next message calls them again (a round per message), not the old results
    events = await collect_events(runtime.execute_message("s", "and again"))
    assert json.loads(_answer(events)) == answer
    assert len(model.calls) == 4


async def test_only_the_named_tools_are_called(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory(Agent(model=TestModel(call_tools=["weather"]), tools=[weather, book]))
    events = await collect_events(runtime.execute_message("s", "weather?"))
    assert json.loads(_answer(events)) == {"weather": "sunny in a for 1 day(s)"}


async def test_a_named_tool_the_agent_lacks_fails_the_turn_saying_which(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=TestModel(call_tools=["wether"]), tools=[weather]))
    events = await collect_events(runtime.execute_message("s", "weather?"))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.status == "failed"
    [error] = [e for e in events if isinstance(e, ErrorEvent)]
    assert "told to call ['wether']" in error.message
    assert "offers only ['read_tool_result', 'weather']" in error.message


async def test_answer_text_and_an_agent_without_tools(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory(Agent(model=TestModel(answer="All set."), tools=[weather]))
    assert _answer(await collect_events(runtime.execute_message("s", "hi"))) == "All set."
    bare = runtime_factory(Agent(model=TestModel()))
    answer = _answer(await collect_events(bare.execute_message("s", "hi")))
    assert answer == "success (no tool calls)"


async def test_a_structured_answer_is_a_value_its_type_accepts(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=TestModel(), tools=[weather], output_type=Forecast))
    answer = _answer(await collect_events(runtime.execute_message("s", "forecast?")))
    assert Forecast.model_validate_json(answer) == Forecast(city="a", days=1, kind="sunny")

    given = Forecast(city="Oslo", days=3, kind="rainy")  # a model, or its JSON data
    chosen = runtime_factory(Agent(model=TestModel(output=given), output_type=Forecast))
    answer = _answer(await collect_events(chosen.execute_message("s2", "forecast?")))
    assert Forecast.model_validate_json(answer).city == "Oslo"


async def test_as_the_utility_model_it_plans_and_names_the_session(
    runtime_factory: RuntimeFactory,
) -> None:
    utility = TestModel(utility_answer="Trip planning")
    agent = Agent(model=TestModel(), utility_model=utility, tools=[weather])
    runtime = runtime_factory(agent)
    _answer(await collect_events(runtime.execute_message("s", "weather in Oslo?")))
    await runtime.wait_background()
    assert [c.purpose for c in utility.calls] == ["plan", "utility"]
    assert (await runtime.session("s")).title == "Trip planning"


async def test_an_asked_agent_answers_through_its_own_test_model(
    runtime_factory: RuntimeFactory,
) -> None:
    refunds = Agent(name="refunds", model=TestModel(answer="Refunded 20 EUR."))
    front = Agent(name="front", model=TestModel(), tools=[refunds.as_tool()])
    runtime = runtime_factory(front)
    answer = _answer(await collect_events(runtime.execute_message("s", "refund me")))
    assert json.loads(answer) == {"refunds": "Refunded 20 EUR."}


def test_call_tools_must_be_all_or_names() -> None:
    with pytest.raises(TypeError, match="give 'all' or a list of tool names"):
        TestModel(call_tools="weather")  # type: ignore[arg-type]


@pytest.mark.parametrize("given", [None, 3, ["weather", 3], {"weather": True}])
def test_call_tools_of_another_kind_is_refused_where_it_is_made(given: object) -> None:
    # Not only a stray string: None (meaning "no tools"?), a number, a list holding a
    # non-name or a mapping are refused at once, not as an internal error inside a turn.
    with pytest.raises(TypeError, match="give 'all' or a list of tool names"):
        TestModel(call_tools=given)  # type: ignore[arg-type]


def test_pytest_does_not_take_it_for_a_test_class(tmp_path: Path) -> None:
    test_file = tmp_path / "test_uses_it.py"
    test_file.write_text("from turnkit.testing import TestModel\n\ndef test_x():\n    pass\n")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error::pytest.PytestCollectionWarning",
            test_file,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


class Flags(TypedDict):
    quiet: bool
    level: Annotated[int, Field(multiple_of=5, gt=7)]


@dataclasses.dataclass
class Window:
    start: datetime.datetime
    end: datetime.time
    every: datetime.timedelta


class Node(BaseModel):
    name: str
    children: list[Node] = []


@pytest.mark.parametrize(
    "kind",
    [
        str,
        int,
        float,
        bool,
        None,
        Decimal,
        uuid.UUID,
        datetime.date,
        Seat,
        Literal["a", "b"],
        Annotated[float, Field(gt=0, lt=0.1)],
        Annotated[int, Field(ge=-5, le=-3)],
        Annotated[str, Field(min_length=3, max_length=4)],
        Annotated[list[int], Field(min_length=3)],
        tuple[int, str, bool],
        set[int],
        dict[str, int],
        int | str | None,
        Address,
        Flags,
        Window,
        Node,
        list[Address],
        Annotated[int, Field(le=-5, multiple_of=3)],
        UUID4,
        IPvAnyAddress,
        IPv4Network,
        IPv4Interface,
        Annotated[dict[str, int], Field(min_length=1)],
    ],
    ids=repr,
)
def test_schema_values_are_accepted_by_the_type_that_made_the_schema(kind: Any) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(kind)
    value = schema_example(adapter.json_schema())
    adapter.validate_json(json.dumps(value))  # raises when the value does not fit


def test_a_reference_to_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="names no definition"):
        schema_example({"$ref": "#/$defs/Missing"})
