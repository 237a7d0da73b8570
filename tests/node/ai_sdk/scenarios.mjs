// The official AI SDK client against turnkit's AI SDK routes.
// Run from tests/protocols/test_ai_sdk_node.py:
//   node scenarios.mjs <scenario> <base url> <package dir>
// The package dir (tests/node/ai_sdk for `ai` 6, tests/node/ai_sdk7 for `ai` 7) holds the
// installed client: its ai.mjs re-exports the `ai` its package-lock.json pins, so one
// file of scenarios runs against each version.
// Each scenario talks to its own server (its own scripted model); exit code 0 = passed.
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [scenario, base, packageDir] = process.argv.slice(2);
if (packageDir === undefined) throw new Error('usage: scenarios.mjs <scenario> <base url> <package dir>');
const {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  readUIMessageStream,
  validateUIMessages,
} = await import(pathToFileURL(join(resolve(packageDir), 'ai.mjs')).href);
const api = `${base}/api/chat`;
const DEADLINE_MS = 20_000;

function user(text, id = 'u1') {
  return { id, role: 'user', parts: [{ type: 'text', text }] };
}

function withDeadline(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), DEADLINE_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// Reads a chunk stream with readUIMessageStream; records the chunks; returns the last message.
async function read(stream, { message, until, onMessage } = {}) {
  const [forMessages, forChunks] = stream.tee();
  const chunks = [];
  const recording = (async () => {
    try {
      for await (const chunk of forChunks) chunks.push(chunk);
    } catch {
      // a dropped connection ends the recording too
    }
  })();
  const errors = [];
  let last;
  for await (const snapshot of readUIMessageStream({
    message,
    stream: forMessages,
    onError: error => errors.push(error),
  })) {
    last = snapshot;
    onMessage?.(snapshot);
    if (until?.(snapshot)) return { message: last, chunks, errors, stopped: true };
  }
  await recording;
  return { message: last, chunks, errors, stopped: false };
}

function send(transport, chatId, messages, extra = {}) {
  return transport.sendMessages({
    chatId,
    messages,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    ...extra,
  });
}

const withoutData = message => message.parts.filter(p => !p.type.startsWith('data-'));

async function toolTurn() {
  const transport = new DefaultChatTransport({ api });
  const stream = await send(transport, 'tools', [user('What is 2 + 3?')]);
  const { message, chunks, errors } = await withDeadline(read(stream), 'tool turn');
  assert.deepEqual(errors, []);
  assert.match(message.id, /^turn_/);
  assert.equal(message.role, 'assistant');
  const parts = withoutData(message);
  assert.deepEqual(
    parts.map(p => p.type),
    ['step-start', 'text', 'tool-add', 'step-start', 'text'],
  );
  assert.equal(parts[1].text, 'Adding.');
  assert.equal(parts[1].state, 'done');
  assert.equal(parts[2].state, 'output-available');
  assert.deepEqual(parts[2].input, { a: 2, b: 3 });
  assert.equal(parts[2].output, 5);
  assert.equal(parts[4].text, 'The sum is 5.');
  assert.equal(message.metadata.status, 'succeeded');
  assert.equal(message.metadata.turnId, message.id);
  assert.ok(message.metadata.usage.modelCalls >= 2);
  assert.ok(!('asked' in message.metadata.usage), 'a turn that asked no agent has no `asked`');
  const usage = message.parts.find(p => p.type === 'data-turnkit-usage');
  assert.equal(usage.data.type, 'usage');
  assert.equal(chunks.at(-1).type, 'finish');
  assert.equal(chunks.at(-1).finishReason, 'stop');
  await validateUIMessages({ messages: [user('What is 2 + 3?'), message] });
  // Just over: a client resuming now (it answered a pause elsewhere) gets the message whole.
  const again = await transport.reconnectToStream({ chatId: 'tools' });
  assert.ok(again, 'a turn that just ended is sent whole');
  const replayed = await withDeadline(read(again), 'the replayed turn');
  assert.equal(replayed.message.id, message.id);
  assert.deepEqual(withoutData(replayed.message), withoutData(message));
}

