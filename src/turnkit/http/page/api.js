// The turnkit HTTP routes the chat page calls (see docs/http-api.md). Paths are relative
// to the page, so the app may be served under a prefix.

export const API = new URL("api/harness", document.baseURI).pathname;

/**
 * An error answer: `status`, and from a problem body its `code` and the server's `detail`.
 * An answer with no problem body (a proxy's HTML error page) is put in plain words.
 */
export class ProblemError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || unexplained(status));
    this.status = status;
    this.code = problem?.code ?? null;
  }
}

/** Whether a failed answer may go again as it is: the way in had no answer from the server. */
const GATEWAY = new Set([502, 503, 504]);

function unexplained(status) {
  if (GATEWAY.has(status)) return `The server did not answer (HTTP ${status}); try again in a moment.`;
  return `The request failed (HTTP ${status}) with no reason given.`;
}

/** The error a failed answer stands for; its body is read only when it is JSON. */
async function failure(res) {
  const json = /[/+]json\b/i.test(res.headers.get("Content-Type") ?? "");
  return new ProblemError(res.status, json ? await res.json().catch(() => null) : null);
}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(`${API}${path}`, init);
  if (!res.ok) throw await failure(res);
  return res.status === 204 ? null : res.json();
}

const seg = encodeURIComponent;

export const listSessions = () => call("GET", "/sessions?limit=100");
export const getSession = (id) => call("GET", `/sessions/${seg(id)}`);
export const createSession = () => call("POST", "/sessions", {});
export const deleteSession = (id) => call("DELETE", `/sessions/${seg(id)}`);
export const history = (id) => call("GET", `/sessions/${seg(id)}/history`);
export const sessionPending = (id) => call("GET", `/sessions/${seg(id)}/pending`);
export const sessionQueue = (id) => call("GET", `/sessions/${seg(id)}/queue`);
export const turnPending = (turnId) => call("GET", `/turns/${seg(turnId)}/pending`);
export const cancelTurn = (turnId) => call("POST", `/turns/${seg(turnId)}/cancel`, undefined);
export const approve = (turnId, requestId, decision) =>
  call("POST", `/turns/${seg(turnId)}/approvals/${seg(requestId)}`, { decision });
export const clarify = (turnId, requestId, answer) =>
  call("POST", `/turns/${seg(turnId)}/clarifications/${seg(requestId)}`, { answer });

/**
 * Send a message: the execute POST. Only its `X-Turn-Id` header is read; the body is
 * dropped at once (closing it never stops the turn) and the page follows the turn with an
 * EventSource from its first event. A connection that fails before the answer, or a 502,
 * 503 or 504 (a proxy that got no answer), is retried with the same `requestId`, which
 * names the first turn again instead of starting a second one.
 */
export function execute(sessionId, body) {
  return startTurn(`/sessions/${seg(sessionId)}/execute`, {
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

/** Send a failed turn's message again as a new turn (its id); `key` makes it once only. */
export function retry(turnId, key) {
  return startTurn(`/turns/${seg(turnId)}/retry`, { headers: { "Idempotency-Key": key } });
}

async function startTurn(path, { headers, body }) {
  let lastError = null;
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const controller = new AbortController();
    try {
      const res = await fetch(`${API}${path}`, {
        method: "POST",
        headers: { ...headers, Accept: "text/event-stream" },
        body,
        cache: "no-store",
        signal: controller.signal,
      });
      if (!res.ok) throw await failure(res);
      const turnId = res.headers.get("X-Turn-Id");
      controller.abort();
      return turnId;
    } catch (err) {
      if (err instanceof ProblemError && !GATEWAY.has(err.status)) throw err;
      lastError = err;
      if (attempt < 2) await new Promise((resolve) => setTimeout(resolve, 300 * (attempt + 1)));
    }
  }
  throw lastError;
}

/** An idempotency key for one message. */
export function requestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `page-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}
