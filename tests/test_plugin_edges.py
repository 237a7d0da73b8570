"""Plugins at their edges: guardrails that chain, results that keep their shape, hooks that
return the wrong thing, and hooks that run after the turn's ending is committed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import pytest

from turnkit import Agent, RuntimeConfig, SessionRuntime, tool
from turnkit.blocks import ToolResultBlock
from turnkit.errors import GuardrailBlockedError
from turnkit.events import DurableEvent, GuardrailEvent, StreamEvent
from turnkit.models import Usage
from turnkit.plugins import (
    ModelCallView,
    Plugin,
    PluginContext,
    PluginValidationError,
    ToolCall,
    Verdict,
    validate_plugins,
)
from turnkit.plugins.citations import Citations
from turnkit.plugins.pii import PiiRedaction
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


@tool
async def ticket(ref: str) -> dict[str, object]:
    """Look a ticket up."""
    return {"id": ref, "owner": "jane.doe@example.com", "url": "https://tickets.example/1"}


def _runtime(tmp_path: Path, agent: Agent) -> SessionRuntime:
    return SessionRuntime(
        agent=agent, config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'edges.db'}")
    )


class NoTicketIds(Plugin):
    """The guardrails guide's example, on every checkpoint."""

    name: ClassVar[str] = "no-ticket-ids"
    _ID = re.compile(r"TCK-\d+")

    def _verdict(self, text: str) -> Verdict | None:
        if not self._ID.search(text):
            return None
        return Verdict(action="redact", kind="ticket", replacement=self._ID.sub("[ticket]", text))

    async def check_input(self, ctx: PluginContext, text: str) -> Verdict | None:
        return self._verdict(text)

    async def check_tool_result(
        self, ctx: PluginContext, call: ToolCall, text: str
    ) -> Verdict | None:
        return self._verdict(text)

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        return self._verdict(text)


async def test_each_guardrail_checks_what_the_one_before_it_let_through(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("ticket", ref="TCK-991")),
            ModelStep.text_reply("Ticket TCK-991 belongs to jane.doe@example.com."),
        ]
    )
    plugins = [PiiRedaction(check_input=True), NoTicketIds(), Citations()]
    agent = Agent(model=model, tools=[ticket], plugins=plugins)
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(
            rt.execute_message("s1", "ticket TCK-1, mail bob@corp.example")
        )
        [turn] = await rt.history("s1")
    seen = str([m.content for m in model.calls[1].messages])
    for secret in ("TCK-1,", "TCK-991", "bob@corp.example", "jane.doe@example.com"):
        assert secret not in seen  # neither guardrail undid the other's redaction
    assert turn.answer == "Ticket [ticket] belongs to [email]."
    # A structured result stays structured: the model and the citation read its fields.
    [done] = [e for e in events if e.type == "tool.completed"]
    assert done.result.output == {  # type: ignore[union-attr]
        "id": "[ticket]",
        "owner": "[email]",
        "url": "https://tickets.example/1",
    }
    assert [c.url for c in turn.citations] in ([], ["https://tickets.example/1"])
    findings = {(e.checkpoint, e.kind, e.tool_call_id is not None) for e in events
                if isinstance(e, GuardrailEvent)}  # fmt: skip
    assert findings == {
        ("input", "email", False),
        ("input", "ticket", False),
        ("tool_result", "email", True),
        ("tool_result", "ticket", True),
        ("answer", "email", False),
        ("answer", "ticket", False),
    }


async def test_every_redacted_tool_result_has_its_own_guardrail_event(tmp_path: Path) -> None:
    calls = [call("ticket", ref=f"TCK-{n}") for n in (1, 2, 3)]
    model = ScriptedModel([ModelStep.tool_call_reply(*calls), ModelStep.text_reply("Done.")])
    agent = Agent(model=model, tools=[ticket], plugins=[PiiRedaction()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "three tickets"))
    found = [e.tool_call_id for e in events if isinstance(e, GuardrailEvent)]
    assert sorted(found) == sorted(c.tool_call_id for c in calls)  # type: ignore[type-var]


class RedactsThenBlocks(Plugin):
    name: ClassVar[str] = "redacts-then-blocks"

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        if "block" in text:
            return Verdict(action="block", kind="email")
        if "@" in text:
            return Verdict(action="redact", kind="email", replacement=text.replace("@", " at "))
        return None