// A tool result larger than the server's frame bound: the part ends saying so, and on.
async function oversized() {
  const transport = new DefaultChatTransport({ api });
  const stream = await send(transport, 'big', [user('Write the report')]);
  const { message, chunks, errors } = await withDeadline(read(stream), 'oversized');
  assert.deepEqual(errors, []);
  assert.ok(!chunks.some(c => c.type === 'data-turnkit-frame-dropped'));
  const parts = withoutData(message);
  assert.deepEqual(parts.map(p => p.type), ['step-start', 'tool-report', 'step-start', 'text']);
  assert.equal(parts[1].state, 'output-error'); // the part ends, saying why
  assert.match(parts[1].errorText, /too large to stream/);
  assert.equal(parts[3].text, 'The report is written.');
  assert.equal(message.metadata.status, 'succeeded');
  await validateUIMessages({ messages: [user('Write the report'), message] });
}

class MemoryChat extends AbstractChat {
  constructor(init) {
    const state = {
      status: 'ready',
      error: undefined,
      messages: [],
      pushMessage: m => state.messages.push(m),
      popMessage: () => state.messages.pop(),
      replaceMessage: (i, m) => {
        state.messages[i] = m;
      },
      snapshot: thing => structuredClone(thing),
    };
    super({ ...init, state });
  }
  get messages() {
    return this.state.messages;
  }
}

async function waitFor(check, what) {
  const deadline = Date.now() + DEADLINE_MS;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise(resolve => setTimeout(resolve, 20));
  }
}

async function approval() {
  const errors = [];
  const chat = new MemoryChat({
    id: 'ops',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: error => errors.push(error),
  });
  await withDeadline(chat.sendMessage({ text: 'delete /tmp/x' }), 'first request');
  assert.deepEqual(errors, []);
  assert.equal(chat.messages.length, 2);
  const asked = chat.messages[1];
  const tool = asked.parts.find(p => p.type === 'tool-delete_file');
  assert.equal(tool.state, 'approval-requested');
  assert.deepEqual(tool.input, { path: '/tmp/x' });
  assert.equal(asked.metadata.status, 'awaiting_approval');

  await chat.addToolApprovalResponse({ id: tool.approval.id, approved: true });
  await waitFor(
    () =>
      chat.status === 'ready' &&
      chat.messages[1].parts.some(p => p.type === 'text' && p.text === 'Deleted.'),
    'the approved turn to finish',
  );
  assert.deepEqual(errors, []);
  assert.equal(chat.messages.length, 2); // the same assistant message ...
  const done = chat.messages[1];
  assert.equal(done.id, asked.id); // ... is the same turn
  const ran = done.parts.find(p => p.type === 'tool-delete_file');
  assert.equal(ran.state, 'output-available');
  assert.equal(ran.output, 'deleted /tmp/x');
  assert.equal(done.metadata.status, 'succeeded');
  await validateUIMessages({ messages: chat.messages });
}

// The predicate docs/protocols/ai-sdk.md gives: send once every approval asked is answered.
// (The SDK's own waits for every tool part of the step, but turnkit asks one at a time.)
function answeredEveryApprovalAsked({ messages }) {
  const last = messages.at(-1);
  if (last?.role !== 'assistant') return false;
  return (
    last.parts.some(p => p.state === 'approval-responded') &&
    !last.parts.some(p => p.state === 'approval-requested')
  );
}

async function twoApprovals() {
  const errors = [];
  const chat = new MemoryChat({
    id: 'ops2',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: answeredEveryApprovalAsked,
    onError: error => errors.push(error),
  });
  await withDeadline(chat.sendMessage({ text: 'delete /tmp/x and /tmp/y' }), 'first request');
  for (const path of ['/tmp/x', '/tmp/y']) {
    await waitFor(
      () =>
        chat.status === 'ready' &&
        chat.messages[1].parts.some(p => p.state === 'approval-requested'),
      `the approval for ${path}`,
    );
    const asked = chat.messages[1].parts.find(p => p.state === 'approval-requested');
    assert.deepEqual(asked.input, { path }); // one at a time, in call order
    const approved = path === '/tmp/y'; // deny the first: its denial comes streams later
    await chat.addToolApprovalResponse({ id: asked.approval.id, approved, reason: 'not x' });
  }
  await waitFor(
    () =>
      chat.status === 'ready' &&
      chat.messages[1].parts.some(p => p.type === 'text' && p.text === 'Deleted both.'),
    'the answer',
  );
  assert.deepEqual(errors, []);
  assert.equal(chat.messages.length, 2); // one assistant message: the same turn throughout
  const ran = chat.messages[1].parts.filter(p => p.type === 'tool-delete_file');
  assert.deepEqual(ran.map(p => [p.state, p.output]), [
    ['output-denied', undefined], // the person's denial, though asked two streams earlier
    ['output-available', 'deleted /tmp/y'],
  ]);
  assert.equal(chat.messages[1].metadata.status, 'succeeded');
  await validateUIMessages({ messages: chat.messages });
}

