// The chat page: sessions, the message box, and each turn drawn from the projection.
//
// Every event goes through projection.js `apply`; what is drawn is read from the
// projection only. One stream per turn at most, an EventSource (sse.js): a turn is
// followed from its first event (`?after=0`) when it starts or the page loads, and the
// browser resumes it with `Last-Event-ID` after a drop. A paused turn's stream stays open
// (with keep-alives), so the turn's events after an approval arrive on it. Of a session's
// open turns only the live one (the first) is followed: the others wait behind it and are
// drawn from history until it ends. A browser opens at most six connections to a server
// over HTTP/1.1: a stream per waiting turn would leave none for Approve.

import * as api from "./api.js";
import {
  TERMINAL,
  apply,
  emptyState,
  liveTurn,
  queued,
  withAnswered,
  withConnection,
  withGuide,
  withOpening,
  withPending,
  withQueue,
  withTurn,
  withTurns,
} from "./projection.js";
import { followTurn } from "./sse.js";
import { drawTurn, el, newTurnElement, placeAfter, setText } from "./turn_view.js";

export { askedLine, usd } from "./turn_view.js"; // the page tests check them against the CLI's

const $ = (selector) => document.querySelector(selector);
const ui = {
  sessions: [],
  sessionId: null,
  asked: null, // the open session when an agent asked as a tool answered in it (no list has it)
  state: emptyState(null),
  followers: new Map(), // turnId → AbortController of its one stream
  busy: new Set(), // request ids being answered, "send", "stop"
  notice: "",
  listProblem: "", // why the chat list did not load: shown (under any notice) until it does
};

// ── following turns ────────────────────────────────────────────────────────────────

function update(change) {
  ui.state = change(ui.state);
  schedule();
}

function follow(turnId, { replay = false } = {}) {
  if (ui.followers.has(turnId)) return Promise.resolve("followed"); // never two streams
  const controller = new AbortController();
  const sessionId = ui.sessionId;
  const current = () => !controller.signal.aborted && ui.sessionId === sessionId;
  ui.followers.set(turnId, controller);
  return followTurn({
    api: api.API,
    turnId,
    signal: controller.signal,
    cursor: () => ui.state.turns[turnId]?.lastSeq ?? 0,
    onEvent: (event) => {
      if (!current()) return;
      update((s) => apply(s, event));
    },
    onConnection: (how) => current() && update((s) => withConnection(s, turnId, how)),
  }).then((how) => {
    if (ui.followers.get(turnId) === controller) ui.followers.delete(turnId);
    if (how === "done" && ui.sessionId === sessionId) {
      if (!replay) announce(endingOf(ui.state.turns[turnId]));
      afterTurn(sessionId);
    }
    return how;
  });
}

const ENDINGS = {
  succeeded: "The answer is complete.",
  failed: "The turn failed.",
  timed_out: "The turn timed out.",
  cancelled: "The turn was stopped.",
};

function endingOf(turn) {
  const said = ENDINGS[turn?.status] ?? "The turn ended.";
  return turn?.errorMessage ? `${said} ${turn.errorMessage}` : said;
}

/** Say something to a screen reader (the page's one live region), not per token. */
function announce(text) {
  const region = $("#announce");
  region.textContent = "";
  requestAnimationFrame(() => (region.textContent = text));
}

/** Focus that a click took away (its button was removed) goes back to the message box. */
function refocus() {
  if (!document.activeElement || document.activeElement === document.body) focusWriting();
}

/** Where a person writes: the message box, or the conversation where it is hidden. */
function focusWriting() {
  (isAskedSession(ui.sessionId) ? $("#turns") : $("#message")).focus();
}

/** Follow the session's live turn (the first open one), if any: its stream, else null. */
function followLive(sessionId) {
  if (ui.sessionId !== sessionId) return null;
  const live = liveTurn(ui.state);
  return live ? follow(live.turnId) : null;
}