async def test_a_block_after_a_redaction_of_the_same_kind_is_its_own_event(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("mail a@b.example now, then block", chunk_size=6)])
    async with _runtime(tmp_path, Agent(model=model, plugins=[RedactsThenBlocks()])) as rt:
        events = await collect_events(rt.execute_message("s1", "hi"))
    actions = [e.action for e in events if isinstance(e, GuardrailEvent)]
    assert actions == ["redact", "block"]
    assert events[-1].error_code == "guardrail-blocked"  # type: ignore[union-attr]


class WrongTypes(Plugin):
    name: ClassVar[str] = "wrong-types"

    async def before_model_request(self, ctx: PluginContext, call: ModelCallView) -> list[str]:
        return "Be polite"  # type: ignore[return-value]

    async def before_tool_call(self, ctx: PluginContext, call: ToolCall) -> str | None:
        return {"deny": "no"}  # type: ignore[return-value]

    async def check_input(self, ctx: PluginContext, text: str) -> Verdict | None:
        return "block"  # type: ignore[return-value]


async def test_a_hook_that_returns_the_wrong_type_is_a_recorded_failure(tmp_path: Path) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("ticket", ref="x")), ModelStep.text_reply("ok")]
    )
    agent = Agent(model=model, tools=[ticket], plugins=[WrongTypes()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "hi"))
        rows = await rt.audit(events[0].turn_id)  # type: ignore[union-attr]
    failures = [r.plugin_payloads["wrong-types"] for r in rows if r.plugin_payloads]
    hooks = {f["hook"] for f in failures}  # type: ignore[index]
    assert hooks == {"before_model_request", "before_tool_call", "check_input"}
    assert any("return a list of notes" in str(f) for f in failures)
    # Nothing half-applied: no note per character, the call ran, the input went through.
    assert [m for m in model.calls[0].messages if m.content == "B"] == []
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]


class AuditsEveryEvent(Plugin):
    name: ClassVar[str] = "audits-every-event"
    required: ClassVar[bool] = True

    async def on_event(self, ctx: PluginContext, event: DurableEvent) -> None:
        ctx.audit({"seq": event.seq})
        if event.type == "done":
            raise RuntimeError("too late to matter")


async def test_on_event_after_the_ending_is_committed_changes_nothing_and_loses_no_row(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    async with _runtime(tmp_path, Agent(model=model, plugins=[AuditsEveryEvent()])) as rt:
        events: list[StreamEvent] = await collect_events(rt.execute_message("s1", "hi"))
        rows = await rt.audit(events[0].turn_id)  # type: ignore[union-attr]
        record = await rt.turn(events[0].turn_id)  # type: ignore[union-attr]
    assert events[-1].type == "done"
    assert record.status == "succeeded"
    audited = [r.plugin_payloads["audits-every-event"] for r in rows if r.plugin_payloads]
    seqs = [a["seq"] for a in audited if "seq" in a]  # type: ignore[operator, index]
    # Every event the hook saw, the ending's own included (seq 1 commits with the message).
    durable = [e.seq for e in events if isinstance(e, DurableEvent) and e.seq > 1]  # type: ignore[operator]
    assert seqs == durable
    assert any(a.get("hook") == "on_event" for a in audited)  # type: ignore[union-attr]


def test_hooks_are_checked_by_what_they_take_not_by_their_parameter_names() -> None:
    class Renamed(Plugin):
        name: ClassVar[str] = "renamed"

        async def check_input(self, context: PluginContext, message: str) -> Verdict | None:
            return None

    class TooFew(Plugin):
        name: ClassVar[str] = "too-few"

        async def check_tool_result(self, ctx: PluginContext, text: str) -> Verdict | None:  # type: ignore[override]
            return None

    class HoldsNothing(Plugin):
        name: ClassVar[str] = "holds-nothing"

        def answer_hold(self) -> int:  # type: ignore[override]
            return 0

    assert validate_plugins([Renamed()])[0].name == "renamed"
    with pytest.raises(PluginValidationError, match="check_tool_result"):
        validate_plugins([TooFew()])
    with pytest.raises(PluginValidationError, match="answer_hold"):
        validate_plugins([HoldsNothing()])


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Due 2026-12-01.", "Due 2026-12-01."),  # a date is not a phone number
        ("Due 2026-12-01 10:30", "Due 2026-12-01 10:30"),
        ("Total 1 000 000 EUR", "Total 1 000 000 EUR"),  # 7 digits
        ("Steps 1 2 3 4 5 done", "Steps 1 2 3 4 5 done"),
        ("Call (555) 123-4567 now", "Call [phone] now"),  # the bracket goes with it
        ("call +47 912 34 567.", "call [phone]."),
        ("card 4111111111111111 ok", "card [card] ok"),  # the space after it stays
        ("order 1234 5678 9012 3456", "order [phone]"),  # no checksum: masked all the same
        ("ref 1234 5678 9012 3456 7890", "ref [phone]"),  # a longer run goes whole
        ("Card 4111 1111 1111 1111 12/27", "Card [card]/27"),  # digits beside a card
        ("Alice   555-123-4567  555-987-6543", "Alice   [phone]"),  # a table's columns
        ("ID 123456 (555) 123-4567", "ID [phone]"),
        ("on 2026-12-01 555-123-4567", "on 2026-12-01 [phone]"),  # a date beside a phone
        ("call (+44) 20 7946 0958", "call [phone]"),
        ("call 555 - 123 - 4567", "call [phone]"),
        ("tel ０９０ １２３４ ５６７８ ok", "tel [phone] ok"),  # digits of any script
        ("pi is 3.14159265358979", "pi is 3.14159265358979"),  # decimals are no phone
        ("mail jane.doe@example.com.", "mail [email]."),
    ],
)
def test_pii_masks_values_not_things_that_look_a_little_like_them(text: str, masked: str) -> None:
    from turnkit.plugins.pii import KINDS, _mask

    assert _mask(text, KINDS)[0] == masked


