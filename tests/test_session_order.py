"""A session's turns are in the order its messages were sent, whatever their clocks said."""

from __future__ import annotations

from datetime import timedelta

from turnkit import Agent, RuntimeConfig, SessionRuntime
from turnkit.testing import FakeClock, ModelStep, ScriptedModel


async def test_turns_keep_the_order_they_were_sent_in(
    db: tuple[str, str | None], clock: FakeClock
) -> None:
    """Two messages committed in one order, stamped in the other.

    Two API processes whose clocks differ (or two sends racing, each stamped before it
    waited for the session's row) commit a later message with an earlier `created_at`.
    The session's order is the order of its inputs: the first message's turn is the one
    that runs (and whose approval the session shows); the second waits behind it.
    """
    url, schema = db
    config = RuntimeConfig(database_url=url, database_schema=schema, run_in_process=False)
    agent = Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")]))
    async with SessionRuntime(agent=agent, config=config, clock=clock) as runtime:
        first = await runtime.submit("s1", "first")
        clock._now -= timedelta(seconds=5)  # the next process's clock is behind this one's
        second = await runtime.submit("s1", "second")
        assert (first.input_seq, second.input_seq) == (1, 2)
        turns = await runtime.store.list_turns(first.session_id)
        assert [t.turn_id for t in turns] == [first.turn_id, second.turn_id]
        view = await runtime.view("s1")
        assert [t.turn_id for t in view.turns] == [first.turn_id]  # the one that runs
        assert [(q.turn_id, q.content) for q in view.queue] == [(second.turn_id, "second")]
        assert [q.turn_id for q in await runtime.queue("s1")] == [second.turn_id]
