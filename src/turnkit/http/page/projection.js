// The chat page's projection: turnkit stream events folded into what a person sees.
//
// Pure: `apply(state, event)` returns a new state and never changes the one it was given,
// so the same events always give the same view. The rendering (app.js) reads nothing else.
//
// A session's state holds its turns in order. A turn holds its blocks in log order (the
// person's messages, narration, tool rows, thinking summaries, the task list, the answer),
// its work segments (the turn's own message, then one per `input.guided` message it
// consumed), the decision it waits for, its newest task list, its cost and its status.
// `run.finished` is the turn's boundary (its account is final: `settled`), `done` its end.
//
// The queue (`queued`): messages the session holds that no turn answers yet. A turn waits
// while an earlier turn is open; a guide message waits on the live turn until its
// `input.guided` arrives. The queue drains only at a `run.finished` (or `done`), never
// when an answer arrives; a guide the turn never took comes back as a turn of its own.
//
// Text and reconnects: a durable event whose `seq` is not past the turn's `lastSeq` was
// already folded and is ignored; `message.delta` appends to its block, `message.snapshot`
// replaces the block's text so far, `message.complete` sets the final text. Deltas of a
// block that never completes (a failed rung, a dead attempt) are dropped.

export const TERMINAL = Object.freeze(["succeeded", "failed", "timed_out", "cancelled"]);

/** A session with no turns yet. */
export function emptyState(sessionId) {
  return { sessionId, order: [], turns: {} };
}

/** A turn before any of its events arrived. */
export function emptyTurn(turnId, status = "running") {
  return {
    turnId,
    status,
    lastSeq: 0,
    blocks: [],
    segments: [],
    tasks: [],
    pending: null,
    answered: [],
    guides: [], // guide messages sent to this turn that it has not taken yet
    taken: [], // the guide messages it took (`input.guided`): {requestId, inputSeq}
    answerKey: null,
    cost: null,
    errorCode: null,
    errorMessage: null,
    stage: null,
    settled: false,
    done: false,
    connection: null,
    opening: "", // its message as history lists it: shown while it waits, unfollowed
  };
}

/** Fold one turnkit event (the JSON of an SSE `data:` line) into the session's state. */
export function apply(state, event) {
  const turnId = event && event.turn_id;
  if (!turnId) return state;
  const known = state.turns[turnId];
  const turn = known ?? emptyTurn(turnId);
  const durable = typeof event.seq === "number";
  if (durable && event.seq <= turn.lastSeq) return state; // folded already (a replay)
  let next = durable ? advance(turn, event) : turn;
  next = fold(next, event);
  if (next === turn && known) return state;
  return putTurn(state, next);
}

/** Fold many events in order. */
export function applyAll(state, events) {
  return events.reduce(apply, state);
}

/**
 * The session's turns as `GET /sessions/{id}/history` lists them (all of them, oldest
 * first). Turns the page knows and the list does not (started after it was read) stay
 * after them.
 */
export function withTurns(state, history) {
  let next = state;
  for (const item of history) {
    next = withTurn(next, item.turnId, item.status);
    const opening = (item.blocks ?? []).find((b) => b.kind === "user")?.text ?? "";
    if (opening) next = withOpening(next, item.turnId, opening);
  }
  const listed = history.map((item) => item.turnId);
  const rest = next.order.filter((id) => !listed.includes(id));
  return { ...next, order: [...listed, ...rest] };
}

/** A guide message the page sent to the live turn: queued on it until it is taken. */
export function withGuide(state, turnId, guide) {
  const turn = state.turns[turnId];
  if (!turn || isEnded(turn)) return state;
  if (turn.taken.some((t) => sameGuide(t, guide)) || turn.guides.some((g) => sameGuide(g, guide))) {
    return state;
  }
  return putTurn(state, { ...turn, guides: [...turn.guides, guide] });
}

