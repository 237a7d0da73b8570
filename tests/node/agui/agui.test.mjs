// turnkit's AG-UI endpoint driven by the official client: @ag-ui/client's HttpAgent (with
// its own event verifier) runs each scenario, and every event it receives is checked
// against @ag-ui/core's schemas. Started by tests/protocols/test_agui_node.py, which serves
// the app on AGUI_URL with the agents `tools`, `approval`, `approval-edit`, `reconnect`,
// `steady`, `oversized`, `cascade`, `thinking`, `approval-usage`, `question`,
// `fails-after-tool`, `asks` (it asks `shipping` as a tool) and `filtered`.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

const BASE = process.env.AGUI_URL;
const HOLD_TEXT = process.env.AGUI_HOLD_TEXT;
assert.ok(BASE && HOLD_TEXT, "set AGUI_URL and AGUI_HOLD_TEXT");

/** A fetch that notes, in order, the SSE `id` (or null) of each data frame it passes on. */
function recordingFetch(seen) {
  return async (url, init) => {
    const response = await fetch(url, init);
    if (!response.ok || !response.body) return response;
    const decoder = new TextDecoder();
    let buffer = "";
    const body = response.body.pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          buffer += decoder.decode(chunk, { stream: true });
          assert.ok(!buffer.includes("\r"), "lines end with \\n only");
          const frames = buffer.split("\n\n");
          buffer = frames.pop();
          for (const frame of frames) {
            const lines = frame.split("\n").filter((line) => line && !line.startsWith(":"));
            if (!lines.some((line) => line.startsWith("data: "))) {
              assert.deepEqual(lines, [], `a frame without data: ${frame}`);
              continue;
            }
            const id = lines.find((line) => line.startsWith("id: "));
            seen.ids.push(id ? id.slice(4) : null);
          }
          controller.enqueue(chunk);
        },
      }),
    );
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

function newAgent(name, messages = []) {
  const seen = { ids: [] }; // the current response's frame ids
  const agent = new HttpAgent({
    url: `${BASE}/api/agui/run`,
    threadId: `thread-${randomUUID()}`,
    initialMessages: messages,
    fetch: recordingFetch(seen),
  });
  return { agent, seen, forwardedProps: { agent: name } };
}

function userMessage(content) {
  return { id: `user-${randomUUID()}`, role: "user", content };
}

/** The client's own abort ends a run with this event; no frame carried it. */
const isClientAbort = (event) => event.type === "RUN_ERROR" && event.code === "abort";

/**
 * Run once. Every event must fit the schema and carry an integer-millisecond timestamp
 * (checked after the run: the client logs and swallows errors thrown by subscribers).
 */
async function run(agent, parameters, onEvent = () => {}) {
  const events = [];
  const problems = [];
  let failure;
  await agent.runAgent(parameters, {
    onEvent({ event }) {
      events.push(event);
      if (isClientAbort(event)) return;
      const checked = EventSchema.safeParse(event);
      if (!checked.success) problems.push(`${event.type} does not fit: ${checked.error}`);
      if (!Number.isInteger(event.timestamp)) problems.push(`${event.type} at ${event.timestamp}`);
      onEvent(event);
    },
    onRunFailed({ error }) {
      failure = error;
    },
  });
  assert.deepEqual(problems, []);
  return { events, failure };
}

function lastAssistantText(agent) {
  const texts = agent.messages.filter((m) => m.role === "assistant" && m.content);
  return texts.at(-1)?.content;
}

function assertUniqueIds(agent) {
  const ids = agent.messages.map((m) => m.id);
  assert.equal(new Set(ids).size, ids.length, `duplicate message ids: ${ids}`);
}

test("a rung that fails over leaves its message marked discarded", async () => {
  const { agent, forwardedProps } = newAgent("cascade", [userMessage("Say hello")]);
  const { events, failure } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(failure, undefined);
  assert.equal(events.at(-1).type, "RUN_FINISHED");
  const assistant = agent.messages.filter((m) => m.role === "assistant");
  assert.deepEqual(
    assistant.map((m) => [
      m.content,
      m.metadata?.turnkit?.discarded ?? false,
      m.metadata?.turnkit?.answer ?? false,
    ]),
    [["Partial text before ", true, false], ["Hello from the second rung.", false, true]],
  );
  const shown = assistant.filter((m) => !m.metadata?.turnkit?.discarded).map((m) => m.content);
  assert.deepEqual(shown, ["Hello from the second rung."]);
  const custom = events.find((e) => e.type === "CUSTOM" && e.name === "turnkit.provider.cascade");
  assert.equal(custom.value.to_model, "second");
});