def test_pii_checks_of_a_growing_answer_mask_as_a_whole_check_would() -> None:
    """Streaming checks reuse the settled part of the text: never with another result; and
    what the hold lets out of the text so far is never changed by what comes after."""
    import random

    from turnkit.plugins.pii import KINDS, _mask, _Streaming

    plugin = PiiRedaction()
    pieces = ["word", "the", "(555) 123-4567", "+47 912 34 567", "4111 1111 1111 1111",
              "jane.doe@example.com", "2026-12-01", "1 000 000", "12", "-", "(", ")", ".",
              "1234 5678 9012 3456", "a.b.c", "x" * 70, "9" * 40, "y" * 300, "東京。",
              "０９０ １２３４", "2026-12-01 10:30", "/", "(+44) 20", ","]  # fmt: skip
    rng = random.Random(7)
    for round_ in range(60):
        text = "".join(rng.choice(pieces) + rng.choice([" ", "  ", "", ", ", "\n"])
                       for _ in range(rng.randint(5, 60)))  # fmt: skip
        final = _mask(text, KINDS)[0]
        streaming, settled = _Streaming(), _Streaming()
        step = rng.randint(1, 9)
        for end in [*range(step, len(text), step), len(text)]:
            assert streaming.mask(f"t{round_}", text[:end], KINDS) == _mask(text[:end], KINDS)
            shown = text[: end - plugin.answer_hold(text[:end])]
            assert final.startswith(_mask(shown, KINDS)[0]), (text, end)
            # What the runtime checks: the text less the hold, which may shrink.
            assert settled.mask(f"s{round_}", shown, KINDS) == _mask(shown, KINDS)


class BlocksTooLate(Plugin):
    name: ClassVar[str] = "blocks-too-late"

    async def on_event(self, ctx: PluginContext, event: DurableEvent) -> None:
        if event.type == "done":
            raise GuardrailBlockedError("too late", plugin="x", checkpoint="answer", kind="k")


async def test_a_block_raised_after_the_ending_leaves_the_turn_as_it_ended(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([ModelStep.text_reply("Hello.")])
    async with _runtime(tmp_path, Agent(model=model, plugins=[BlocksTooLate()])) as rt:
        events = await collect_events(rt.execute_message("s1", "hi"))
        record = await rt.turn(events[0].turn_id)  # type: ignore[union-attr]
    assert (events[-1].type, record.status) == ("done", "succeeded")


async def test_a_structured_tool_result_is_masked_string_by_string(tmp_path: Path) -> None:
    @tool
    async def contacts(team: str) -> dict[str, object]:
        """A team's contacts."""
        return {
            "note": "Call:\n5551234567",
            "a@x.example": 1,
            "b@y.example": 2,
            "cards": ["card\t4111 1111 1111 1111"],
        }

    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("contacts", team="ops")), ModelStep.text_reply("Done.")]
    )
    agent = Agent(model=model, tools=[contacts], plugins=[PiiRedaction()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "contacts?"))
    [done] = [e for e in events if e.type == "tool.completed"]
    assert done.result.output == {  # type: ignore[union-attr]
        "note": "Call:\n[phone]",  # a line break before it hides nothing
        "[email]": 1,
        "[email]'": 2,  # two keys masked alike both stay
        "cards": ["card\t[card]"],
    }
    sent = str([m.content for m in model.calls[1].messages])
    for secret in ("5551234567", "4111", "@x.example"):
        assert secret not in sent