/** The queue from `GET …/queue`: the guide messages live turns have not taken yet. */
export function withQueue(state, items) {
  let next = state;
  for (const item of items) {
    if (item.delivery !== "guide") continue; // waiting turns are the session's own turns
    const guide = { requestId: item.requestId ?? null, inputSeq: item.inputSeq, content: item.content };
    next = withGuide(withTurn(next, item.turnId), item.turnId, guide);
  }
  return next;
}

/**
 * The messages no turn has answered yet, in order: the live turn's guide messages, then
 * the turns that wait behind it (each `{turnId, content, delivery, requestId}`).
 */
export function queued(state) {
  const out = [];
  let blocked = false; // an earlier turn is open: later ones wait
  for (const id of state.order) {
    const turn = state.turns[id];
    if (!isOpen(turn)) continue;
    if (blocked) {
      const first = turn.segments[0];
      const content = first ? first.content : turn.opening;
      out.push({ turnId: id, content, delivery: "queue", requestId: null });
      continue;
    }
    blocked = true;
    for (const g of turn.guides) out.push({ turnId: id, content: g.content, delivery: "guide", requestId: g.requestId });
  }
  return out;
}

/** The message a turn opened with, as sent: shown while the turn waits, unfollowed. */
export function withOpening(state, turnId, text) {
  const turn = state.turns[turnId];
  return turn && !turn.opening ? putTurn(state, { ...turn, opening: text }) : state;
}

/** A turn the page just started (or learned of): added after the others. */
export function withTurn(state, turnId, status = "running") {
  return state.turns[turnId] ? state : putTurn(state, emptyTurn(turnId, status));
}

/** Decisions from `GET …/pending`: the cards to show even before the stream replays. */
export function withPending(state, items) {
  let next = state;
  for (const item of items) {
    const turn = next.turns[item.turnId] ?? emptyTurn(item.turnId);
    if (turn.done || turn.answered.includes(item.requestId)) continue;
    if (turn.lastSeq > item.seq) continue; // the stream already went past it
    const pending = {
      kind: item.kind,
      requestId: item.requestId,
      seq: item.seq,
      toolCallId: item.toolCallId ?? null,
      toolName: item.toolName ?? null,
      arguments: item.arguments ?? null,
      summary: item.summary ?? null,
      question: item.question ?? null,
      choices: item.choices ?? [],
      approverRole: item.approverRole ?? null,
      askedAgent: item.asked?.agent ?? null, // an agent asked as a tool waits for the answer
    };
    next = putTurn(next, { ...turn, pending, status: waitingStatus(pending.kind) });
  }
  return next;
}

/** The page answered `requestId`: hide the card at once (the stream confirms it). */
export function withAnswered(state, turnId, requestId) {
  const turn = state.turns[turnId];
  if (!turn) return state;
  const answered = turn.answered.includes(requestId)
    ? turn.answered
    : [...turn.answered, requestId];
  const isOpen = turn.pending && turn.pending.requestId === requestId;
  return putTurn(state, {
    ...turn,
    answered,
    pending: isOpen ? null : turn.pending,
    status: isOpen && !turn.done ? "running" : turn.status,
  });
}

/** The page's connection to the turn's stream: `live`, `reconnecting` or `lost`. */
export function withConnection(state, turnId, connection) {
  const turn = state.turns[turnId];
  if (!turn || turn.connection === connection) return state;
  return putTurn(state, { ...turn, connection });
}

/** True once the turn has ended (its `run.finished` or `done` arrived). */
export function isEnded(turn) {
  return turn.settled || turn.done;
}

/** Neither ended nor listed as over: later turns wait behind it. */
export function isOpen(turn) {
  return !isEnded(turn) && !TERMINAL.includes(turn.status);
}

/** The newest turn that has not ended, if any: the one Stop and guide messages address. */
export function liveTurn(state) {
  for (const id of state.order) if (isOpen(state.turns[id])) return state.turns[id];
  return null;
}

/** Narration and thinking above the answer shrink and fade once the answer exists. */
export function isFadedNarration(turn, index) {
  const block = turn.blocks[index];
  if (!block || turn.answerKey === null) return false;
  const isNarration = (block.kind === "text" && !block.isAnswer) || block.kind === "thinking";
  if (!isNarration) return false;
  const answerAt = turn.blocks.findIndex((b) => b.key === turn.answerKey);
  return answerAt > index;
}