async function openSession(sessionId, { push = false } = {}) {
  for (const controller of ui.followers.values()) controller.abort();
  ui.followers.clear();
  ui.sessionId = sessionId;
  ui.state = emptyState(sessionId);
  ui.notice = "";
  ui.asked = null;
  if (ui.listProblem) refreshSessions(); // the list did not load: try it again
  if (isAskedSession(sessionId)) loadAsked(sessionId);
  if (location.hash !== `#session=${sessionId}`) {
    // A session the person picked is a step Back returns from; the first one is not.
    if (push) history.pushState(null, "", `#session=${sessionId}`);
    else history.replaceState(null, "", `#session=${sessionId}`);
  }
  schedule();
  let turns;
  try {
    turns = await api.history(sessionId);
  } catch (err) {
    const missing = err instanceof api.ProblemError && (err.status === 404 || err.status === 422);
    if (missing && err.status === 422 && ui.sessionId === sessionId) {
      // Not a session id at all (a mangled link): a message starts a new chat, not an error.
      ui.sessionId = null;
      history.replaceState(null, "", location.pathname + location.search);
    }
    return say(missing ? `There is no chat "${sessionId}" here; start a new one or pick one.` : reason(err));
  }
  if (ui.sessionId !== sessionId) return;
  update((s) => withTurns(s, turns));
  loadPending(sessionId);
  loadQueue(sessionId);
  // Live and paused turns keep their stream open; finished ones replay to their `done`,
  // two at a time (a browser opens at most six connections to one server).
  const finished = turns.filter((t) => TERMINAL.includes(t.status)).map((t) => t.turnId);
  followLive(sessionId);
  const next = async () => {
    while (finished.length > 0 && ui.sessionId === sessionId) await follow(finished.shift(), { replay: true });
  };
  await Promise.all([next(), next()]);
}

function loadAsked(sessionId) {
  // Its title and the conversation that asked it, which the sessions list leaves out.
  api
    .getSession(sessionId)
    .then((session) => {
      if (ui.sessionId !== sessionId) return;
      ui.asked = session;
      schedule();
    })
    .catch(() => {}); // the history read says what is wrong with it
}

function loadPending(sessionId) {
  api
    .sessionPending(sessionId)
    .then((body) => ui.sessionId === sessionId && update((s) => withPending(s, body.pending)))
    .catch(() => {}); // the cards still come from the stream
}

function loadQueue(sessionId) {
  api
    .sessionQueue(sessionId)
    .then((body) => ui.sessionId === sessionId && update((s) => withQueue(s, body.queue)))
    .catch(() => {}); // guide messages still show once the turn takes them
}

/** Add the turns this page did not start (another tab, a guide message queued as its own turn). */
async function catchUp(sessionId) {
  try {
    const turns = await api.history(sessionId);
    if (ui.sessionId !== sessionId) return;
    const fresh = turns.filter((t) => !ui.state.turns[t.turnId] && TERMINAL.includes(t.status));
    update((s) => withTurns(s, turns));
    fresh.forEach((t) => follow(t.turnId, { replay: true })); // ended elsewhere: replayed
  } catch {
    // the page keeps what it has
  }
}

// ── other tabs of this browser on this server: told of new turns and chats ─────────────
// (A BroadcastChannel reaches only this origin's tabs; another device learns on its own
// next read.)
const tabs = typeof BroadcastChannel === "function" ? new BroadcastChannel(`turnkit:${api.API}`) : null;

function tellTabs(news) {
  tabs?.postMessage(news);
}

function heardFromTab({ data }) {
  if (data?.kind === "sessions") return void refreshSessions();
  if (data?.kind !== "turn" || data.sessionId !== ui.sessionId) return;
  const sessionId = ui.sessionId; // a turn another tab started here: show it, follow it
  catchUp(sessionId).then(() => {
    if (ui.sessionId !== sessionId) return;
    loadPending(sessionId);
    loadQueue(sessionId);
    followLive(sessionId);
  });
}

