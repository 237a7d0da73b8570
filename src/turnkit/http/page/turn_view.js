// Drawing one turn: its blocks (your message, the answer, tools, tasks, citations), the
// card of a pending approval or question, and its footer. Reads the turn's projection
// only; what it needs of the page (requests being answered, the live region) is passed in.

import { isEnded, isFadedNarration } from "./projection.js";
import { newTabNote, scroller } from "./markdown.js";
import { drawMarkdown } from "./markdown_stream.js";

export function newTurnElement(turnId) {
  // Each turn is an article named by its heading ("Turn 2"), for moving turn by turn.
  const heading = `turn-heading-${turnId}`;
  const node = el("article", { class: "turn", "data-turn-id": turnId, "aria-labelledby": heading });
  node.append(
    el("h2", { class: "visually-hidden", id: heading }),
    el("div", { class: "blocks" }),
    el("div", { class: "decision" }),
    el("footer", { class: "meta" }),
    el("div", { class: "turn-actions" }),
  );
  node.blockNodes = new Map();
  return node;
}

// `page`: { busy: request ids being answered, announce(text): the live region, readOnly:
// the session of an agent asked as a tool, whose requests are answered where it was asked }.
export function drawTurn(node, turn, page) {
  node.dataset.status = turn.status;
  node.classList.toggle("ended", isEnded(turn));
  const blocks = node.querySelector(".blocks");
  const keep = new Set();
  let previous = null;
  turn.blocks.forEach((block, index) => {
    let child = node.blockNodes.get(block.key);
    if (!child || child.dataset.kind !== block.kind) {
      child = newBlockElement(block.kind);
      node.blockNodes.set(block.key, child);
    }
    drawBlock(child, block, turn, index);
    placeAfter(blocks, child, previous);
    previous = child;
    keep.add(block.key);
  });
  for (const [key, child] of node.blockNodes) {
    if (!keep.has(key)) {
      child.remove();
      node.blockNodes.delete(key);
    }
  }
  drawDecision(node.querySelector(".decision"), turn, page);
  setText(node.querySelector(".meta"), metaOf(turn));
  drawActions(node.querySelector(".turn-actions"), turn, page);
}

/** A turn that failed or timed out offers to send its message again (a new turn). */
function drawActions(box, turn, page) {
  const retryable = isEnded(turn) && (turn.status === "failed" || turn.status === "timed_out");
  if (!retryable) {
    if (box.firstChild) box.replaceChildren();
    return;
  }
  if (!box.firstChild) box.append(el("button", { type: "button", "data-retry": turn.turnId }, "Retry"));
  box.firstChild.disabled = page.busy.has(`retry:${turn.turnId}`);
}

function newBlockElement(kind) {
  const node = el(kind === "thinking" ? "details" : "div", { class: `block ${kind}`, "data-kind": kind });
  if (kind === "thinking") node.append(el("summary", {}, "Thinking"));
  if (kind === "tool") {
    node.append(
      el("span", { class: "icon", "aria-hidden": "true" }),
      el("span", { class: "status visually-hidden" }),
      el("span", { class: "name" }),
      el("span", { class: "args" }),
      el("span", { class: "duration" }),
      el("div", { class: "detail" }),
      el("div", { class: "job" }, el("progress", { max: "1" }), el("span", { class: "job-message" })),
      el("a", { class: "asked", hidden: "" }),
    );
    return node;
  }
  if (kind === "tasks") {
    node.append(el("h3", {}, "Tasks"), el("ul"));
    return node;
  }
  // Who speaks, for a screen reader: your message and the answer look alike to it.
  if (kind === "user") node.append(el("span", { class: "visually-hidden who" }, "You:"));
  if (kind === "text") node.append(el("span", { class: "visually-hidden who" }, "Answer:"));
  node.append(el(kind === "text" ? "div" : "p", { class: "text", ...(kind === "user" ? { dir: "auto" } : {}) }));
  if (kind === "text") node.append(el("span", { class: "badge" }, "interrupted"), el("ol", { class: "citations" }));
  return node;
}

