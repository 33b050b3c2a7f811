// The WebSocket to /v1/stream: msgpack frames both ways, reconnect with backoff.

import { decode, encode } from "./msgpack.js";

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];

export class Connection {
  /**
   * handlers: onopen(hello), onmessage(msg), onstatus({state, retryInMs, code, reason, everOpened})
   * state is one of "connecting" | "open" | "closed" | "retrying".
   */
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.ws = null;
    this.attempt = 0;
    this.timer = null;
    this.hello = null;
    this.everOpened = false;
    this.stopped = false;
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN && this.hello !== null;
  }

  connect() {
    this.stopped = false;
    clearTimeout(this.timer);
    this.status({ state: "connecting" });
    const ws = new WebSocket(this.url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.hello = null;
    ws.onmessage = (event) => this.receive(ws, event.data);
    ws.onclose = (event) => this.closed(ws, event);
    // onerror is always followed by onclose, which does the work.
  }

  receive(ws, data) {
    if (ws !== this.ws) return;
    let msg;
    try {
      msg = typeof data === "string" ? JSON.parse(data) : decode(new Uint8Array(data));
    } catch (err) {
      this.handlers.onmessage({ type: "error", stream: null, code: "client_decode",
        message: `Could not read a message from the server (${err.message}).`, retryable: false });
      return;
    }
    if (msg && msg.type === "hello") {
      this.hello = msg;
      this.attempt = 0;
      this.everOpened = true;
      this.status({ state: "open" });
      this.handlers.onopen(msg);
      return;
    }
    this.handlers.onmessage(msg);
  }

  closed(ws, event) {
    if (ws !== this.ws) return;
    this.ws = null;
    this.hello = null;
    if (this.stopped) {
      this.status({ state: "closed", code: event.code, reason: event.reason });
      return;
    }
    const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    const jittered = Math.round(delay * (0.8 + 0.4 * Math.random()));
    this.attempt += 1;
    this.status({ state: "retrying", retryInMs: jittered, code: event.code, reason: event.reason });
    this.timer = setTimeout(() => this.connect(), jittered);
  }

  /** Reconnect now instead of waiting for the backoff timer. */
  retryNow() {
    if (this.ws) return;
    this.attempt = 0;
    this.connect();
  }

  close() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000);
  }

  /** Send a client message; returns false when not connected. */
  send(msg) {
    if (!this.isOpen) return false;
    this.ws.send(encode(msg));
    return true;
  }

  status(s) {
    this.handlers.onstatus({ everOpened: this.everOpened, ...s });
  }
}