async function afterTurn(sessionId) {
  await catchUp(sessionId);
  followLive(sessionId); // the turn that waited behind the one that ended, if any
  refreshSessions();
}

const NAMING_LOOKS = 6;
const NAMING_EVERY_MS = 1500;

function watchNaming(sessionId) {
  // An agent with a utility model names the session just after its opening turn has
  // succeeded: look at the list again a few times, until the title changes.
  const title = () => ui.sessions.find((s) => s.sessionId === sessionId)?.title;
  const first = title(); // the name read off the opening message
  let looks = 0;
  const look = async () => {
    await refreshSessions();
    if (title() !== first) tellTabs({ kind: "sessions" });
    else if (++looks < NAMING_LOOKS) setTimeout(look, NAMING_EVERY_MS);
  };
  setTimeout(look, NAMING_EVERY_MS);
}

async function refreshSessions() {
  try {
    ui.sessions = await api.listSessions();
    ui.listProblem = "";
  } catch (err) {
    ui.listProblem = reason(err);
  }
  schedule();
}

// ── actions ───────────────────────────────────────────────────────────────────────

// The message whose sending failed last: { sessionId, text, requestId }. Its answer may
// have been lost on the way back (a proxy's 502) after the server took it, so the same
// message sent again to the same chat keeps its request id: the server then answers with
// the turn it started, if it did, instead of running the message a second time.
let unsent = null;

function requestIdFor(sessionId, text) {
  const again = unsent?.sessionId === sessionId && unsent.text === text;
  return again ? unsent.requestId : api.requestId();
}

async function send(text) {
  ui.busy.add("send");
  schedule();
  let created = null;
  let attempt = null;
  try {
    if (!ui.sessionId) {
      created = await api.createSession();
      ui.sessions = [created, ...ui.sessions];
      openSession(created.sessionId);
    }
    const sessionId = ui.sessionId;
    const opening = Object.keys(ui.state.turns).length === 0; // the session's first message
    // A message sent while a turn runs joins it (a guide message); otherwise it queues.
    const live = liveTurn(ui.state);
    const delivery = live && live.status === "running" ? "guide" : "queue";
    const body = { content: text, requestId: requestIdFor(sessionId, text), delivery };
    attempt = { sessionId, text, requestId: body.requestId };
    const turnId = await api.execute(sessionId, body);
    unsent = attempt = null; // taken
    if (turnId) tellTabs({ kind: "turn", sessionId, turnId });
    if (opening) tellTabs({ kind: "sessions" }); // named after its first message
    if (ui.sessionId !== sessionId || !turnId) return true;
    update((s) => withOpening(withTurn(s, turnId), turnId, text));
    if (delivery === "guide" && turnId === live.turnId) {
      // It joined the running turn (otherwise the server gave it a turn of its own).
      const guide = { requestId: body.requestId, inputSeq: null, content: text };
      update((s) => withGuide(s, turnId, guide));
    }
    ui.notice = "";
    if (!live && !created) {
      // The page saw no open turn, but another tab may have started one since it loaded:
      // this message then waits behind it. Learn of it (and its card) before following.
      await catchUp(sessionId);
      if (ui.sessionId !== sessionId) return true;
      loadPending(sessionId);
    }
    // Its stream opens now if it is the live turn, else once the turns before it end.
    followLive(sessionId)?.then((how) => {
      const ended = ui.sessionId === sessionId ? ui.state.turns[turnId]?.status : null;
      if (opening && how === "done" && ended === "succeeded") watchNaming(sessionId);
    });
    refreshSessions(); // the session is named after its first message
    return true;
  } catch (err) {
    if (attempt) unsent = attempt;
    // A first message the server refused leaves no empty chat behind.
    if (created && err instanceof api.ProblemError && err.status < 500) await forget(created.sessionId);
    say(reason(err));
    return false;
  } finally {
    ui.busy.delete("send");
    schedule();
  }
}

