"""A refund a supervisor approves, not the customer whose chat asked for it.

Shows: `@tool(approval=..., approver_role="supervisor")` with a policy on the validated
arguments (the model writes the amount as text, the policy compares a number); the
quickstart app with an `auth` dependency naming the caller and their roles; the customer's
own approval refused with 403 `approver-required`; the supervisor's inbox
(`GET /api/harness/pauses`); the supervisor approving over HTTP; the customer's stream
going on to the answer; the audit naming who approved.

Run:  .venv/bin/python examples/supervisor_approval.py   (offline, scripted model, loopback)
It serves the app with uvicorn: install the server extra first,
`.venv/bin/pip install -e ".[fastapi]"` (`scripts/test.sh` installs it; `scripts/demo.sh` does not).
"""

import asyncio
import json
import os
import socket
import tempfile
from collections.abc import Mapping
from typing import Annotated, Any

import httpx
import uvicorn
from fastapi import Header

from turnkit import Agent, Organisation, Principal, RuntimeConfig, SessionRuntime, tool
from turnkit.quickstart import create_app
from turnkit.testing import ModelStep, ScriptedModel, call

API = "/api/harness"


def over_fifty(name: str, args: Mapping[str, Any]) -> bool:
    return bool(args["amount"] > 50)


@tool(approval=over_fifty, approver_role="supervisor")
async def refund(order_id: str, amount: int) -> str:
    """Refund part of an order (a supervisor approves more than 50 EUR)."""
    return f"refunded {amount} EUR on {order_id}"


async def caller(
    x_user: Annotated[str, Header()], x_role: Annotated[str | None, Header()] = None
) -> Principal:
    """Who calls, as a proxy in front of the app vouches (never trust these from a browser)."""
    return Principal(id=x_user, organisation="shop", roles=frozenset({x_role} - {None}))


CUSTOMER = {"x-user": "ada"}
SUPERVISOR = {"x-user": "sam", "x-role": "supervisor"}


async def until_paused(http: httpx.AsyncClient, text: str) -> dict[str, Any]:
    """Send the customer's message; its stream up to the approval it waits for."""
    body = {"content": text}
    url = f"{API}/sessions/orders-ada/execute"
    async with http.stream("POST", url, json=body, headers=CUSTOMER) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                print("customer sees:", event["type"])
                if event["type"] == "approval.requested":
                    return dict(event)  # the stream stays open while the turn waits
    raise RuntimeError("the turn never asked")


async def main() -> None:
    model = ScriptedModel(
        [
            ModelStep.tool_call_reply(call("refund", order_id="A1", amount="80")),
            ModelStep.text_reply("Your 80 EUR refund on A1 is on its way."),
        ]
    )
    agent = Agent(model=model, tools=[refund], skip_stages=frozenset({"anchor-plan"}))
    db = os.path.join(tempfile.mkdtemp(), "shop.db")
    runtime = SessionRuntime(
        agent=agent,
        tenancy=[Organisation(name="shop")],
        config=RuntimeConfig(database_url=f"sqlite:///{db}"),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(runtime, auth=caller), log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(1000):  # up to 10 s for the server to listen
        if server.started:
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("the server did not start")
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            asked = await until_paused(http, "Please refund 80 EUR on order A1")
            print("waits for:", asked["summary"], "· answered by role:", asked["approver_role"])
            answer = f"{API}/turns/{asked['turn_id']}/approvals/{asked['request_id']}"
            own = await http.post(answer, json={"decision": "approve"}, headers=CUSTOMER)
            print("customer approves:", own.status_code, own.json()["code"])
            inbox = (await http.get(f"{API}/pauses", headers=SUPERVISOR)).json()["pending"]
            print("supervisor's inbox:", [(p["sessionId"], p["summary"]) for p in inbox])
            sam = await http.post(answer, json={"decision": "approve"}, headers=SUPERVISOR)
            print("supervisor approves:", sam.status_code)
            rest = await http.get(
                f"{API}/turns/{asked['turn_id']}/stream",
                headers={**CUSTOMER, "Last-Event-ID": str(asked["seq"])},
            )
            events = [json.loads(x[6:]) for x in rest.text.splitlines() if x.startswith("data: {")]
            done = [e for e in events if e["type"] == "message.complete"][-1]
            print("answer:", done["block"]["text"])
            audit = await http.get(f"{API}/turns/{asked['turn_id']}/audit", headers=CUSTOMER)
            rows = [r["payloads"]["pauseAnswer"] for r in audit.json()["rows"]
                    if r["payloads"].get("pauseAnswer")]  # fmt: skip
            print("approved by:", [(row["by"], row["decision"]) for row in rows])
    finally:
        server.should_exit = True
        await serving
        sock.close()


if __name__ == "__main__":
    asyncio.run(main())