async function approvedThenDenied() {
  // The person approves; a plugin then denies the call: an error part, its reason kept.
  const errors = [];
  const chat = new MemoryChat({
    id: 'ops4',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: answeredEveryApprovalAsked,
    onError: error => errors.push(error),
  });
  await withDeadline(chat.sendMessage({ text: 'delete /tmp/x' }), 'first request');
  const asked = chat.messages[1].parts.find(p => p.state === 'approval-requested');
  await chat.addToolApprovalResponse({ id: asked.approval.id, approved: true });
  await waitFor(
    () =>
      chat.status === 'ready' &&
      chat.messages[1].parts.some(p => p.type === 'text' && p.text === 'It is frozen.'),
    'the answer',
  );
  assert.deepEqual(errors, []);
  const [denied] = chat.messages[1].parts.filter(p => p.type === 'tool-delete_file');
  assert.equal(denied.state, 'output-error');
  assert.match(denied.errorText, /deletions are frozen today/);
  assert.equal(denied.approval.approved, true);
  await validateUIMessages({ messages: chat.messages });
}

async function reloadPaused() {
  // The page that asked is gone; a new one (resume: true) gets the approval back.
  const first = new MemoryChat({ id: 'ops3', transport: new DefaultChatTransport({ api }) });
  await withDeadline(first.sendMessage({ text: 'delete /tmp/x' }), 'first request');
  const turnId = first.messages[1].id;
  const errors = [];
  const reloaded = new MemoryChat({
    id: 'ops3',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: answeredEveryApprovalAsked,
    onError: error => errors.push(error),
  });
  await withDeadline(reloaded.resumeStream(), 'the resumed stream');
  assert.deepEqual(errors, []);
  assert.equal(reloaded.messages.length, 1);
  const message = reloaded.messages[0];
  assert.equal(message.id, turnId);
  assert.equal(message.metadata.status, 'awaiting_approval');
  const asked = message.parts.find(p => p.state === 'approval-requested');
  assert.deepEqual(asked.input, { path: '/tmp/x' });
  await reloaded.addToolApprovalResponse({ id: asked.approval.id, approved: true });
  await waitFor(
    () =>
      reloaded.status === 'ready' &&
      reloaded.messages[0].parts.some(p => p.type === 'text' && p.text === 'Deleted.'),
    'the approved turn to finish',
  );
  assert.deepEqual(errors, []);
  assert.equal(reloaded.messages[0].metadata.status, 'succeeded');
  const ran = reloaded.messages[0].parts.filter(p => p.type === 'tool-delete_file');
  assert.deepEqual(ran.map(p => p.state), ['output-available']); // one part, not two
}