/** Make a session and open it (its history is read on, while the next message goes to it). */
async function newChat() {
  try {
    const created = await api.createSession();
    ui.sessions = [created, ...ui.sessions];
    tellTabs({ kind: "sessions" });
    openSession(created.sessionId, { push: true });
  } catch (err) {
    say(reason(err));
  }
}

/** Delete a session this page just made and show no session, as before it was made. */
async function forget(sessionId) {
  await api.deleteSession(sessionId).catch(() => {}); // at worst an empty chat stays listed
  tellTabs({ kind: "sessions" });
  ui.sessions = ui.sessions.filter((session) => session.sessionId !== sessionId);
  if (ui.sessionId !== sessionId) return;
  ui.sessionId = null;
  ui.state = emptyState(null);
  history.replaceState(null, "", location.pathname + location.search);
}

async function stop() {
  const live = liveTurn(ui.state);
  if (!live) return;
  ui.busy.add("stop");
  schedule();
  try {
    await api.cancelTurn(live.turnId);
  } catch (err) {
    say(reason(err));
  } finally {
    ui.busy.delete("stop");
    schedule();
    requestAnimationFrame(refocus);
  }
}

async function decide(turnId, requestId, answer) {
  const pending = ui.state.turns[turnId]?.pending;
  if (!pending || ui.busy.has(requestId)) return;
  ui.busy.add(requestId);
  schedule();
  try {
    if (pending.kind === "approval") await api.approve(turnId, requestId, answer);
    else await api.clarify(turnId, requestId, answer);
  } catch (err) {
    if (!(err instanceof api.ProblemError && err.status === 409)) {
      ui.busy.delete(requestId);
      return say(reason(err)); // the card stays: try again
    }
  }
  ui.busy.delete(requestId);
  ui.notice = "";
  update((s) => withAnswered(s, turnId, requestId));
  requestAnimationFrame(refocus);
  follow(turnId); // the same turn goes on, on the stream that is still open (if it closed: again)
}

/** Send a failed turn's message again: a new turn, followed like a message just sent. */
async function retry(turnId) {
  const failed = ui.state.turns[turnId];
  const key = `retry:${turnId}`;
  if (!failed || ui.busy.has(key)) return;
  const sessionId = ui.sessionId;
  ui.busy.add(key);
  schedule();
  try {
    // One key per failed turn: a second click (after a reload) or another tab's Retry of
    // the same turn gets the turn the first one started, never a second run.
    const next = await api.retry(turnId, `page-retry-${turnId}`);
    if (next) tellTabs({ kind: "turn", sessionId, turnId: next });
    if (ui.sessionId !== sessionId || !next) return;
    update((s) => withOpening(withTurn(s, next), next, failed.opening ?? ""));
    ui.notice = "";
    followLive(sessionId);
  } catch (err) {
    say(reason(err));
  } finally {
    ui.busy.delete(key);
    schedule();
  }
}

function say(text) {
  ui.notice = text;
  schedule();
}

/** What went wrong, for a person: the server's own words, or that it could not be reached. */
function reason(err) {
  if (err instanceof api.ProblemError) return err.message;
  return "The server could not be reached; check your connection and send again.";
}

// ── rendering: reads ui.state (the projection) only ──────────────────────────────

let scheduled = false;
function schedule() {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    render();
  });
}

function render() {
  const scroller = $("#turns");
  const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
  const items = queued(ui.state);
  renderSessions();
  renderTurns(scroller, items);
  renderQueue(items);
  renderComposer();
  $("#notice").textContent = ui.notice || ui.listProblem;
  if (atBottom) scroller.scrollTop = scroller.scrollHeight;
}

// Each session's list item, kept across redraws (a focused button stays the same element).
const sessionItems = new Map(); // sessionId → li