// ── folding ───────────────────────────────────────────────────────────────────────

function advance(turn, event) {
  let next = { ...turn, lastSeq: event.seq };
  const isRequest = event.type === "approval.requested" || event.type === "clarification.requested";
  if (next.pending && event.seq > next.pending.seq && !isRequest) {
    next = { ...next, pending: null, status: next.done ? next.status : "running" }; // went on
  }
  if (next.status === "awaiting_budget" && event.type !== "budget.paused") {
    next = { ...next, status: "running" }; // a raised limit (or a new period) let it go on
  }
  return next;
}

const FOLDERS = {
  "turn.started": (turn, e) =>
    startSegment(turn, e.input_seq ?? 1, e.content, {
      attachments: (e.attachments ?? []).length,
      status: turn.done ? turn.status : "running",
    }),
  "input.guided": (turn, e) => {
    const took = { requestId: e.request_id ?? null, inputSeq: e.input_seq };
    return startSegment(
      { ...turn, guides: turn.guides.filter((g) => !sameGuide(g, took)), taken: [...turn.taken, took] },
      e.input_seq,
      e.content,
      {},
    );
  },
  "step.start": (turn, e) => ({ ...turn, stage: e.step }),
  "message.delta": (turn, e) => draftText(turn, e.block_id, (text) => text + e.text),
  "message.snapshot": (turn, e) => draftText(turn, e.block_id, () => e.text),
  "message.complete": completeText,
  "message.citations": (turn, e) =>
    updateBlock(turn, `text:${e.block_id}`, (b) => ({ ...b, citations: e.citations })),
  "thinking.delta": (turn, e) =>
    upsertThinking(turn, e.block_id, (b) => ({ ...b, summary: b.summary + e.text })),
  "thinking.complete": (turn, e) =>
    upsertThinking(turn, e.block.block_id, (b) => ({ ...b, summary: e.block.summary, complete: true })),
  "tool.delta": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      toolName: b.toolName ?? e.tool_name ?? null,
      chars: e.chars,
    })),
  "tool.started": (turn, e) =>
    upsertTool(turn, e.block.tool_call_id, (b) => ({
      ...b,
      toolName: e.block.tool_name,
      arguments: e.block.arguments,
      argumentsError: e.arguments_error ?? null,
      askedSessionId: e.asked_session_id ?? null, // an agent asked as a tool: its session
      startedAt: e.ts,
      status: b.status === "preparing" ? "running" : b.status,
    })),
  "tool.completed": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      toolName: b.toolName ?? e.result.tool_name,
      answeredBy: e.tool_name,
      status: "succeeded",
      durationMs: e.duration_ms,
      output: e.result.output ?? null,
    })),
  "tool.failed": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      toolName: b.toolName ?? e.result.tool_name,
      status: e.code === "tool-denied" ? "denied" : "failed",
      durationMs: e.duration_ms,
      error: forPeople(e.result.error ?? null),
      code: e.code,
    })),
  "approval.answered": (turn, e) =>
    releaseBatch(upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      approval: { decision: e.decision, note: e.note ?? null, changed: e.arguments != null },
      // A request an asked agent handed over: a denial is its agent's to handle, the call goes
      // on (and stays noted, whatever a later request of that agent was answered).
      askedDenial: b.handed && e.decision === "deny" ? { note: e.note ?? null } : b.askedDenial ?? null,
      status: b.status === "awaiting_approval" ? (e.decision === "approve" || b.handed ? "running" : "denied") : b.status,
    })), e),
  "tool.in_doubt": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({ ...b, inDoubt: e.resolution })),
  "job.dispatched": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      job: { jobId: e.job_id, progress: null, message: null, done: false, isError: false },
    })),
  "job.progress": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      job: {
        ...(b.job ?? { jobId: e.job_id, done: false, isError: false }),
        progress: e.progress ?? b.job?.progress ?? null,
        message: e.message ?? b.job?.message ?? null,
      },
    })),
  "job.completed": (turn, e) =>
    upsertTool(turn, e.tool_call_id, (b) => ({
      ...b,
      job: {
        ...(b.job ?? { jobId: e.job_id, message: null }),
        progress: e.is_error ? b.job?.progress ?? null : 1,
        done: true,
        isError: Boolean(e.is_error),
      },
    })),
  "approval.requested": (turn, e) =>
    askFor(
      // `handed`: what an agent this call asked wants to do, not the call itself.
      holdBatch(
        updateBlock(turn, `tool:${e.tool_call_id}`, (b) => ({ ...b, status: "awaiting_approval", handed: e.asked != null })),
        e,
      ),
      {
        kind: "approval",
        requestId: e.request_id,
        seq: e.seq,
        toolCallId: e.tool_call_id,
        toolName: e.tool_name,
        arguments: e.arguments,
        summary: e.summary,
        approverRole: e.approver_role ?? null,
        question: null,
        choices: [],
      },
    ),
  "clarification.requested": (turn, e) => {
    const asked = askFor(turn, {
      kind: "clarification",
      requestId: e.request_id,
      seq: e.seq,
      toolCallId: e.tool_call_id ?? null,
      toolName: null,
      arguments: null,
      summary: null,
      question: e.question,
      choices: e.choices ?? [],
      askedAgent: e.asked?.agent ?? null,
    });
    return asked === turn ? turn : waitOnAskUser(asked);
  },
  "tasks.updated": (turn, e) => {
    const tasks = e.tasks;
    const at = turn.blocks.findIndex((b) => b.key === "tasks");
    if (at >= 0) return { ...turn, tasks, blocks: replaceAt(turn.blocks, at, { ...turn.blocks[at], tasks }) };
    return addBlock({ ...turn, tasks }, { kind: "tasks", key: "tasks", tasks });
  },
  "provider.cascade": (turn, e) =>
    addBlock(dropDrafts(turn), {
      kind: "notice",
      key: `notice:${e.seq}`,
      exhausted: !e.to_model, // an error saying the same follows when the turn fails
      text: e.to_model
        ? `${e.from_model} failed (${e.reason}); went on with ${e.to_model}`
        : `${e.from_model} failed (${e.reason}); no model left`,
    }),
  "turn.recovering": (turn, e) =>
    addBlock(dropDrafts(turn), {
      kind: "notice",
      key: `notice:${e.seq}`,
      text: `Recovered (attempt ${e.attempt})`,
    }),
  "budget.paused": (turn, e) =>
    addBlock(
      { ...dropDrafts(turn), status: turn.done ? turn.status : "awaiting_budget" },
      { kind: "notice", key: `notice:${e.seq}`, text: `Paused: ${e.reason}` },
    ),
  "compaction.completed": (turn, e) =>
    addBlock(turn, {
      kind: "notice",
      key: `notice:${e.seq}`,
      text: `Earlier messages summarized (${e.summarized_messages})`,
    }),
  error: (turn, e) =>
    addBlock(
      {
        ...turn,
        errorCode: e.code,
        errorMessage: e.message,
        // The error names every failed model: the notice that no model was left goes.
        blocks:
          e.code === "family-exhausted" ? turn.blocks.filter((b) => !b.exhausted) : turn.blocks,
      },
      { kind: "error", key: `error:${e.seq}`, code: e.code, message: e.message },
    ),
  usage: (turn, e) => (turn.cost ? turn : { ...turn, cost: costOf(e) }),
  "run.finished": (turn, e) => ({
    ...turn,
    guides: [], // the boundary: a guide it never took comes back as a turn of its own
    settled: true,
    status: e.status,
    errorCode: e.error_code ?? turn.errorCode,
    cost: { ...costOf(e), durationMs: e.duration_ms },
  }),
  done: (turn, e) => ({
    ...settleTools(dropDrafts(turn)),
    guides: [],
    done: true,
    status: e.status,
    errorCode: e.error_code ?? turn.errorCode,
    pending: null,
  }),
};