async function reconnect() {
  const transport = new DefaultChatTransport({ api });
  const held = 'The answer is fo'; // what the gated model writes before it waits
  const showsHeld = m => m.parts.some(p => p.type === 'text' && p.text === held);
  const stream = await send(transport, 'resume', [user('What is the answer?')]);
  const [firstPart, rest] = stream.tee();
  // The uninterrupted reader: everything, start to end.
  const uninterrupted = read(rest);
  // Read the first response up to the held text (mid-text) ...
  const early = await withDeadline(
    read(firstPart, { until: showsHeld }),
    'the held text',
  );
  assert.ok(early.stopped);

  // ... then reconnect, read a little, and drop that connection (a page reload) ...
  const dropped = new AbortController();
  const second = await transport.reconnectToStream({ chatId: 'resume', abortSignal: dropped.signal });
  assert.ok(second, 'a running turn has a stream to resume');
  const partial = await withDeadline(
    read(second, { until: showsHeld }),
    'the rebuilt held text',
  );
  assert.ok(partial.stopped);
  dropped.abort();

  // ... and reconnect again; the model goes on only once that stream shows the held text.
  const third = await transport.reconnectToStream({ chatId: 'resume' });
  let rebuilt;
  const shown = new Promise(resolve => {
    rebuilt = resolve;
  });
  const resumed = read(third, { onMessage: m => showsHeld(m) && rebuilt() });
  await withDeadline(shown, 'the held text, rebuilt again');
  const released = await fetch(`${base}/test/release`, { method: 'POST' });
  assert.equal(released.status, 200);
  const [whole, again] = await withDeadline(Promise.all([uninterrupted, resumed]), 'the ends');
  assert.deepEqual(whole.errors, []);
  assert.deepEqual(again.errors, []);
  assert.deepEqual(again.message, whole.message);
  const answer = whole.message.parts.filter(p => p.type === 'text').at(-1);
  assert.equal(answer.text, 'The answer is forty-two, after a careful look at every number.');

  // Within the rebuilt stream, no part starts twice and the held text came in one delta.
  const started = again.chunks.filter(c => c.type === 'text-start').map(c => c.id);
  assert.equal(new Set(started).size, started.length);
  const answerId = again.chunks.filter(c => c.type === 'text-end').at(-1).id;
  const deltas = again.chunks.filter(c => c.type === 'text-delta' && c.id === answerId);
  assert.equal(deltas[0].delta, held);
  assert.equal(deltas.map(d => d.delta).join(''), answer.text);
  assert.equal(again.chunks[0].type, 'start');
  assert.equal(again.chunks[0].messageId, whole.message.id);
}

// The first rung breaks mid-answer and the next one answers: the abandoned text part is
// marked discarded (its providerMetadata), and leaving such parts out shows the answer only;
// the answer's part is marked as the answer.
async function cascade() {
  const transport = new DefaultChatTransport({ api });
  const stream = await send(transport, 'cascade', [user('Say hello')]);
  const { message, errors } = await withDeadline(read(stream), 'cascade');
  assert.deepEqual(errors, []);
  const texts = message.parts.filter(p => p.type === 'text');
  assert.deepEqual(
    texts.map(p => [
      p.text,
      p.state,
      p.providerMetadata?.turnkit?.discarded ?? false,
      p.providerMetadata?.turnkit?.answer ?? false,
    ]),
    [
      ['Partial text before ', 'done', true, false],
      ['Hello from the second rung.', 'done', false, true],
    ],
  );
  const shown = texts.filter(p => !p.providerMetadata?.turnkit?.discarded).map(p => p.text);
  assert.deepEqual(shown, ['Hello from the second rung.']);
  const cascaded = message.parts.find(p => p.type === 'data-turnkit-provider.cascade');
  assert.equal(cascaded.data.to_model, 'second');
  assert.equal(message.metadata.status, 'succeeded');
  await validateUIMessages({ messages: [user('Say hello'), message] });
}

// A model that fails mid-answer: the chat reports the error, and the text it had written
// is ended, not left drawn as still streaming (the SDK stops reading at `error`).
async function failsMidText() {
  const errors = [];
  const chat = new MemoryChat({
    id: 'fails',
    transport: new DefaultChatTransport({ api }),
    onError: error => errors.push(error),
  });
  await withDeadline(chat.sendMessage({ text: 'Tell me' }), 'the failing turn');
  assert.equal(chat.status, 'error');
  assert.equal(errors.length, 1);
  const message = chat.messages[1];
  assert.equal(message.metadata.status, 'failed');
  const [text] = message.parts.filter(p => p.type === 'text');
  assert.equal(text.text, 'Partial answer that ');
  assert.equal(text.state, 'done');
  await validateUIMessages({ messages: chat.messages });
}