function renderSessions() {
  const list = $("#sessions");
  const keep = new Set();
  let previous = null;
  for (const session of ui.sessions) {
    let item = sessionItems.get(session.sessionId);
    if (!item) {
      item = el("li", {}, el("button", { type: "button", dir: "auto", "data-session-id": session.sessionId }));
      sessionItems.set(session.sessionId, item);
    }
    const button = item.firstChild;
    setText(button, session.title || "Untitled chat");
    if (session.sessionId === ui.sessionId) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
    placeAfter(list, item, previous);
    previous = item;
    keep.add(session.sessionId);
  }
  for (const [sessionId, item] of sessionItems) {
    if (keep.has(sessionId)) continue;
    item.remove();
    sessionItems.delete(sessionId);
  }
  const current = ui.sessions.find((s) => s.sessionId === ui.sessionId) ?? ui.asked;
  const title = current?.title || (ui.sessionId ? "Untitled chat" : "New chat");
  setText($("#session-title"), title);
  const tabTitle = ui.sessionId ? `${title} — turnkit` : "turnkit";
  if (document.title !== tabTitle) document.title = tabTitle;
}

/** A session an agent asked as a tool answers in: read here, answered in the asking one. */
function isAskedSession(sessionId) {
  return Boolean(sessionId?.startsWith("tk-sub."));
}

function renderComposer() {
  const asked = isAskedSession(ui.sessionId);
  $("#composer").hidden = asked;
  $("#asked-note").hidden = !asked;
  const parent = asked ? ui.asked?.parentSession : null;
  const from = $("#asked-from"); // a link once the asking conversation is known, else text
  if (parent) from.setAttribute("href", `#session=${encodeURIComponent(parent)}`);
  else from.removeAttribute("href");
  const live = liveTurn(ui.state);
  const stopButton = $("#stop");
  const hadFocus = document.activeElement === stopButton;
  stopButton.hidden = !live;
  if (hadFocus && !live) focusWriting(); // the turn ended by itself: focus is not lost
  $("#stop").disabled = ui.busy.has("stop");
  // Sending never blocks the box: a message written meanwhile goes after it (see submit).
  $("#send").setAttribute("aria-busy", String(ui.busy.has("send")));
  // Only a running turn takes a message in; one waiting for an answer queues it.
  $("#message").placeholder =
    live?.status === "running" ? "Add to the running turn…" : live ? "Queue a message for after this turn…" : "Send a message…";
}

function renderQueue(items) {
  const list = $("#queue");
  list.hidden = items.length === 0;
  list.replaceChildren(
    ...items.map((item) => {
      const li = el("li", { class: "queued", "data-delivery": item.delivery, "data-turn-id": item.turnId });
      const label = item.delivery === "guide" ? "joins the running turn" : "queued";
      li.append(el("span", { class: "queued-label" }, label), el("span", { class: "text", dir: "auto" }, item.content));
      return li;
    }),
  );
}

function renderTurns(container, items) {
  // A turn waiting behind an open one shows in the queue until that one ends.
  const waiting = new Set(items.filter((item) => item.delivery === "queue").map((item) => item.turnId));
  const wanted = ui.state.order.filter((id) => !waiting.has(id)).map((id) => ui.state.turns[id]);
  const seen = new Set();
  let previous = null;
  wanted.forEach((turn, index) => {
    let node = container.querySelector(`:scope > [data-turn-id="${CSS.escape(turn.turnId)}"]`);
    if (!node) node = newTurnElement(turn.turnId);
    placeAfter(container, node, previous); // in the page before it is drawn: its card can take focus
    setText(node.firstChild, `Turn ${index + 1}`);
    drawTurn(node, turn, { busy: ui.busy, announce, readOnly: isAskedSession(ui.sessionId) });
    previous = node;
    seen.add(node);
  });
  for (const child of [...container.children]) if (!seen.has(child)) child.remove();
  $("#empty").hidden = wanted.length > 0;
}

function tick() {
  const running = Object.values(ui.state.turns).some((turn) =>
    turn.blocks.some((b) => b.kind === "tool" && b.status === "running"),
  );
  if (running) schedule();
}



function sessionFromHash() {
  const match = /^#session=(.+)$/.exec(location.hash);
  try {
    return match ? decodeURIComponent(match[1]) : null;
  } catch {
    return null; // a malformed link: open the newest session instead
  }
}