function fold(turn, event) {
  const folder = Object.hasOwn(FOLDERS, event.type) ? FOLDERS[event.type] : null;
  return folder ? folder(turn, event) : turn; // heartbeat, checkpoint.created, … change nothing
}

function costOf(e) {
  return {
    costUsd: e.cost_usd ?? 0,
    inputTokens: e.input_tokens ?? 0,
    outputTokens: e.output_tokens ?? 0,
    cachedTokens: e.cached_tokens ?? 0,
    modelCalls: e.model_calls ?? 0,
    asked: e.asked ?? null, // what agents it asked as tools spent, apart from the above
    durationMs: null,
  };
}

function waitingStatus(kind) {
  return kind === "approval" ? "awaiting_approval" : "awaiting_input";
}

function askFor(turn, pending) {
  if (turn.answered.includes(pending.requestId) || turn.done) return turn;
  return { ...turn, pending, status: waitingStatus(pending.kind) };
}

/** The `ask_user` call a question comes from waits for the person, it does not run. */
function waitOnAskUser(turn) {
  const asking = (b) => b.kind === "tool" && b.toolName === "ask_user" && b.status === "running";
  if (!turn.blocks.some(asking)) return turn;
  return { ...turn, blocks: turn.blocks.map((b) => (asking(b) ? { ...b, status: "awaiting_input" } : b)) };
}