function drawBlock(node, block, turn, index) {
  const text = node.querySelector(":scope > .text");
  switch (block.kind) {
    case "user":
      setText(text, block.attachments ? `${block.text} (+${block.attachments} picture(s))` : block.text);
      break;
    case "text":
      node.hidden = !block.text.trim(); // white space so far: no empty bubble
      drawMarkdown(text, block.text); // only what changed: its blocks still open
      node.classList.toggle("answer", block.isAnswer);
      node.classList.toggle("narration", !block.isAnswer);
      node.classList.toggle("streaming", !block.complete);
      node.classList.toggle("interrupted", block.interrupted);
      node.classList.toggle("faded", isFadedNarration(turn, index));
      setText(node.querySelector(".who"), block.isAnswer ? "Answer:" : "Assistant:");
      drawCitations(node.querySelector(".citations"), block.citations);
      break;
    case "thinking":
      setText(text, block.summary);
      node.classList.toggle("faded", isFadedNarration(turn, index));
      break;
    case "tool":
      drawTool(node, block);
      break;
    case "tasks":
      drawTasks(node.querySelector("ul"), block.tasks);
      break;
    case "error":
      setText(text, `${block.message} (${block.code})`);
      break;
    default:
      setText(text, block.text);
  }
}

const TOOL_ICONS = {
  preparing: "…",
  running: "",
  queued: "…",
  awaiting_approval: "?",
  awaiting_input: "?",
  succeeded: "✓",
  failed: "✗",
  denied: "⊘",
  not_finished: "–", // the turn ended (stopped, failed) before the call was decided or done
};

const TOOL_STATES = {
  preparing: "being prepared:",
  running: "running:",
  queued: "waiting for its batch's approval:",
  awaiting_approval: "waiting for approval:",
  awaiting_input: "waiting for your answer:",
  succeeded: "succeeded:",
  failed: "failed:",
  denied: "denied:",
  not_finished: "not finished:",
};

/** How a person answered the call's approval (a denial's note is in the call's error). */
function approvalOf(block) {
  const approval = block.approval;
  const denial = block.askedDenial;
  if (denial && block.status !== "denied") {
    // A call to an agent asked as a tool: what it wanted to do was denied, and it went on.
    return denial.note ? `its request denied: ${denial.note}` : "its request denied";
  }
  if (!approval || approval.decision !== "approve") return null;
  const how = approval.changed ? "approved with changed arguments" : "approved";
  return approval.note ? `${how}: ${approval.note}` : how;
}

function drawTool(node, block) {
  node.dataset.status = block.status;
  setText(node.querySelector(".icon"), TOOL_ICONS[block.status] ?? "");
  setText(node.querySelector(".status"), TOOL_STATES[block.status] ?? block.status);
  setText(node.querySelector(".name"), block.toolName ?? "tool");
  setText(node.querySelector(".args"), argumentsOf(block));
  setText(node.querySelector(".duration"), toolDuration(block));
  const ended = block.status === "failed" || block.status === "denied";
  const detail = ended ? block.error ?? block.code : block.argumentsError;
  const notes = [detail, approvalOf(block), block.inDoubt && `in doubt: ${block.inDoubt}`];
  setText(node.querySelector(".detail"), notes.filter(Boolean).join(" · "));
  const asked = node.querySelector(".asked");
  asked.hidden = !block.askedSessionId;
  if (block.askedSessionId) {
    // The asked agent's own conversation (its steps and text): opened here, Back returns.
    const href = `#session=${encodeURIComponent(block.askedSessionId)}`;
    if (asked.getAttribute("href") !== href) asked.setAttribute("href", href);
    asked.dataset.sessionId = block.askedSessionId;
    setText(asked, `Open the ${block.toolName ?? "agent"} conversation`);
  }
  const job = node.querySelector(".job");
  job.hidden = !block.job;
  if (block.job) {
    const bar = job.querySelector("progress");
    // A bar with no value moves as if the job worked: only while it may (not after its
    // turn ended with the job unfinished, as a Stop leaves it).
    if (block.job.progress === null && block.status !== "not_finished") bar.removeAttribute("value");
    else bar.value = block.job.progress ?? 0;
    const state = block.job.done ? (block.job.isError ? "job failed" : "job done") : "";
    setText(job.querySelector(".job-message"), [block.job.message, state].filter(Boolean).join(" · "));
  }
}

