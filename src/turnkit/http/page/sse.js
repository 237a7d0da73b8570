// Server-sent events over fetch: a parser for a response body, and a follower that keeps
// one turn's stream going across dropped connections.
//
// The parser follows the EventSource rules: lines end in LF, CRLF or CR; a line starting
// with ":" is a comment (turnkit's keep-alives) and is ignored; a blank line dispatches the
// event, but only if it had data, so a comment can never become an empty event.

/** A push parser: feed it decoded text; `onEvent({id, event, data})` per complete event. */
export function createParser(onEvent) {
  let pending = "";
  let data = [];
  let id = null;
  let name = "";

  function line(text) {
    if (text === "") {
      if (data.length > 0) onEvent({ id, event: name || "message", data: data.join("\n") });
      data = [];
      id = null;
      name = "";
      return;
    }
    if (text.startsWith(":")) return; // a comment: keep-alive, dropped-frame note
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "id" && !value.includes("\0")) id = value;
    else if (field === "event") name = value;
  }

  return {
    push(chunk) {
      pending += chunk;
      let start = 0;
      let i = 0;
      while (i < pending.length) {
        const c = pending[i];
        if (c !== "\n" && c !== "\r") {
          i += 1;
          continue;
        }
        if (c === "\r" && i + 1 === pending.length) break; // a LF may follow in the next chunk
        line(pending.slice(start, i));
        i += c === "\r" && pending[i + 1] === "\n" ? 2 : 1;
        start = i;
      }
      pending = pending.slice(start);
    },
    /** The body ended: an event without its blank line is incomplete and dropped. */
    end() {
      pending = "";
      data = [];
    },
  };
}

/** Read a fetch body, calling `onEvent(parsedJson)`; resolves true once `done` arrived. */
export async function readEvents(body, onEvent) {
  let finished = false;
  const parser = createParser((sse) => {
    if (finished) return;
    let event;
    try {
      event = JSON.parse(sse.data);
    } catch {
      return; // not an event of ours
    }
    onEvent(event);
    if (event.type === "done") finished = true;
  });
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    while (!finished) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.push(value);
    }
  } finally {
    parser.end();
    reader.cancel().catch(() => {});
  }
  return finished;
}

/**
 * Follow one turn until its `done`: read `response` if given (the execute POST), and after
 * any drop GET `{api}/turns/{id}/stream` again with `Last-Event-ID: <cursor()>` (`?after=0`
 * when nothing durable arrived yet), backing off 250 ms doubling to 5 s.
 *
 * Resolves "done", "aborted" (the signal fired) or "gone" (the turn answered 4xx).
 */
export async function followTurn({
  api,
  turnId,
  cursor,
  onEvent,
  onConnection = () => {},
  signal,
  response = null,
  fetchImpl = (...args) => fetch(...args),
  minDelayMs = 250,
  maxDelayMs = 5000,
}) {
  let res = response;
  let delay = minDelayMs;
  while (!signal.aborted) {
    try {
      if (res === null) res = await openStream({ api, turnId, after: cursor(), signal, fetchImpl });
      if (res.status >= 400 && res.status < 500) {
        onConnection("lost");
        return "gone";
      }
      if (!res.ok || res.body === null) throw new Error(`stream answered ${res.status}`);
      onConnection("live");
      const seen = { any: false };
      const finished = await readEvents(res.body, (event) => {
        seen.any = true;
        onEvent(event);
      });
      if (finished) return "done";
      if (seen.any) delay = minDelayMs;
    } catch (err) {
      if (signal.aborted) break;
    }
    res = null;
    if (signal.aborted) break;
    onConnection("reconnecting");
    await sleep(delay, signal);
    delay = Math.min(delay * 2, maxDelayMs);
  }
  return "aborted";
}

function openStream({ api, turnId, after, signal, fetchImpl }) {
  const base = `${api}/turns/${encodeURIComponent(turnId)}/stream`;
  const init = { signal, headers: { Accept: "text/event-stream" }, cache: "no-store" };
  if (after > 0) {
    init.headers["Last-Event-ID"] = String(after);
    return fetchImpl(base, init);
  }
  return fetchImpl(`${base}?after=0`, init);
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}