test("a tool-using turn", async () => {
  const { agent, forwardedProps } = newAgent("tools", [userMessage("What is 2 + 3?")]);
  const { events, failure } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(failure, undefined);
  assert.equal(events[0].type, "RUN_STARTED");
  const end = events.at(-1);
  assert.equal(end.type, "RUN_FINISHED");
  assert.equal(end.outcome.type, "success");
  assert.ok(end.result.usage.modelCalls >= 2);
  assert.ok(!("asked" in end.result.usage), "a turn that asked no agent has no `asked`");
  const last = agent.messages.at(-1);
  assert.ok(!("filtered" in last.metadata.turnkit) && !("filtered" in end.result));
  const steps = events.filter((e) => e.type === "STEP_STARTED").map((e) => e.stepName);
  assert.deepEqual(steps, ["anchor-plan", "tool-loop", "tool-loop", "synthesize", "post-turn"]);

  const [user, narration, result, answer] = agent.messages;
  assert.equal(user.role, "user");
  assert.equal(narration.role, "assistant");
  assert.equal(narration.content, "Adding.");
  assert.equal(narration.toolCalls.length, 1);
  const [toolCall] = narration.toolCalls;
  assert.equal(toolCall.function.name, "add");
  assert.deepEqual(JSON.parse(toolCall.function.arguments), { a: 2, b: 3 });
  assert.equal(result.role, "tool");
  assert.equal(result.toolCallId, toolCall.id);
  assert.equal(result.content, "5");
  assert.equal(answer.role, "assistant");
  assert.equal(answer.content, "The sum is 5.");
  assert.equal(agent.messages.length, 4);
  assertUniqueIds(agent);
});

test("an approval round trip: interrupt, then resume", async () => {
  const { agent, forwardedProps } = newAgent("approval", [userMessage("Send Bob 5 EUR")]);
  const first = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(first.failure, undefined);
  const paused = first.events.at(-1);
  assert.equal(paused.type, "RUN_FINISHED");
  assert.equal(paused.outcome.type, "interrupt");
  assert.equal(agent.pendingInterrupts.length, 1);
  const [interrupt] = agent.pendingInterrupts;
  assert.equal(interrupt.reason, "tool_call");
  assert.equal(interrupt.metadata.turnkit.kind, "approval");
  assert.deepEqual(interrupt.metadata.turnkit.arguments, { amount: 5, to: "Bob" });
  const call = agent.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.id === interrupt.toolCallId);
  assert.equal(call.function.name, "transfer");
  assert.ok(!agent.messages.some((m) => m.role === "tool"), "nothing ran before the approval");

  const resume = [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }];
  const second = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps, resume });
  assert.equal(second.failure, undefined);
  assert.equal(second.events[0].type, "RUN_STARTED");
  // The step the pause left open is open again, so its STEP_FINISHED verifies.
  assert.deepEqual([second.events[1].type, second.events[1].stepName], ["STEP_STARTED", "tool-loop"]);
  assert.ok(second.events.some((e) => e.type === "STEP_FINISHED" && e.stepName === "tool-loop"));
  assert.equal(second.events.at(-1).type, "RUN_FINISHED");
  assert.equal(second.events.at(-1).outcome.type, "success");
  assert.ok(!second.events.some((e) => e.type === "TOOL_CALL_START"), "no second proposal");
  assert.equal(second.events[0].metadata.turnkit.turnId, paused.outcome.interrupts[0].metadata.turnkit.turnId);
  assert.deepEqual(agent.pendingInterrupts, []);
  const result = agent.messages.find((m) => m.role === "tool");
  assert.equal(result.toolCallId, interrupt.toolCallId);
  assert.equal(result.content, "sent 5 EUR to Bob");
  assert.equal(lastAssistantText(agent), "Sent.");
  assertUniqueIds(agent);
});