function drawTasks(list, tasks) {
  list.replaceChildren(
    ...tasks.map((task) => {
      const item = el("li", { class: `task ${task.status}`, "data-status": task.status });
      item.textContent = task.title;
      return item;
    }),
  );
}

function drawCitations(list, citations) {
  if (list.childElementCount === citations.length) return;
  list.replaceChildren(
    ...citations.map((c) => {
      const item = el("li");
      const label = c.title || c.source;
      if (c.url && /^https?:\/\//i.test(c.url)) item.append(el("a", { href: c.url, rel: "noreferrer", target: "_blank" }, label, newTabNote()));
      else item.append(label);
      if (c.quote) item.append(el("q", {}, c.quote));
      return item;
    }),
  );
}

function drawDecision(box, turn, page) {
  const pending = turn.pending;
  const key = pending ? pending.requestId : "";
  box.querySelectorAll("button").forEach((b) => (b.disabled = page.busy.has(key)));
  if (box.dataset.requestId === key) return; // keep what the person is typing
  box.dataset.requestId = key;
  box.replaceChildren();
  if (!pending) return;
  if (page.readOnly) {
    const what = pending.kind === "approval" ? `approval of ${pending.toolName ?? "a call"}` : "an answer";
    const note = `Waits for ${what}: answered in the conversation that asked this agent.`;
    box.append(el("p", { class: "card asked-wait", dir: "auto" }, note));
    page.announce(note);
    return;
  }
  const label = pending.kind === "approval" ? "Approval needed" : "Question";
  const card = el("div", {
    class: `card ${pending.kind}`,
    role: "group",
    "aria-label": label,
    tabindex: "-1",
    "data-request-id": pending.requestId,
  });
  if (pending.kind === "approval") {
    card.append(
      el("p", { class: "card-title" }, "Approve ", el("code", {}, visible(pending.toolName ?? "this call")), "?"),
      el("p", { class: "summary", dir: "auto" }, visible(pending.summary ?? "")),
      scroller(el("pre", { class: "arguments" }, visible(JSON.stringify(pending.arguments ?? {}, null, 2))), "Arguments"),
      ...(pending.approverRole
        ? [el("p", { class: "approver" }, "Answered by a person with the ", el("code", {}, pending.approverRole), " role.")]
        : []),
      el("div", { class: "actions" },
        el("button", { type: "button", class: "primary", "data-decision": "approve" }, "Approve"),
        el("button", { type: "button", "data-decision": "deny" }, "Deny")),
    );
  } else {
    const choices = pending.choices.map((choice) => el("button", { type: "button", "data-choice": choice }, visible(choice)));
    // A question an agent asked as a tool wants answered says which agent asks it.
    const from = pending.askedAgent ? [el("span", { class: "asked-by" }, `${pending.askedAgent} asks: `)] : [];
    card.append(
      el("p", { class: "card-title", dir: "auto" }, ...from, pending.question ?? ""),
      el("div", { class: "actions" }, ...choices),
      el("form", { class: "answer" },
        el("input", { name: "answer", placeholder: "Your answer", autocomplete: "off", "aria-label": "Your answer" }),
        el("button", { type: "submit", class: "primary" }, "Answer")),
    );
  }
  box.append(card);
  const asker = pending.askedAgent ? `${pending.askedAgent} asks: ` : "";
  const asked =
    pending.kind === "approval"
      ? [`Approve ${visible(pending.toolName ?? "this call")}?`, pending.summary && visible(pending.summary)]
      : [`${asker}${pending.question ?? ""}`];
  page.announce(`${label}: ${asked.filter(Boolean).join(" ")}`);
  // The card takes focus from nowhere, or from an empty message box (the message that
  // led here was just sent): the card itself, so a stray key decides nothing.
  const focused = document.activeElement;
  const message = document.querySelector("#message");
  if (!focused || focused === document.body || (focused === message && !message.value)) card.focus();
}

const STATUS = {
  running: "Working…",
  awaiting_approval: "Waiting for your approval",
  awaiting_input: "Waiting for your answer",
  awaiting_budget: "Paused: out of budget",
  succeeded: "Done",
  failed: "Failed",
  timed_out: "Timed out",
  cancelled: "Stopped",
};

function metaOf(turn) {
  const parts = [STATUS[turn.status] ?? turn.status];
  if (turn.errorCode && turn.status !== "cancelled") parts[0] += ` (${turn.errorCode})`;
  if (turn.connection === "reconnecting" && !turn.done) parts.push("reconnecting…");
  if (turn.connection === "lost" && !turn.done) parts.push("connection lost");
  const cost = turn.cost;
  if (cost) {
    parts.push(usd(cost.costUsd));
    parts.push(`${cost.inputTokens.toLocaleString()} in / ${cost.outputTokens.toLocaleString()} out tokens`);
    if (cost.asked) parts.push(askedLine(cost.asked));
    if (cost.durationMs !== null) parts.push(duration(cost.durationMs));
  }
  return parts.join(" · ");
}

// ── small helpers ─────────────────────────────────────────────────────────────────

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

// Characters that draw nothing (zero-width spaces and joiners, invisible tag letters) or turn
// the text around them (right-to-left overrides and isolates), as `\u202e` escapes, in what
// a person approves: a tool call's arguments show as the call has them. JSON writes the same
// escapes, so arguments stay JSON; a character past U+FFFF is its two UTF-16 halves.
const INVISIBLE = /[\p{Cf}\p{Zl}\p{Zp}]/gu;

export function visible(text) {
  return text.replace(INVISIBLE, (found) =>
    Array.from({ length: found.length }, (_, k) => `\\u${found.charCodeAt(k).toString(16).padStart(4, "0")}`).join(""),
  );
}

export function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

export function placeAfter(parent, node, previous) {
  const want = previous ? previous.nextSibling : parent.firstChild;
  if (want === node) return;
  // Moving a node takes focus from whatever it holds (the browser blurs it): give it back,
  // or a session button someone is about to press loses the key when the list reorders.
  const focused = document.activeElement;
  const holds = focused && focused !== document.body && node.contains(focused);
  parent.insertBefore(node, want);
  if (holds && document.activeElement !== focused) focused.focus({ preventScroll: true });
}

/** A finished call's duration; a running call's time so far, ticking (see `tick`). */
function toolDuration(block) {
  if (block.durationMs !== null) return duration(block.durationMs);
  if (block.status !== "running" || !block.startedAt) return "";
  return duration(Math.max(0, Date.now() - Date.parse(block.startedAt)));
}

function argumentsOf(block) {
  if (!block.arguments) return block.chars ? `${block.chars} characters…` : "";
  const text = Object.entries(block.arguments)
    .map(([name, value]) => visible(`${name}=${JSON.stringify(value)}`))
    .join(", ");
  return text.length > 90 ? `${text.slice(0, 89)}…` : text;
}

// What the agents a turn asked as tools spent (`asked` of its usage), as the CLI prints it:
// the turns and model calls, and the cost only when there is one (asked turns on models
// without a price add up to $0, which would read as free).
export function askedLine(asked) {
  const turns = `${asked.turns} turn${asked.turns === 1 ? "" : "s"}`;
  const made = asked.model_calls ?? 0;
  const calls = `${made} model call${made === 1 ? "" : "s"}`;
  const cost = asked.cost_usd > 0 ? `, ${usd(asked.cost_usd)}` : "";
  return `+ asked agents: ${turns}, ${calls}${cost}`;
}

// A cost in dollars, as the CLI prints it: cents from $1 up, three significant digits
// below, `$0` for none.
export function usd(cost) {
  if (!(cost > 0)) return "$0";
  if (cost >= 1) {
    return "$" + cost.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }
  const decimals = Math.min(100, 2 - Math.floor(Math.log10(cost)));
  return "$" + cost.toFixed(decimals).replace(/0+$/, "").replace(/\.$/, "");
}

export function duration(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}
