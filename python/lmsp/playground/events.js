// Following a task's events (GET /lmsp/v1/tasks/{id}/events), resuming after every drop.
//
// Without tokens this is the browser's own EventSource: it reconnects by itself, sending
// Last-Event-ID, and a 204 (nothing after the final event) or any other refusal closes it
// for good. EventSource cannot send an Authorization header, and the service takes tokens
// nowhere else (a token in a URL would end up in logs and history), so with a token the same
// contract is kept by hand on fetch(): Last-Event-ID on every reconnect, stop on anything but
// a 200 event stream.

import { authHeaders, token } from "./api.js";

const EVENT_NAMES = [
  "response.created",
  "response.output_item.added",
  "response.output_text.delta",
  "response.function_call_arguments.delta",
  "response.reasoning_summary_text.delta",
  "response.output_item.done",
  "response.completed",
  "response.incomplete",
  "response.failed",
  "response.cancelled",
];
const RETRY_MS = 2000; // between fetch reconnects, as EventSource waits between its own

// handlers: onEvent(id, name, data), onReconnecting(), onOpen(), onEnded() when the stream
// is closed for good without the page having closed it (the task tells how it ended).
export function followTask(taskId, handlers) {
  const url = `/lmsp/v1/tasks/${encodeURIComponent(taskId)}/events`;
  return token() ? withFetch(url, handlers) : withEventSource(url, handlers);
}

function withEventSource(url, h) {
  const source = new EventSource(url);
  let closed = false;
  const close = () => {
    closed = true;
    source.close();
  };
  for (const name of EVENT_NAMES) {
    source.addEventListener(name, (e) => h.onEvent(Number(e.lastEventId), name, JSON.parse(e.data)));
  }
  source.addEventListener("open", () => h.onOpen());
  // The service's `error` event and the connection's error share the name; only the first has data.
  source.addEventListener("error", (e) => {
    if (closed) return;
    if (e instanceof MessageEvent) {
      h.onEvent(Number(e.lastEventId), "error", JSON.parse(e.data));
    } else if (source.readyState === EventSource.CLOSED) {
      closed = true;
      h.onEnded();
    } else {
      h.onReconnecting();
    }
  });
  return { close };
}

function withFetch(url, h) {
  const abort = new AbortController();
  let last = 0;
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  (async () => {
    for (;;) {
      const headers = { ...authHeaders() };
      if (last) headers["last-event-id"] = String(last);
      try {
        const response = await fetch(url, { headers, signal: abort.signal, cache: "no-store" });
        if (response.status !== 200 || !response.headers.get("content-type")?.startsWith("text/event-stream")) {
          await response.body?.cancel();
          h.onEnded();
          return;
        }
        h.onOpen();
        await readFrames(response.body, (id, name, data) => {
          last = id;
          h.onEvent(id, name, JSON.parse(data));
        });
      } catch (error) {
        if (abort.signal.aborted) return;
      }
      if (abort.signal.aborted) return;
      h.onReconnecting();
      await sleep(RETRY_MS);
      if (abort.signal.aborted) return;
    }
  })();
  return { close: () => abort.abort() };
}

// The WHATWG event-stream format: fields up to a blank line make one event; a frame cut by
// a dropped connection is never dispatched, so a resume after the last id loses nothing.
async function readFrames(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let id = null;
  let name = "message";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
      if (line === "") {
        if (data.length && id !== null) dispatch(Number(id), name, data.join("\n"));
        name = "message";
        data = [];
        continue;
      }
      if (line.startsWith(":")) continue; // a keep-alive comment
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") id = text;
      else if (field === "event") name = text;
      else if (field === "data") data.push(text);
    }
  }
}
