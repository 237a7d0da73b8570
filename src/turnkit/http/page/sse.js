// Follow one turn's stream with the browser's own EventSource.
//
// `GET {api}/turns/{id}/stream?after=<cursor>` opens the stream after the events the page
// already folded. When the connection drops, the browser reconnects by itself and sends
// `Last-Event-ID` (the `seq` of the last durable event it saw; the header wins over
// `?after=`). The server replays the committed events after it, then a
// `message.snapshot` with the whole text so far of a block still being written, then the
// live deltas, so the text on screen is never doubled or cut. The keep-alives an idle
// stream sends are comment lines: EventSource never dispatches them.
//
// When the browser gives up (an HTTP error, or the server was down long enough), the page
// asks `GET {api}/turns/{id}` whether the turn still exists and opens a new EventSource
// from its cursor, backing off 500 ms doubling to 5 s.

/**
 * Follow `turnId` until its `done`. Resolves "done", "aborted" (the signal fired) or
 * "gone" (the turn answered 404).
 *
 * `cursor()` is the `seq` of the last durable event the page folded; `onEvent(event)`
 * gets each event's JSON; `onConnection(how)` hears `live`, `reconnecting` and `lost`.
 */
export function followTurn({
  api,
  turnId,
  cursor,
  onEvent,
  onConnection = () => {},
  signal,
  minDelayMs = 500,
  maxDelayMs = 5000,
}) {
  const base = `${api}/turns/${encodeURIComponent(turnId)}`;
  return new Promise((resolve) => {
    let source = null;
    let timer = null;
    let delay = minDelayMs;
    let settled = false;

    const finish = (how) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      source?.close();
      signal.removeEventListener("abort", onAbort);
      resolve(how);
    };
    const onAbort = () => finish("aborted");
    if (signal.aborted) return finish("aborted");
    signal.addEventListener("abort", onAbort, { once: true });

    const open = () => {
      if (settled) return;
      source = new EventSource(`${base}/stream?after=${cursor()}`);
      source.onopen = () => {
        delay = minDelayMs;
        onConnection("live");
      };
      source.onmessage = (message) => {
        let event;
        try {
          event = JSON.parse(message.data);
        } catch {
          return; // not an event of ours
        }
        onEvent(event);
        if (event.type === "done") finish("done"); // close before the browser reconnects
      };
      source.onerror = () => {
        if (settled) return;
        onConnection("reconnecting");
        if (source.readyState !== EventSource.CLOSED) return; // the browser retries itself
        source.close();
        timer = setTimeout(check, delay);
        delay = Math.min(delay * 2, maxDelayMs);
      };
    };

    const check = async () => {
      try {
        const res = await fetch(base, { headers: { Accept: "application/json" }, signal });
        if (res.status === 404) {
          onConnection("lost");
          return finish("gone");
        }
      } catch {
        // the server is still out of reach: try the stream again anyway, later
      }
      open();
    };

    open();
  });
}