// Stop (the harness route's cancel) mid-answer: the message ends with the text so far, done.
async function stopped() {
  const errors = [];
  const chat = new MemoryChat({
    id: 'stop',
    transport: new DefaultChatTransport({ api }),
    onError: error => errors.push(error),
  });
  const held = 'The answer is fo';
  const sending = chat.sendMessage({ text: 'What is the answer?' });
  await waitFor(
    () => chat.messages[1]?.parts.some(p => p.type === 'text' && p.text === held),
    'the held text',
  );
  const cancelled = await fetch(`${base}/test/cancel/${chat.messages[1].id}`, { method: 'POST' });
  assert.equal(cancelled.status, 200);
  await withDeadline(sending, 'the stopped stream');
  assert.deepEqual(errors, []);
  assert.equal(chat.status, 'ready');
  const message = chat.messages[1];
  assert.equal(message.metadata.status, 'cancelled');
  const [text] = message.parts.filter(p => p.type === 'text');
  assert.equal(text.text, held);
  assert.equal(text.state, 'done');
  await validateUIMessages({ messages: chat.messages });
}

// One model response with two tool calls: two tool parts in one step, both with outputs.
async function twoTools() {
  const transport = new DefaultChatTransport({ api });
  const stream = await send(transport, 'two', [user('Add twice')]);
  const { message, errors } = await withDeadline(read(stream), 'two tools');
  assert.deepEqual(errors, []);
  const parts = withoutData(message);
  assert.deepEqual(parts.map(p => [p.type, p.state, p.output]), [
    ['step-start', undefined, undefined],
    ['tool-add', 'output-available', 3],
    ['tool-add', 'output-available', 7],
    ['step-start', undefined, undefined],
    ['text', 'done', undefined],
  ]);
  assert.equal(message.metadata.status, 'succeeded');
  await validateUIMessages({ messages: [user('Add twice'), message] });
}

// Approved, then the chat opened on another page just after the turn ended: the message
// comes whole, and the call's part is a valid one (no approval left without its answer).
async function approvedThenReloaded() {
  const first = new MemoryChat({
    id: 'ops5',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: answeredEveryApprovalAsked,
  });
  await withDeadline(first.sendMessage({ text: 'delete /tmp/x' }), 'first request');
  const asked = first.messages[1].parts.find(p => p.state === 'approval-requested');
  await first.addToolApprovalResponse({ id: asked.approval.id, approved: true });
  await waitFor(
    () =>
      first.status === 'ready' &&
      first.messages[1].parts.some(p => p.type === 'text' && p.text === 'Deleted.'),
    'the approved turn to finish',
  );
  const reloaded = new MemoryChat({ id: 'ops5', transport: new DefaultChatTransport({ api }) });
  await withDeadline(reloaded.resumeStream(), 'the resumed stream');
  assert.equal(reloaded.messages.length, 1);
  const [ran] = reloaded.messages[0].parts.filter(p => p.type === 'tool-delete_file');
  assert.equal(ran.state, 'output-available');
  assert.equal(ran.output, 'deleted /tmp/x');
  await validateUIMessages({ messages: reloaded.messages });
}

// The first of two approvals answered (denied), then the chat opened on another page while
// the turn waits for the second: only the open approval is asked again, and answering it
// alone sends.
async function twoApprovalsReloaded() {
  const first = new MemoryChat({
    id: 'ops6',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: answeredEveryApprovalAsked,
  });
  await withDeadline(first.sendMessage({ text: 'delete /tmp/x and /tmp/y' }), 'first request');
  const x = first.messages[1].parts.find(p => p.state === 'approval-requested');
  assert.deepEqual(x.input, { path: '/tmp/x' });
  await first.addToolApprovalResponse({ id: x.approval.id, approved: false, reason: 'not x' });
  await waitFor(
    () =>
      first.status === 'ready' &&
      first.messages[1].parts.some(p => p.state === 'approval-requested'),
    'the second approval',
  );
  const errors = [];
  const reloaded = new MemoryChat({
    id: 'ops6',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: answeredEveryApprovalAsked,
    onError: error => errors.push(error),
  });
  await withDeadline(reloaded.resumeStream(), 'the resumed stream');
  const open = reloaded.messages[0].parts.filter(p => p.state === 'approval-requested');
  assert.deepEqual(open.map(p => p.input), [{ path: '/tmp/y' }]);
  await reloaded.addToolApprovalResponse({ id: open[0].approval.id, approved: true });
  await waitFor(
    () =>
      reloaded.status === 'ready' &&
      reloaded.messages[0].parts.some(p => p.type === 'text' && p.text === 'Deleted both.'),
    'the answer',
  );
  assert.deepEqual(errors, []);
  const ran = reloaded.messages[0].parts.filter(p => p.type === 'tool-delete_file');
  assert.deepEqual(ran.map(p => p.state), ['output-error', 'output-available']);
  assert.match(ran[0].errorText, /not x/);
  await validateUIMessages({ messages: reloaded.messages });
}

