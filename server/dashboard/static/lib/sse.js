// Server-sent events over fetch(). EventSource cannot send an Authorization header, so the
// dashboard reads the `text/event-stream` body itself and reconnects with `Last-Event-ID`.

import { ApiError, authHeaders } from "./api.js";

/**
 * Incremental parser of the text/event-stream format: push() decoded chunks, get whole events.
 * An event is `{id, event, data, retry}`; `id` stays the last one seen, as the spec says.
 */
export class SseParser {
  constructor() {
    this.buffer = "";
    this.lastId = null;
    this.retry = null; // the server's reconnection delay (ms), from its latest `retry:` line
    this.reset();
  }

  reset() {
    this.eventType = "";
    this.dataLines = [];
  }

  push(chunk) {
    this.buffer += chunk;
    const events = [];
    // Lines end with \n, \r\n or \r; a trailing \r may be half of a \r\n still in flight.
    let match;
    const lineEnd = /\r\n|\n|\r(?!$)/g;
    let start = 0;
    while ((match = lineEnd.exec(this.buffer)) !== null) {
      const line = this.buffer.slice(start, match.index);
      start = match.index + match[0].length;
      const event = this.line(line);
      if (event) events.push(event);
    }
    this.buffer = this.buffer.slice(start);
    return events;
  }

  line(line) {
    if (line === "") {
      if (this.dataLines.length === 0) {
        this.reset();
        return null;
      }
      const event = { id: this.lastId, event: this.eventType || "message", data: this.dataLines.join("\n") };
      this.reset();
      return event;
    }
    if (line.startsWith(":")) return null; // a comment: servers send these as keep-alives
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.dataLines.push(value);
    else if (field === "event") this.eventType = value;
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    return null;
  }
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });

/**
 * Follow an event stream until `signal` aborts or `shouldReconnect()` answers false after the
 * server closed it. Each event's `data` is parsed as JSON and given to `onEvent(data, raw)`
 * (`raw.event` is the SSE event name, e.g. "end" when the server says the stream is complete);
 * `onState("live" | "reconnecting" | "closed" | "error", detail)` reports the connection.
 */
export async function followEventStream(
  path,
  { onEvent, onState = () => {}, signal, shouldReconnect = () => true, lastEventId = null },
) {
  let retryMs = 1000;
  let failures = 0;
  let lastId = lastEventId;
  while (!signal?.aborted) {
    try {
      const headers = { Accept: "text/event-stream", ...authHeaders() };
      if (lastId !== null) headers["Last-Event-ID"] = String(lastId);
      const response = await fetch(path, { headers, signal, cache: "no-store" });
      if (!response.ok) {
        let envelope = null;
        try {
          envelope = (await response.json()).error;
        } catch {
          /* not the JSON envelope */
        }
        throw new ApiError(response.status, envelope || { message: `event stream: HTTP ${response.status}` });
      }
      onState("live");
      failures = 0;
      const parser = new SseParser();
      parser.lastId = lastId;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const events = parser.push(value);
        if (parser.retry !== null) retryMs = parser.retry;
        for (const event of events) {
          lastId = event.id;
          let data;
          try {
            data = JSON.parse(event.data);
          } catch {
            data = { type: event.event, message: event.data };
          }
          onEvent(data, event);
        }
      }
    } catch (err) {
      if (signal?.aborted || err.name === "AbortError") break;
      // 4xx other than rate limiting will not get better by retrying (bad token, unknown job).
      if (err instanceof ApiError && err.status >= 400 && err.status < 500 && err.status !== 429) {
        onState("error", err);
        return;
      }
      failures += 1;
      onState("reconnecting", err);
    }
    if (signal?.aborted) break;
    if (!(await shouldReconnect())) break;
    onState("reconnecting");
    // Back off while the server is unreachable; reconnect promptly after a clean close.
    await sleep(Math.min(15_000, retryMs * 2 ** Math.min(failures, 4)), signal);
  }
  onState("closed");
}