// ── the sessions menu (narrow screens: the sessions column over the conversation) ──

function menuOpen() {
  return $("#menu").getAttribute("aria-expanded") === "true";
}

function setMenu(open) {
  $("#menu").setAttribute("aria-expanded", String(open));
  $("#sidebar").classList.toggle("open", open);
  if (open) ($("#sessions [aria-current='true']") ?? $("#new-session")).focus();
}

// ── wiring ────────────────────────────────────────────────────────────────────────

function bind() {
  const box = $("#message");
  // One message at a time, in the order written: one sent while the one before is still on
  // its way (its turn being read back, say) goes once that one is through, not lost. New
  // chat takes its place in the same line: a message written right after it goes to the
  // chat it makes, not to the one open before (nor to a chat of its own).
  let sending = Promise.resolve();
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = box.value.trim();
    if (!text) return;
    box.value = "";
    sending = sending
      .then(() => send(text))
      .then((sent) => {
        if (!sent && !box.value) box.value = text; // not sent: the text is not lost
      });
  });
  // Enter that confirms an input method's text sends nothing. Safari ends the composition
  // before that keydown (isComposing false), with keyCode 229 or in the same task.
  let composed = false;
  box.addEventListener("compositionend", () => {
    composed = true;
    setTimeout(() => (composed = false));
  });
  box.addEventListener("keydown", (event) => {
    const confirming = event.isComposing || event.keyCode === 229 || composed;
    if (event.key === "Enter" && !event.shiftKey && !confirming) {
      event.preventDefault();
      $("#composer").requestSubmit();
    }
  });
  $("#stop").addEventListener("click", stop);
  $("#menu").addEventListener("click", () => setMenu(!menuOpen()));
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || !menuOpen()) return;
    setMenu(false);
    $("#menu").focus();
  });
  document.addEventListener("click", (event) => {
    if (menuOpen() && !event.target.closest("#sidebar, #menu")) setMenu(false);
  });
  $("#new-session").addEventListener("click", () => {
    if (menuOpen()) setMenu(false);
    box.focus();
    sending = sending.then(newChat);
  });
  $("#sessions").addEventListener("click", (event) => {
    const button = event.target.closest("[data-session-id]");
    if (!button) return;
    if (menuOpen()) setMenu(false);
    box.focus(); // the chat picked: write in it
    if (button.dataset.sessionId !== ui.sessionId) openSession(button.dataset.sessionId, { push: true });
  });
  const turns = $("#turns");
  turns.addEventListener("click", (event) => {
    const again = event.target.closest("[data-retry]");
    if (again) return retry(again.dataset.retry);
    const button = event.target.closest("[data-decision], [data-choice]");
    if (!button) return;
    const turnId = button.closest("[data-turn-id]").dataset.turnId;
    const requestId = button.closest("[data-request-id]").dataset.requestId;
    decide(turnId, requestId, button.dataset.decision ?? button.dataset.choice);
  });
  turns.addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.target;
    const answer = form.elements.answer.value.trim();
    if (!answer) return;
    decide(form.closest("[data-turn-id]").dataset.turnId, form.closest("[data-request-id]").dataset.requestId, answer);
  });
  window.addEventListener("hashchange", () => {
    const wanted = sessionFromHash();
    if (wanted && wanted !== ui.sessionId) openSession(wanted);
  });
  // The buttons come disabled (index.html) until now: before this a click did nothing, and
  // Send submitted the form itself, a reload that lost what was written.
  for (const button of ["#new-session", "#menu", "#send"]) $(button).disabled = false;
}

async function start() {
  bind();
  tabs?.addEventListener("message", heardFromTab);
  setInterval(tick, 500);
  await refreshSessions();
  if (ui.sessionId) return; // a chat was opened while the list loaded (New chat, a message)
  const wanted = sessionFromHash() ?? ui.sessions[0]?.sessionId ?? null;
  if (wanted) await openSession(wanted);
  else schedule();
}

start();