/** The same guide message: by its input seq when both know it, else by its request id. */
function sameGuide(a, b) {
  if (a.inputSeq != null && b.inputSeq != null) return a.inputSeq === b.inputSeq;
  return a.requestId != null && a.requestId === b.requestId;
}

function startSegment(turn, inputSeq, content, extra) {
  const { status, attachments } = extra;
  const segments = [...turn.segments, { inputSeq, content }];
  const next = { ...turn, segments, ...(status ? { status } : {}) };
  return addBlock(next, {
    kind: "user",
    key: `user:${inputSeq}:${segments.length}`,
    text: content,
    attachments: attachments ?? 0,
  });
}

function currentSegment(turn) {
  return Math.max(0, turn.segments.length - 1);
}

function addBlock(turn, block) {
  return { ...turn, blocks: [...turn.blocks, { segment: currentSegment(turn), ...block }] };
}

function replaceAt(blocks, index, block) {
  const copy = blocks.slice();
  copy[index] = block;
  return copy;
}

function updateBlock(turn, key, change) {
  const at = turn.blocks.findIndex((b) => b.key === key);
  if (at < 0) return turn;
  return { ...turn, blocks: replaceAt(turn.blocks, at, change(turn.blocks[at])) };
}

function newText(blockId) {
  return {
    kind: "text",
    key: `text:${blockId}`,
    blockId,
    text: "",
    isAnswer: false,
    interrupted: false,
    complete: false,
    citations: [],
  };
}

function draftText(turn, blockId, change) {
  const key = `text:${blockId}`;
  const at = turn.blocks.findIndex((b) => b.key === key);
  if (at < 0) return addBlock(turn, { ...newText(blockId), text: change("") });
  const block = turn.blocks[at];
  if (block.complete) return turn; // the final text is set; a late delta changes nothing
  return { ...turn, blocks: replaceAt(turn.blocks, at, { ...block, text: change(block.text) }) };
}

function completeText(turn, e) {
  const b = e.block;
  const key = `text:${b.block_id}`;
  const done = {
    text: b.text,
    isAnswer: Boolean(b.is_answer),
    interrupted: Boolean(b.interrupted),
    complete: true,
  };
  const at = turn.blocks.findIndex((x) => x.key === key);
  // Narration with no text (a call that only named tools it could not use), or only white
  // space (a line break beside its tool calls): nothing to show, and its draft goes.
  if (!b.text.trim() && !done.isAnswer) {
    return at < 0 ? turn : { ...turn, blocks: turn.blocks.filter((_, i) => i !== at) };
  }
  const next =
    at < 0
      ? addBlock(turn, { ...newText(b.block_id), ...done })
      : { ...turn, blocks: replaceAt(turn.blocks, at, { ...turn.blocks[at], ...done }) };
  return done.isAnswer ? { ...next, answerKey: key } : next;
}

