"""Every example runs as written (offline) and prints what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))
EXPECT = {
    "01_hello_turn.py": ["turn.started", "done", "answer: Hello! I am a scripted model."],
    "02_tools_and_cascade.py": [
        "provider.cascade",
        "toolFallbackStep",
        "answer: ACME is at $12.50",
    ],
    "agent_as_tool.py": [
        "progress: asked shipping",
        "progress: shipping: track_parcel",
        "refunds answered: {'eligible': False, 'reason': 'it has not arrived yet'}",
        "shipping answered: Order A7 is out for delivery and arrives today.",
        "answer: Your order A7 arrives today; a refund can wait until it has arrived.",
        "ada's sessions: ['desk-1']",
        "shipping answered in a session of desk-1: desk-1",
        "refunds answered in a session of desk-1: desk-1",
        "specialist sessions left after deleting desk-1: 0",
    ],
    "approval.py": [
        "approval.requested",
        "status: awaiting_approval",
        "tool.completed",
        "status: succeeded",
        "answer: Ada got her 40 EUR.",
    ],
    "plugin.py": [
        "streamed: ACME trades at 12.50 USD, no gains [—]. I could not place the order.",
        "plugin event: plugin.house-rules.tool-used {'tool': 'stock_price'}",
        "denied: denied by house-rules: only traders may place orders",
        "guardrail: promise redact",
        "audit: [{'house-rules': {'tool': 'stock_price', 'ok': True}}",
        "answer: ACME trades at 12.50 USD, no gains [—]. I could not place the order.",
        "cited: stock_price https://quotes.example/ACME",
        "note sent: True",
    ],
    "departments_budget.py": [
        "refused: budget-policy-missing",
        "refused: agent-not-found",
        "refused: model-not-allowed",
        "sessions written: 0",
        "rob (succeeded): The assay looks stable.",
        "paused: department sales (month)",
        "status: awaiting_budget",
        "resumed: True",
        "ann (succeeded): North has 12 deals worth 340,000 EUR.",
        "usage sales: 1 turn(s)",
    ],
    "structured_answer.py": [
        'narration: {"team": "billing", "summary": "Charged twice for May"}',
        "outputCheck attempt 0: valid=False urgent: Field required",
        "outputCheck attempt 1: valid=True",
        "routed to billing, urgent=True: Charged twice for May",
    ],
    "specialist_approval.py": [
        "front desk waits: awaiting_approval",
        "asked by: refunds · its turn waits too",
        'card: refunds: Run refund with amount_eur=30, order_id="A7"',
        "answer: Done: 30 EUR are on their way back to you.",
        "front-desk: succeeded, approved by sam",
        "refunds: succeeded, approved by sam",
    ],
    "supervisor_approval.py": [
        "customer sees: approval.requested",
        "answered by role: supervisor",
        "customer approves: 403 approver-required",
        "supervisor's inbox: [('orders-ada', 'Run refund with amount=\"80\", order_id=\"A1\"')]",
        "supervisor approves: 202",
        "answer: Your 80 EUR refund on A1 is on its way.",
        "approved by: [('sam', 'approve')]",
    ],
    "two_agents.py": [
        "[general v",
        "] Hello! Ask me anything.",
        "tool -> {'customer': 'ada', 'open': [120, 80], 'total_eur': 200}",
        "[billing v",
        "] You have two open invoices, 200 EUR in total.",
        "billing call settings: {'temperature': 0.1, 'seed': 7}",
    ],
}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TURNKIT_MODEL"}
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    for needle in EXPECT.get(path.name, []):
        assert needle in done.stdout, f"{needle!r} missing from:\n{done.stdout}"


def test_every_example_has_expectations() -> None:
    assert {p.name for p in EXAMPLES} <= set(EXPECT)
