"""A takeover that only writes the ending names the session from the masked message."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from tests.helpers import turn_status, until
from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.errors import LeaseLostError
from turnkit.ids import TurnId
from turnkit.plugins.pii import PiiRedaction
from turnkit.runtime.driver import TurnDriver
from turnkit.telemetry import Recorder
from turnkit.testing import ModelStep, ScriptedModel

LONG = "Please draft a short and friendly note for the team about the offsite"
MESSAGE = f"{LONG}, then write to ada@example.com"


async def test_a_takeover_that_only_writes_the_ending_names_from_the_masked_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settle = TurnDriver._settle
    died: list[TurnId] = []

    async def die_once(self: TurnDriver, rec: Recorder) -> None:
        if not died:
            died.append(rec.turn_id)
            raise LeaseLostError("as if the process died before writing the ending")
        await settle(self, rec)

    monkeypatch.setattr(TurnDriver, "_settle", die_once)
    db = tmp_path / "naming.db"
    config = RuntimeConfig(database_url=f"sqlite:///{db}", lease_ttl_s=1.0)
    utility = ScriptedModel([ModelStep.text_reply("Offsite note")], repeat_last=True)
    agent = Agent(
        model=ScriptedModel([ModelStep.text_reply("Done.")], repeat_last=True),
        utility_model=utility,
        plugins=[PiiRedaction(check_input=True)],
        skip_stages=frozenset({"anchor-plan"}),
    )
    async with SessionRuntime(agent=agent, config=config) as first:
        submission = await first.start("s1", MESSAGE)
        await until(lambda: bool(died), "the first driver reaches the ending")
    assert (await turn_status(db, submission.turn_id)) == "running"
    later = dataclasses.replace(config, recover_in_process=True)
    async with SessionRuntime(agent=agent, config=later) as second:
        async with asyncio.timeout(20):
            while (await second.turn(submission.turn_id)).status == "running":
                await asyncio.sleep(0.05)
        await second.wait_background()
    assert utility.calls, "the naming call"
    for request in utility.calls:
        sent = " ".join(str(m.content) for m in request.messages)
        assert "ada@example.com" not in sent, request.purpose