function upsertThinking(turn, blockId, change) {
  const key = `thinking:${blockId}`;
  const at = turn.blocks.findIndex((b) => b.key === key);
  if (at >= 0) return { ...turn, blocks: replaceAt(turn.blocks, at, change(turn.blocks[at])) };
  const block = change({
    kind: "thinking",
    key,
    blockId,
    summary: "",
    complete: false,
    segment: currentSegment(turn),
  });
  // A summary belongs above the text of the same call, which may have streamed first.
  const textAt = turn.blocks.findIndex((b) => b.key === `text:${blockId}`);
  if (textAt < 0) return { ...turn, blocks: [...turn.blocks, block] };
  const blocks = turn.blocks.slice();
  blocks.splice(textAt, 0, block);
  return { ...turn, blocks };
}

/** What a denied call's error adds for the model only (the page leaves it out). */
const MODEL_ONLY = ". Do not retry it as is";

function forPeople(error) {
  return error?.endsWith(MODEL_ONLY) ? error.slice(0, -MODEL_ONLY.length) : error;
}

function upsertTool(turn, toolCallId, change) {
  const key = `tool:${toolCallId}`;
  const at = turn.blocks.findIndex((b) => b.key === key);
  if (at >= 0) return { ...turn, blocks: replaceAt(turn.blocks, at, change(turn.blocks[at])) };
  return addBlock(
    turn,
    change({
      kind: "tool",
      key,
      toolCallId,
      toolName: null,
      arguments: null,
      argumentsError: null,
      askedSessionId: null,
      handed: false,
      askedDenial: null,
      status: "preparing",
      startedAt: null,
      chars: 0,
      durationMs: null,
      output: null,
      error: null,
      code: null,
      answeredBy: null,
      inDoubt: null,
      job: null,
    }),
  );
}

/**
 * A call's own approval holds its whole batch: the other calls of the batch (started,
 * not finished) wait for it, `queued`, not running (no clock ticks for them).
 */
function holdBatch(turn, e) {
  if (e.asked != null) return turn; // an asked agent's request: the batch is running
  const blocks = turn.blocks.map((b) =>
    b.kind === "tool" && b.status === "running" && b.toolCallId !== e.tool_call_id && b.durationMs === null
      ? { ...b, status: "queued" }
      : b,
  );
  return { ...turn, blocks };
}

/** Once no call of the batch waits for its approval, the batch runs from then on. */
function releaseBatch(turn, e) {
  const held = (b) => b.kind === "tool" && b.status === "awaiting_approval" && !b.handed;
  if (turn.blocks.some(held) || !turn.blocks.some((b) => b.status === "queued")) return turn;
  const blocks = turn.blocks.map((b) =>
    b.kind === "tool" && b.status === "queued" ? { ...b, status: "running", startedAt: e.ts } : b,
  );
  return { ...turn, blocks };
}

/** Tool rows the turn ended before they finished (stopped while waiting or running). */
function settleTools(turn) {
  const open = new Set(["preparing", "running", "queued", "awaiting_approval", "awaiting_input"]);
  if (!turn.blocks.some((b) => b.kind === "tool" && open.has(b.status))) return turn;
  const blocks = turn.blocks.map((b) =>
    b.kind === "tool" && open.has(b.status) ? { ...b, status: "not_finished" } : b,
  );
  return { ...turn, blocks };
}

/** Drop text that never completed: its call failed over, or its attempt died. */
function dropDrafts(turn) {
  const blocks = turn.blocks.filter(
    (b) => !((b.kind === "text" || b.kind === "thinking") && !b.complete),
  );
  return blocks.length === turn.blocks.length ? turn : { ...turn, blocks };
}

function putTurn(state, turn) {
  const isNew = !state.turns[turn.turnId];
  return {
    ...state,
    turns: { ...state.turns, [turn.turnId]: turn },
    order: isNew ? [...state.order, turn.turnId] : state.order,
  };
}
