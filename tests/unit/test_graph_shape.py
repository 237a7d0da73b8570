"""The compiled turn graph has the four stages' edges, as LangGraph draws them.

Anchor-plan and the tool-loop hand over with `Command(goto=...)`, so their edges come from
the nodes' return annotations: a wrong annotation would drop them from the drawing.
"""

from __future__ import annotations

from turnkit.graph import compile_turn_graph


def test_the_graph_draws_the_four_stages_and_their_hand_overs() -> None:
    drawn = compile_turn_graph(None).get_graph()
    edges = {(edge.source, edge.target) for edge in drawn.edges}
    assert edges == {
        ("__start__", "anchor-plan"),
        ("__start__", "tool-loop"),
        ("__start__", "synthesize"),
        ("anchor-plan", "tool-loop"),
        ("anchor-plan", "synthesize"),
        ("tool-loop", "tool-loop"),
        ("tool-loop", "synthesize"),
        ("synthesize", "post-turn"),
        ("post-turn", "__end__"),
    }