test("an approval with editedArgs runs the call with the person's arguments", async () => {
  const { agent, forwardedProps } = newAgent("approval-edit", [userMessage("Send Bob 500 EUR")]);
  const first = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(first.failure, undefined);
  const [interrupt] = agent.pendingInterrupts;
  assert.deepEqual(interrupt.responseSchema.properties.editedArgs, { type: "object" });
  const payload = { approved: true, editedArgs: { amount: 50, to: "Bob" } };
  const resume = [{ interruptId: interrupt.id, status: "resolved", payload }];
  const second = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps, resume });
  assert.equal(second.failure, undefined);
  assert.equal(second.events.at(-1).outcome.type, "success");
  const result = agent.messages.find((m) => m.role === "tool");
  assert.equal(result.content, "sent 50 EUR to Bob");
  assert.equal(lastAssistantText(agent), "Sent 50.");
});

test("a reconnect mid-text ends with the text of an uninterrupted read", async () => {
  const steady = newAgent("steady", [userMessage("Tell me")]);
  const whole = await run(steady.agent, { runId: `run-${randomUUID()}`, forwardedProps: steady.forwardedProps });
  assert.equal(whole.failure, undefined);
  assert.equal(lastAssistantText(steady.agent), HOLD_TEXT);

  // The `reconnect` agent's model holds after two pieces of text until /test/release.
  const { agent, seen, forwardedProps } = newAgent("reconnect", [userMessage("Tell me")]);
  const runId = `run-${randomUUID()}`;
  let contents = 0;
  const first = await run(agent, { runId, forwardedProps }, (event) => {
    if (event.type === "TEXT_MESSAGE_CONTENT" && ++contents === 1) agent.abortRun();
  });
  const received = first.events.filter((event) => !isClientAbort(event));
  const lastId = seen.ids.slice(0, received.length).filter((id) => id !== null).at(-1);
  assert.ok(lastId, "a durable event arrived before the text");
  const partial = agent.messages.find((m) => m.role === "assistant");
  assert.ok(partial && HOLD_TEXT.startsWith(partial.content) && partial.content !== HOLD_TEXT);

  agent.headers = { ...agent.headers, "Last-Event-ID": lastId };
  seen.ids = [];
  const second = await run(agent, { runId, forwardedProps }, (event) => {
    if (event.type === "RUN_STARTED") fetch(`${BASE}/test/release`, { method: "POST" });
  });
  assert.equal(second.failure, undefined);
  assert.equal(second.events[0].type, "RUN_STARTED");
  assert.equal(second.events.at(-1).type, "RUN_FINISHED");
  const starts = second.events.filter((e) => e.type === "TEXT_MESSAGE_START");
  assert.deepEqual(starts.map((e) => e.messageId), [partial.id]);
  assert.equal(lastAssistantText(agent), lastAssistantText(steady.agent));
  assert.equal(agent.messages.filter((m) => m.role === "assistant").length, 1);
  assertUniqueIds(agent);
  const newIds = seen.ids.filter((id) => id !== null).map(Number);
  assert.ok(newIds.length > 0 && newIds[0] === Number(lastId) + 1, `ids after ${lastId}: ${newIds}`);
});

test("an oversized tool result arrives as a placeholder and the run finishes", async () => {
  const { agent, seen, forwardedProps } = newAgent("oversized", [userMessage("Write the report")]);
  const { events, failure } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(failure, undefined);
  assert.equal(events.at(-1).type, "RUN_FINISHED");
  assert.equal(events.at(-1).outcome.type, "success");
  const result = events.find((e) => e.type === "TOOL_CALL_RESULT");
  assert.match(result.content, /^\[a result of \d+ bytes, too large to stream\]$/);
  assert.ok(seen.ids[events.indexOf(result)] !== null); // it keeps its frame's id
  const [tool] = agent.messages.filter((m) => m.role === "tool"); // the call is answered
  assert.equal(tool.content, result.content);
  assert.equal(lastAssistantText(agent), "The report is written.");
  assertUniqueIds(agent);
});

test("a thinking summary arrives as a reasoning message", async () => {
  const { agent, forwardedProps } = newAgent("thinking", [userMessage("2+2?")]);
  const { events, failure } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(failure, undefined);
  assert.equal(events.at(-1).type, "RUN_FINISHED");
  const reasoning = agent.messages.filter((m) => m.role === "reasoning");
  assert.deepEqual(reasoning.map((m) => m.content), ["It added the numbers."]);
  assert.equal(lastAssistantText(agent), "Four. ".repeat(40));
  assertUniqueIds(agent);
});