// The turn's thinking summary: a reasoning part, done, in the answer's step.
async function thinking() {
  const transport = new DefaultChatTransport({ api });
  const stream = await send(transport, 'think', [user('What is 2 + 2?')]);
  const { message, errors } = await withDeadline(read(stream), 'thinking');
  assert.deepEqual(errors, []);
  const parts = withoutData(message);
  const reasoning = parts.filter(p => p.type === 'reasoning');
  assert.deepEqual(reasoning.map(p => [p.text, p.state]), [['It added the numbers.', 'done']]);
  const [text] = parts.filter(p => p.type === 'text');
  assert.equal(text.text, 'Four. '.repeat(40));
  assert.equal(text.state, 'done');
  assert.equal(parts.filter(p => p.type === 'step-start').length, 1);
  assert.equal(message.metadata.status, 'succeeded');
  await validateUIMessages({ messages: [user('What is 2 + 2?'), message] });
}

// A question (the ask_user call): the chat answers it with addToolOutput and sends by
// itself once the call has its output; the same assistant message goes on.
async function question() {
  const errors = [];
  const chat = new MemoryChat({
    id: 'ask',
    transport: new DefaultChatTransport({ api }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
    onError: error => errors.push(error),
  });
  await withDeadline(chat.sendMessage({ text: 'paint it' }), 'first request');
  assert.deepEqual(errors, []);
  const asked = chat.messages[1];
  assert.equal(asked.metadata.status, 'awaiting_input');
  const call = asked.parts.find(p => p.type === 'tool-ask_user');
  assert.equal(call.state, 'input-available');
  assert.equal(call.input.question, 'Which colour?');
  await chat.addToolOutput({ tool: 'ask_user', toolCallId: call.toolCallId, output: 'blue' });
  await waitFor(
    () =>
      chat.status === 'ready' &&
      chat.messages[1].parts.some(p => p.type === 'text' && p.text === 'Blue it is.'),
    'the answered turn to finish',
  );
  assert.deepEqual(errors, []);
  assert.equal(chat.messages.length, 2);
  const done = chat.messages[1];
  assert.equal(done.id, asked.id);
  const answered = done.parts.filter(p => p.type === 'tool-ask_user');
  assert.equal(answered.length, 1);
  assert.equal(answered[0].state, 'output-available');
  assert.equal(done.metadata.status, 'succeeded');
  await validateUIMessages({ messages: chat.messages });
}

// A turn that asked an agent as a tool: its usage says what that agent spent, apart.
async function asked() {
  const transport = new DefaultChatTransport({ api });
  const stream = await send(transport, 'asked', [user('Where is A7?')]);
  const { message, chunks, errors } = await withDeadline(read(stream), 'asked');
  assert.deepEqual(errors, []);
  assert.equal(message.metadata.status, 'succeeded');
  const spent = {
    turns: 1, modelCalls: 1, inputTokens: 12, outputTokens: 3, cachedTokens: 0, costUsd: 0.25,
  };
  assert.deepEqual(message.metadata.usage.asked, spent);
  assert.equal(message.metadata.usage.costUsd, 0.125); // its own calls only
  assert.deepEqual(chunks.at(-1).messageMetadata.usage.asked, spent);
  await validateUIMessages({ messages: [user('Where is A7?'), message] });
}

const scenarios = { asked, thinking, question, cascade, 'tool-turn': toolTurn, approval, 'two-approvals': twoApprovals, 'reload-paused': reloadPaused, 'approved-then-denied': approvedThenDenied, reconnect, oversized, 'fails-mid-text': failsMidText, stopped, 'two-tools': twoTools, 'approved-then-reloaded': approvedThenReloaded, 'two-approvals-reloaded': twoApprovalsReloaded };
const run = scenarios[scenario];
if (!run) {
  console.error(`unknown scenario ${scenario}; one of ${Object.keys(scenarios)}`);
  process.exit(2);
}
try {
  await run();
  console.log(`ok ${scenario}`);
} catch (error) {
  console.error(error);
  process.exit(1);
}