class Careless(Plugin):
    """A plugin that is not required, making the mistakes plugins make."""

    name: ClassVar[str] = "careless"

    async def after_tool_call(
        self, ctx: PluginContext, call: ToolCall, result: ToolResultBlock
    ) -> None:
        await ctx.emit("seen", {"tags": {1, 2}})  # type: ignore[dict-item]  # a set: not JSON

    async def check_tool_result(
        self, ctx: PluginContext, call: ToolCall, text: str
    ) -> Verdict | None:
        return Verdict(action="allow", kind=None)  # type: ignore[arg-type]

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        return Verdict(action="deny", kind="x")  # type: ignore[arg-type]

    async def after_model_response(self, ctx: PluginContext, view: ModelCallView) -> None:
        raise GuardrailBlockedError("not mine to raise", plugin="x", checkpoint="answer", kind="y")


async def test_a_plugin_that_is_not_required_cannot_break_the_log_or_end_the_turn(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [ModelStep.tool_call_reply(call("ticket", ref="x")), ModelStep.text_reply("All done.")]
    )
    agent = Agent(model=model, tools=[ticket], plugins=[Careless()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "hi"))
        turn_id = events[0].turn_id  # type: ignore[union-attr]
        stored = [e.seq async for e in rt.store.read_events(turn_id)]
        rows = await rt.audit(turn_id)
    assert events[-1].status == "succeeded"  # type: ignore[union-attr]
    # Every durable event has its seq, none skipped, as stored and as streamed.
    assert stored == list(range(1, len(stored) + 1))
    streamed = [e.seq for e in events if isinstance(e, DurableEvent)]
    assert streamed == stored
    assert not [e for e in events if isinstance(e, GuardrailEvent)]  # no verdict was valid
    failures = [r.plugin_payloads["careless"] for r in rows if r.plugin_payloads]
    hooks = {f["hook"] for f in failures}  # type: ignore[index]
    assert hooks == {"after_model_response", "after_tool_call", "check_answer", "check_tool_result"}
    errors = " ".join(str(f["error"]) for f in failures)  # type: ignore[index]
    assert "allow, redact or block, not 'deny'" in errors
    assert "`kind` is a string, not None" in errors


def test_a_verdict_checks_its_fields_when_it_is_made() -> None:
    with pytest.raises(ValueError, match="not 'deny'"):
        Verdict(action="deny", kind="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`kind` is a string"):
        Verdict(action="allow", kind=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs the `replacement`"):
        Verdict(action="redact", kind="email")
    with pytest.raises(TypeError, match="`replacement` is a string"):
        Verdict(action="allow", kind="email", replacement=3)  # type: ignore[arg-type]


class HoldsAllThenBlocks(Plugin):
    """Holds the whole answer back, then refuses it once it is complete."""

    name: ClassVar[str] = "holds-all-then-blocks"

    def answer_hold(self, text: str) -> int:
        return len(text)

    async def check_answer(self, ctx: PluginContext, text: str) -> Verdict | None:
        return Verdict(action="block", kind="policy") if text.endswith("secret.") else None


async def test_a_finished_answer_a_guardrail_refuses_is_billed_what_the_provider_reported(
    tmp_path: Path,
) -> None:
    """The call finished (the provider said what it cost) before its answer was refused."""
    answer = ModelStep(text="Here is the secret.", usage=Usage(input_tokens=1234, output_tokens=56))
    agent = Agent(model=ScriptedModel([answer]), plugins=[HoldsAllThenBlocks()])
    async with _runtime(tmp_path, agent) as rt:
        events = await collect_events(rt.execute_message("s1", "tell me"))
        rows = await rt.audit(events[-1].turn_id)
    assert events[-1].error_code == "guardrail-blocked"  # type: ignore[union-attr]
    [refused] = [r for r in rows if r.call is not None and r.call.outcome == "error"]
    assert refused.call is not None
    assert (refused.call.input_tokens, refused.call.output_tokens) == (1234, 56)