const tokens = (end) => (end.usage ?? []).reduce((sum, u) => sum + u.totalTokens, 0);

test("a failed run's RUN_ERROR carries the usage of the calls made before the failure", async () => {
  const { agent, forwardedProps } = newAgent("fails-after-tool", [userMessage("What is 2 + 3?")]);
  const { events } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  const error = events.at(-1);
  assert.equal(error.type, "RUN_ERROR");
  assert.equal(error.code, "provider-error");
  assert.equal(error.usage?.length, 1, "RUN_ERROR reports the usage before the failure");
  assert.ok(tokens(error) > 0);
  assert.equal(error.usage[0].model, "scripted");
});

test("the runs of a paused and resumed turn report its usage once", async () => {
  const { agent, forwardedProps } = newAgent("approval-usage", [userMessage("Send Bob 5 EUR")]);
  const first = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  const paused = first.events.at(-1);
  assert.equal(paused.outcome.type, "interrupt");
  const [interrupt] = agent.pendingInterrupts;
  const resume = [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }];
  const second = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps, resume });
  const done = second.events.at(-1);
  assert.equal(done.outcome.type, "success");
  const turn = done.result.usage;
  assert.equal(turn.modelCalls, 2);
  assert.equal(tokens(paused) + tokens(done), turn.inputTokens + turn.outputTokens);
});

test("a question is an input_required interrupt the next run answers", async () => {
  const { agent, forwardedProps } = newAgent("question", [userMessage("Paint it")]);
  const first = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(first.events.at(-1).outcome.type, "interrupt");
  const [interrupt] = agent.pendingInterrupts;
  assert.equal(interrupt.reason, "input_required");
  assert.equal(interrupt.message, "Which colour?");
  assert.deepEqual(interrupt.responseSchema.properties.answer.examples, ["red", "blue"]);
  const asked = agent.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.id === interrupt.toolCallId);
  assert.equal(asked.function.name, "ask_user");
  const resume = [{ interruptId: interrupt.id, status: "resolved", payload: { answer: "blue" } }];
  const second = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps, resume });
  assert.equal(second.failure, undefined);
  assert.equal(second.events.at(-1).outcome.type, "success");
  assert.deepEqual(agent.pendingInterrupts, []);
  const answered = agent.messages.find((m) => m.role === "tool" && m.toolCallId === interrupt.toolCallId);
  assert.ok(answered, "the question's call has its result");
  assert.equal(lastAssistantText(agent), "Blue it is.");
  assertUniqueIds(agent);
});

test("a turn that asked an agent reports what it spent, apart from its own", async () => {
  const { agent, forwardedProps } = newAgent("asks", [userMessage("Where is A7?")]);
  const { events, failure } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(failure, undefined);
  const end = events.at(-1);
  assert.equal(end.type, "RUN_FINISHED");
  assert.equal(end.outcome.type, "success");
  const spent = {
    turns: 1, modelCalls: 1, inputTokens: 12, outputTokens: 3, cachedTokens: 0, costUsd: 0.25,
  };
  assert.deepEqual(end.result.usage.asked, spent);
  assert.equal(end.result.usage.costUsd, 0.125); // its own calls only
  assert.equal(tokens(end), 14); // AG-UI's `usage`: its own calls too
  const usage = events.find((e) => e.type === "CUSTOM" && e.name === "turnkit.usage");
  assert.equal(usage.value.asked.cost_usd, 0.25);
  assert.equal(lastAssistantText(agent), "It arrives today.");
});

test("an answer a content filter cut is marked, on its message and on the run", async () => {
  const { agent, forwardedProps } = newAgent("filtered", [userMessage("Tell me")]);
  const { events, failure } = await run(agent, { runId: `run-${randomUUID()}`, forwardedProps });
  assert.equal(failure, undefined);
  const end = events.at(-1);
  assert.equal(end.type, "RUN_FINISHED");
  assert.equal(end.outcome.type, "success");
  assert.equal(end.result.filtered, true);
  const answer = agent.messages.find((m) => m.metadata?.turnkit?.answer);
  assert.equal(answer.content, "Here is the first ");
  assert.equal(answer.metadata.turnkit.filtered, true);
});
