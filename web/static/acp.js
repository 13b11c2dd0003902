// acp.js: a small ACP (Agent Client Protocol) v1 client over WebSocket.
//
// This module has no dependencies and no DOM code, so it can be copied into
// any browser front end (or Node >= 22, which has a global WebSocket). It
// speaks JSON-RPC 2.0, one message per WebSocket text frame, as acpgate and
// the ACP remote-transport RFD expect.
//
// The pieces, from the bottom up:
//
//   gatewayUrl(url, {ticket})     the /acp URL; a one-time ticket goes in the query
//   subprotocols(token)           ["acp"] or ["acp", "acp.bearer.<token>"]
//   AcpConnection.open(url, opts) opens the socket; resolves once it is open
//     .request(method, params)    a request; resolves with result, rejects with AcpError
//     .notify(method, params)     a notification (no answer)
//     .handle(method, fn)         answers the agent's requests (fs/*, permission…)
//     .on(method, fn)             receives the agent's notifications (session/update)
//     .onLink(fn)                 "reconnecting" / "resumed" while a dropped socket is resumed
//     .onClose(fn)                the connection is over (no resume possible)
//     .close()                    closes the socket (1000: the gateway forgets the connection)
//   AcpClient                     typed wrappers for the v1 methods
//   backoff(attempt)              the delay before reconnect attempt N
//
// A minimal session (error handling left out):
//
//   const conn = await AcpConnection.open(gatewayUrl(location.origin + "/acp"), { token });
//   const acp = new AcpClient(conn);
//   const init = await acp.initialize({ fs: { readTextFile: true, writeTextFile: true } });
//   conn.on("session/update", (p) => console.log(p.update.sessionUpdate, p.update));
//   conn.handle("session/request_permission", async (p) =>
//     ({ outcome: { outcome: "selected", optionId: p.options[0].optionId } }));
//   const { sessionId } = await acp.newSession("/workspace");
//   const { stopReason } = await acp.prompt(sessionId, [{ type: "text", text: "hello" }]);
//
// Authentication with acpgate (a browser cannot set headers on a WebSocket):
//   - a bearer token goes in the subprotocol list, next to "acp". The gateway
//     selects "acp" and never echoes the token. Never put a token in the URL:
//     URLs end up in logs and history.
//   - a one-time ticket (from POST /v1/tickets, made by your backend) goes in
//     the query: /acp?ticket=…. Tickets are single-use, so a reconnect needs
//     a new one: pass opts.getTicket, an async function that fetches one.
// A refused upgrade (401/403/429) looks to a browser like any failed
// connection: the socket closes with 1006 before "open", and its body cannot
// be read. AcpConnection.open rejects with a ConnectError in that case.
//
// Resuming after a dropped socket (an acpgate extension; this module does it
// for you, and the rest of this comment is for those who write their own):
//
//   1. When the gateway keeps dropped connections (sessions.detach_timeout
//      > 0, 5 minutes by default), the initialize result carries an opaque
//      result._meta.acpgate.resumeToken. Treat it like a password: never log
//      or show it. acp.js removes it from the result it returns and keeps it,
//      with the counters below, in sessionStorage under a key made from the
//      gateway URL, so a reload of the tab resumes too.
//   2. Both sides count messages (text frames) across sockets. The client
//      counts every message it receives except _acpgate/resumed; the gateway
//      counts every message it received from the client. The client keeps
//      the last messages it sent (1,000 here), numbered by that count.
//   3. When the socket closes with anything but a close the client asked
//      for with 1000 (1006 network loss, 1001, the gateway restarting…),
//      the client reconnects with backoff to
//        GET /acp?resume=<token>&received=<n>      (+ &ticket=<a new ticket>)
//      with its usual credentials, n being its received count. Requests in
//      flight stay pending, and whatever the client sends meanwhile is only
//      logged.
//   4. Refused (token unknown or expired, e.g. after a gateway restart): the
//      upgrade fails with HTTP 404 {"error":"resume_refused"}, which a browser
//      sees as a close 1006 before "open". acp.js then asks GET /healthz:
//      if the gateway answers, the resume was refused; if not, it is away and
//      acp.js tries again. On refusal the connection ends (onClose with
//      resumeRefused: true, pending requests rejected): open a new one,
//      initialize, and session/load your session.
//   5. Accepted: the first message on the new socket is
//        {"jsonrpc":"2.0","method":"_acpgate/resumed","params":{"received":m}}
//      m being how many client messages the gateway had. The client sends
//      again, in order, its messages after the first m. The gateway sends
//      every message after the client's first n, in order, exactly once
//      (responses to pending requests, session/update, the agent's
//      requests), then live traffic. JSON-RPC ids keep their values.
//   6. A connection the gateway keeps is also taken over by a plain client
//      that connects anew and calls session/load or session/resume on one
//      of its sessions. If a turn ran meanwhile, the gateway answers the load
//      itself with result._meta.acpgate.turn = "running" or "ended" (and
//      stopReason), then sends the session's session/update messages since
//      the drop, sends the agent's pending requests again with new ids, and
//      when a running turn ends later, the notification
//        _acpgate/turn_ended {"sessionId", "stopReason"}.
//
// acp.js does not resume after a close 1008 "superseded": another client
// (a duplicated tab has the same sessionStorage) resumed the connection, and
// taking it back would make the two fight over it.

/** The ACP protocol version this client speaks. */
export const PROTOCOL_VERSION = 1;

/** JSON-RPC and ACP error codes (PROTOCOL.md §7). */
export const ErrorCode = Object.freeze({
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  REQUEST_CANCELLED: -32800,
  AUTH_REQUIRED: -32000,
  RESOURCE_NOT_FOUND: -32002,
});

/** An error answer to a request: {code, message, data}. */
export class AcpError extends Error {
  constructor(code, message, data) {
    super(message || `error ${code}`);
    this.name = "AcpError";
    this.code = code;
    this.data = data;
  }
}

/** The socket could not be opened, or it closed while a request waited. */
export class ConnectError extends Error {
  constructor(message, { code = 1006, reason = "", opened = false } = {}) {
    super(message);
    this.name = "ConnectError";
    this.code = code; // WebSocket close code
    this.reason = reason; // close reason sent by the server, if any
    this.opened = opened; // false: the upgrade itself failed (refused or unreachable)
  }
}

/**
 * The WebSocket URL: a relative or http(s) URL becomes ws(s), and a ticket
 * is added as ?ticket=. Tokens never go here; see subprotocols().
 */
export function gatewayUrl(url, { ticket = "" } = {}) {
  const u = new URL(url, globalThis.location?.href);
  if (u.protocol === "http:") u.protocol = "ws:";
  if (u.protocol === "https:") u.protocol = "wss:";
  if (u.protocol !== "ws:" && u.protocol !== "wss:") {
    throw new TypeError(`not a WebSocket URL: ${url}`);
  }
  if (ticket) u.searchParams.set("ticket", ticket);
  return u.href;
}

/** The subprotocol list: always "acp", plus the bearer token if there is one. */
export function subprotocols(token = "") {
  if (!token) return ["acp"];
  // A subprotocol is an HTTP token: no spaces, commas or other separators.
  if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(token)) {
    throw new TypeError("the token contains characters a WebSocket subprotocol cannot carry");
  }
  return ["acp", "acp.bearer." + token];
}

/**
 * The delay in milliseconds before reconnect attempt `attempt` (1, 2, …):
 * exponential from 500 ms, capped at 15 s, with ±20 % jitter so that many
 * clients do not come back at the same instant after a gateway restart.
 */
export function backoff(attempt, { base = 500, max = 15000 } = {}) {
  const d = Math.min(max, base * 2 ** Math.max(0, attempt - 1));
  return Math.round(d * (0.8 + Math.random() * 0.4));
}

/** The notification that starts a resumed socket (not counted). */
export const RESUMED = "_acpgate/resumed";

const SEND_LOG = 1000; // messages kept for re-sending after a resume

// sessionStorage, or null where there is none (Node, a sandboxed frame).
function defaultStorage() {
  try {
    return globalThis.sessionStorage ?? null;
  } catch {
    return null;
  }
}

/**
 * Whether the gateway behind a WebSocket URL answers GET /healthz: true,
 * false, or null when this cannot be told (another origin than the page's,
 * which a Content-Security-Policy may forbid fetching).
 */
export async function probeGateway(url) {
  const health = new URL("/healthz", url.replace(/^ws/, "http"));
  const here = globalThis.location?.origin;
  if (typeof fetch !== "function" || (here && here !== "null" && health.origin !== here)) return null;
  try {
    await fetch(health, { cache: "no-store" });
    return true;
  } catch {
    return false;
  }
}

/**
 * A JSON-RPC 2.0 connection to an ACP agent through acpgate. It usually
 * lives on one WebSocket; when that socket drops and the gateway keeps the
 * connection, it moves to a new socket (see "Resuming" above) without the
 * caller noticing, except through onLink.
 */
export class AcpConnection {
  /**
   * Opens the connection. Resolves once the socket is open (or, when a
   * saved connection of this tab was resumed, once it is resumed: then
   * .resumedAtOpen is true). Rejects with ConnectError if the socket closes
   * first (refused upgrade, unreachable host).
   * opts: {token, ticket, getTicket, timeoutMs, resume, storage, probe, resumeForMs}
   *   getTicket  async () => a new one-time ticket, for reconnects
   *   resume     false: never resume (a plain connection)
   *   storage    where the resume token and counters live (sessionStorage;
   *              null keeps them in memory only)
   *   probe      async (url) => true|false|null, see probeGateway
   *   resumeForMs how long to keep trying to resume (default 5 minutes)
   */
  static async open(url, opts = {}) {
    const conn = new AcpConnection(url, opts);
    await conn.#start();
    return conn;
  }

  #opts;
  #ticketUsed = false;
  #closing = false; // close() was called
  #rc = null; // while resuming: {attempt, since, close, timer, dialing}
  #key;

  constructor(url, { token = "", ticket = "", getTicket = null, timeoutMs = 15000, resume = true, storage = defaultStorage(), probe = probeGateway, resumeForMs = 300000 } = {}) {
    this.url = gatewayUrl(url);
    this.#opts = { token, ticket, getTicket, timeoutMs, resume, storage, probe, resumeForMs };
    this.#key = "acp.resume:" + this.url;
    subprotocols(token); // throws early on a token a subprotocol cannot carry
    this.ws = null; // the current socket; null while resuming
    this.nextId = 1;
    this.pending = new Map(); // our request id -> {resolve, reject, method}
    this.incoming = new Map(); // the agent's request id (as JSON) -> {ctl, method}
    this.handlers = new Map(); // method -> fn(params, {id, signal}) for the agent's requests
    this.listeners = new Map(); // method -> Set of fn(params) for the agent's notifications
    this.closeListeners = new Set();
    this.linkListeners = new Set();
    this.closed = null; // {code, reason, wasClean, resumeRefused} once over
    this.onProtocolError = (err) => console.warn("acp:", err);
    // Resume state: the token, the counters and the log of sent messages.
    this.resumeToken = ""; // never log this
    this.sent = 0;
    this.received = 0;
    this.sentLog = []; // [count, text] of the last SEND_LOG messages sent
    this.resumedAtOpen = false;
    this.savedInit = null; // the initialize result, when resumedAtOpen
  }

  /** The subprotocol the server selected ("acp" with acpgate). */
  get protocol() {
    return this.ws?.protocol ?? "";
  }

  /** Whether a dropped socket is being resumed right now. */
  get resuming() {
    return !!this.#rc;
  }

  // -- opening and resuming ---------------------------------------------------

  async #start() {
    let saved = this.#opts.resume ? this.#load() : null;
    const ints = (...v) => v.every((x) => Number.isInteger(x) && x >= 0);
    if (saved && !(typeof saved.token === "string" && saved.token && ints(saved.sent, saved.received, saved.nextId))) saved = null;
    // A saved connection of this tab (a reload): resume it if every message
    // the old page sent arrived, since the old page's log is gone.
    if (saved && (!this.#opts.ticket || this.#opts.getTicket)) {
      // nextId too: the old page's requests may still be answered.
      Object.assign(this, { resumeToken: saved.token, sent: saved.sent, received: saved.received, nextId: saved.nextId });
      try {
        const { ws, m } = await this.#dial(true);
        this.savedInit = this.#load("init");
        if (m === this.sent && this.savedInit) {
          this.resumedAtOpen = true;
          this.#adopt(ws, m);
          // Requests the old page never answered: the page that showed them
          // is gone, so answer them now instead of leaving the agent waiting.
          for (const [id, method] of saved.unanswered ?? []) {
            this.#send(method === "session/request_permission"
              ? { jsonrpc: "2.0", id, result: { outcome: { outcome: "cancelled" } } }
              : { jsonrpc: "2.0", id, error: { code: ErrorCode.REQUEST_CANCELLED, message: "request cancelled: the page was reloaded" } });
          }
          return;
        }
        ws.close(1000, "cannot re-send after a reload"); // the gateway forgets it
      } catch (err) {
        // Away: fail as a plain connection would, and keep the token for later.
        if (!err.opened && (await this.#probe()) === false) throw err;
      }
      this.#forget();
      Object.assign(this, { resumeToken: "", sent: 0, received: 0, nextId: 1 });
    }
    const { ws } = await this.#dial(false);
    this.#adopt(ws);
  }

  // Opens one socket. For a resume, resolves with the gateway's count m
  // from _acpgate/resumed, the first message; otherwise once it is open.
  async #dial(resume) {
    const { token, getTicket, timeoutMs } = this.#opts;
    let ticket = "";
    if (this.#opts.ticket && !this.#ticketUsed) {
      ticket = this.#opts.ticket;
      this.#ticketUsed = true;
    } else if (getTicket) {
      ticket = await getTicket();
    }
    const u = new URL(gatewayUrl(this.url, { ticket }));
    if (resume) {
      u.searchParams.set("resume", this.resumeToken);
      u.searchParams.set("received", String(this.received));
    }
    const ws = new WebSocket(u.href, subprotocols(token));
    return new Promise((resolve, reject) => {
      let opened = false;
      const fail = (err) => {
        clearTimeout(timer);
        ws.removeEventListener("message", first);
        ws.removeEventListener("close", closed);
        reject(err);
      };
      const timer = setTimeout(() => {
        ws.close();
        fail(new ConnectError("timed out opening the WebSocket", { opened }));
      }, timeoutMs);
      const closed = (ev) => {
        const err = new ConnectError(opened ? "the WebSocket closed before it resumed" : "the WebSocket closed before it opened", { code: ev.code, reason: ev.reason, opened });
        err.notResumed = opened; // upgraded, then closed: the gateway refused the resume
        fail(err);
      };
      const first = (ev) => {
        let msg = null;
        try {
          msg = JSON.parse(ev.data);
        } catch {
          // not JSON: handled below
        }
        const m = msg?.method === RESUMED ? msg.params?.received : undefined;
        if (!Number.isInteger(m) || m < 0) {
          ws.close(1000, "expected " + RESUMED);
          const err = new ConnectError("the gateway did not resume the connection", { opened: true });
          err.notResumed = true;
          return fail(err);
        }
        clearTimeout(timer);
        ws.removeEventListener("message", first);
        ws.removeEventListener("close", closed);
        resolve({ ws, m }); // the caller adopts ws before the next message (a microtask)
      };
      ws.addEventListener("close", closed);
      ws.addEventListener("open", () => {
        opened = true;
        if (resume) return;
        clearTimeout(timer);
        ws.removeEventListener("close", closed);
        resolve({ ws });
      }, { once: true });
      if (resume) ws.addEventListener("message", first);
    });
  }

  // Makes ws the connection's socket. After a resume (m = the gateway's
  // count) the messages the gateway missed are sent again, in order.
  #adopt(ws, m) {
    this.ws = ws;
    ws.addEventListener("message", (ev) => ws === this.ws && this.#receive(ev.data));
    ws.addEventListener("close", (ev) => ws === this.ws && this.#onSocketClose(ev));
    if (m === undefined) return;
    for (const [n, text] of this.sentLog) if (n > m) ws.send(text);
    this.#save();
    this.#emitLink({ state: "resumed", received: m, resent: this.sent - m });
  }

  #onSocketClose(ev) {
    this.ws = null;
    if (this.closed) return;
    const close = { code: ev.code, reason: ev.reason, wasClean: ev.wasClean };
    const superseded = ev.code === 1008 && /supersed/i.test(ev.reason);
    const canResume = this.#opts.resume && this.resumeToken && (!this.#opts.ticket || this.#opts.getTicket);
    if (this.#closing || !canResume || superseded) return this.#end(close);
    this.#rc = { attempt: 0, since: Date.now(), close, timer: null, dialing: false };
    this.#next();
  }

  // Waits a backoff, then tries to resume.
  #next() {
    const rc = this.#rc;
    rc.attempt++;
    if (Date.now() - rc.since > this.#opts.resumeForMs) return this.#end({ ...rc.close, resumeRefused: true });
    const delayMs = backoff(rc.attempt);
    this.#emitLink({ state: "reconnecting", attempt: rc.attempt, delayMs, close: rc.close });
    rc.timer = setTimeout(() => this.#tryResume(rc), delayMs);
  }

  async #tryResume(rc) {
    rc.timer = null;
    rc.dialing = true;
    let r;
    try {
      r = await this.#dial(true);
    } catch (err) {
      rc.dialing = false;
      if (this.#rc !== rc) return;
      if (err.notResumed) return this.#end({ ...rc.close, resumeRefused: true });
      if (!err.opened) {
        // Refused, or the gateway is away? Only /healthz can tell.
        const up = await this.#probe();
        if (this.#rc !== rc) return;
        if (up === true || (up === null && rc.attempt >= 3)) return this.#end({ ...rc.close, resumeRefused: true });
      }
      return this.#next();
    }
    if (this.#rc !== rc) {
      r.ws.close(1000, "client closed");
      return;
    }
    if (r.m > this.sent || r.m < this.sent - this.sentLog.length) {
      // The gateway has more than we sent, or we no longer have what it
      // misses: this connection cannot go on.
      r.ws.close(1000, "cannot re-send");
      return this.#end({ ...rc.close, resumeRefused: true });
    }
    this.#rc = null;
    this.#adopt(r.ws, r.m);
  }

  async #probe() {
    try {
      return await this.#opts.probe(this.url);
    } catch {
      return null;
    }
  }

  /** While resuming: skip the backoff and try now ("Reconnect now", back online). */
  reconnectNow() {
    const rc = this.#rc;
    if (!rc || rc.dialing) return;
    clearTimeout(rc.timer);
    this.#tryResume(rc);
  }

  // The connection is over: pending requests fail, handlers are aborted.
  #end(close) {
    if (this.closed) return;
    const rc = this.#rc;
    if (rc) clearTimeout(rc.timer);
    this.#rc = null;
    this.closed = { resumeRefused: false, ...close };
    this.#forget();
    const c = this.closed;
    const err = new ConnectError(`connection closed (${c.code}${c.reason ? ": " + c.reason : ""})`, { ...c, opened: true });
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const { ctl } of this.incoming.values()) ctl.abort();
    for (const fn of this.closeListeners) fn(c);
    this.closeListeners.clear();
    this.linkListeners.clear();
  }

  // -- saved state (sessionStorage) -------------------------------------------

  #load(part = "") {
    try {
      const v = this.#opts.storage?.getItem(this.#key + (part ? ":" + part : ""));
      return v ? JSON.parse(v) : null;
    } catch {
      return null;
    }
  }

  #save(part = "", value = null) {
    const st = this.#opts.storage;
    if (!st || !this.resumeToken || this.closed) return;
    if (!part) {
      const unanswered = [...this.incoming.entries()].map(([k, v]) => [JSON.parse(k), v.method]);
      value = { token: this.resumeToken, sent: this.sent, received: this.received, nextId: this.nextId, unanswered };
    }
    try {
      st.setItem(this.#key + (part ? ":" + part : ""), JSON.stringify(value));
    } catch {
      // full or forbidden: a reload will not resume, nothing else changes
    }
  }

  #forget() {
    try {
      this.#opts.storage?.removeItem(this.#key);
      this.#opts.storage?.removeItem(this.#key + ":init");
    } catch {
      // ignore
    }
  }

  /** Keeps the initialize result for a resume after a reload (AcpClient does this). */
  saveInit(init) {
    this.#save("init", init);
  }

  // -- messages ---------------------------------------------------------------

  /** Sends a request and resolves with its result (or rejects with AcpError). */
  request(method, params = {}, { signal } = {}) {
    if (this.closed) {
      return Promise.reject(new ConnectError("not connected", { ...this.closed, opened: true }));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.#send({ jsonrpc: "2.0", id, method, params });
      // Aborting a request sends $/cancel_request; the agent still answers it
      // (with a partial result or -32800), and that answer settles the promise.
      signal?.addEventListener("abort", () => {
        if (this.pending.has(id)) this.notify("$/cancel_request", { requestId: id });
      }, { once: true });
    });
  }

  /** Sends a notification. */
  notify(method, params = {}) {
    if (!this.closed) this.#send({ jsonrpc: "2.0", method, params });
  }

  /**
   * Registers the answer to one of the agent's request methods. fn receives
   * (params, {id, signal}) and returns the result (or a promise of it), or
   * throws: an AcpError becomes that error, anything else -32603. signal is
   * aborted if the agent withdraws the request with $/cancel_request.
   * Requests with no handler get -32601 (method not found).
   */
  handle(method, fn) {
    this.handlers.set(method, fn);
    return this;
  }

  /** Subscribes to one of the agent's notifications. Returns an unsubscribe function. */
  on(method, fn) {
    if (!this.listeners.has(method)) this.listeners.set(method, new Set());
    this.listeners.get(method).add(fn);
    return () => this.listeners.get(method)?.delete(fn);
  }

  /**
   * Called once with {code, reason, wasClean, resumeRefused} when the
   * connection is over: closed by close(), or the socket dropped and could
   * not be resumed (resumeRefused: true; open a new connection and load the
   * session). code is the close that lost the socket.
   */
  onClose(fn) {
    if (this.closed) queueMicrotask(() => fn(this.closed));
    else this.closeListeners.add(fn);
  }

  /**
   * Called while a dropped socket is resumed: {state: "reconnecting",
   * attempt, delayMs, close} before each attempt, then {state: "resumed",
   * received, resent}. Pending requests stay pending meanwhile.
   */
  onLink(fn) {
    this.linkListeners.add(fn);
    return () => this.linkListeners.delete(fn);
  }

  #emitLink(ev) {
    for (const fn of this.linkListeners) {
      try {
        fn(ev);
      } catch (err) {
        this.onProtocolError(err);
      }
    }
  }

  /**
   * Closes the connection. With 1000 (the default) the gateway forgets it;
   * either way this client stops here: no resume.
   */
  close(code = 1000, reason = "") {
    this.#closing = true;
    const ws = this.ws;
    if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) {
      ws.close(code, reason);
    } else {
      this.#end({ code, reason, wasClean: true });
    }
  }

  // Every message is counted and logged; it goes out now if the socket is
  // open, or with the others once the connection is resumed.
  #send(msg) {
    const text = JSON.stringify(msg);
    this.sent++;
    this.sentLog.push([this.sent, text]);
    if (this.sentLog.length > SEND_LOG) this.sentLog.shift();
    this.#save();
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(text);
  }

  #receive(data) {
    if (typeof data !== "string") return; // binary frames are not ACP
    let msg;
    try {
      msg = JSON.parse(data);
    } catch (err) {
      this.received++;
      this.#save();
      this.onProtocolError(new Error("invalid JSON from the server: " + err.message));
      return;
    }
    if (msg?.method === RESUMED) return; // only ever first on a resumed socket; not counted
    this.received++;
    if (Array.isArray(msg)) {
      msg.forEach((m) => this.#dispatch(m)); // ACP v1 sends no batches; tolerate them anyway
    } else {
      this.#dispatch(msg);
    }
    this.#save();
  }

  #dispatch(msg) {
    if (msg === null || typeof msg !== "object") return;
    const hasId = Object.hasOwn(msg, "id") && msg.id !== null;
    if (typeof msg.method === "string") {
      if (hasId) this.#answer(msg);
      else this.#notification(msg.method, msg.params ?? {});
      return;
    }
    // A response to one of our requests.
    const p = hasId ? this.pending.get(msg.id) : undefined;
    if (!p) {
      if (msg.error) this.onProtocolError(new AcpError(msg.error.code, msg.error.message, msg.error.data));
      return;
    }
    this.pending.delete(msg.id);
    if (p.method === "initialize") this.#takeToken(msg.result);
    if (msg.error) p.reject(new AcpError(msg.error.code, msg.error.message, msg.error.data));
    else p.resolve(msg.result ?? null);
  }

  // Keeps the resume token of an initialize result, and takes it out of
  // the result so that it is not shown or logged with it.
  #takeToken(result) {
    const meta = result?._meta?.acpgate;
    if (!meta || typeof meta.resumeToken !== "string") return;
    if (this.#opts.resume) this.resumeToken = meta.resumeToken;
    delete meta.resumeToken;
    this.#save();
  }

  #notification(method, params) {
    if (method === "$/cancel_request") {
      // The agent withdraws one of its requests: abort the handler's signal.
      // The handler still answers (acpgate and the agent expect one answer).
      this.incoming.get(JSON.stringify(params.requestId))?.ctl.abort();
      return;
    }
    const set = this.listeners.get(method);
    if (!set) return; // unknown notifications are ignored, as the spec asks
    for (const fn of set) {
      try {
        fn(params);
      } catch (err) {
        this.onProtocolError(err);
      }
    }
  }

  async #answer(msg) {
    const { id, method } = msg;
    const key = JSON.stringify(id);
    const fn = this.handlers.get(method);
    if (!fn) {
      this.#send({ jsonrpc: "2.0", id, error: { code: ErrorCode.METHOD_NOT_FOUND, message: `method not found: ${method}` } });
      return;
    }
    const ctl = new AbortController();
    this.incoming.set(key, { ctl, method });
    let reply;
    try {
      const result = await fn(msg.params ?? {}, { id, signal: ctl.signal });
      reply = { jsonrpc: "2.0", id, result: result ?? {} };
    } catch (err) {
      const error = err instanceof AcpError
        ? { code: err.code, message: err.message, ...(err.data !== undefined ? { data: err.data } : {}) }
        : ctl.signal.aborted
          ? { code: ErrorCode.REQUEST_CANCELLED, message: "request cancelled" }
          : { code: ErrorCode.INTERNAL_ERROR, message: String(err?.message ?? err) };
      reply = { jsonrpc: "2.0", id, error };
    } finally {
      this.incoming.delete(key);
    }
    // While resuming, the answer waits in the log and goes out on the new socket.
    if (!this.closed) this.#send(reply);
  }
}

/**
 * Typed wrappers for the ACP v1 client-to-agent methods (PROTOCOL.md §3.1).
 * Each returns the method's result. Check the capabilities from initialize
 * before calling a gated method (loadSession, sessionCapabilities.list, …).
 */
export class AcpClient {
  constructor(conn) {
    this.conn = conn;
    this.init = null; // the initialize result
  }

  /**
   * initialize: must be the first request on a connection. On a connection
   * that resumed this tab's connection after a reload (conn.resumedAtOpen),
   * the gateway already has it: this returns the saved result instead.
   */
  async initialize(clientCapabilities = {}, clientInfo = { name: "acp.js", version: "1" }) {
    if (this.conn.resumedAtOpen && this.conn.savedInit) {
      this.init = this.conn.savedInit;
      return this.init;
    }
    this.init = await this.conn.request("initialize", {
      protocolVersion: PROTOCOL_VERSION,
      clientCapabilities,
      clientInfo,
    });
    if (this.init?.protocolVersion !== PROTOCOL_VERSION) {
      // The agent answered with a version we do not speak: the spec says close.
      this.conn.close(1000, "unsupported protocol version");
      throw new AcpError(ErrorCode.INVALID_REQUEST, `the agent speaks ACP v${this.init?.protocolVersion}, this client v${PROTOCOL_VERSION}`);
    }
    this.conn.saveInit(this.init);
    return this.init;
  }

  get capabilities() {
    return this.init?.agentCapabilities ?? {};
  }

  /** Whether a capability marker is on: true, or an object ({} = supported). */
  static supported(v) {
    return v === true || (v !== null && typeof v === "object");
  }

  canLoad() {
    return this.capabilities.loadSession === true;
  }
  canList() {
    return AcpClient.supported(this.capabilities.sessionCapabilities?.list);
  }
  canResume() {
    return AcpClient.supported(this.capabilities.sessionCapabilities?.resume);
  }
  canClose() {
    return AcpClient.supported(this.capabilities.sessionCapabilities?.close);
  }

  authenticate(methodId) {
    return this.conn.request("authenticate", { methodId });
  }
  newSession(cwd, mcpServers = []) {
    return this.conn.request("session/new", { cwd, mcpServers });
  }
  /** Replays the history as session/update notifications, then resolves. */
  loadSession(sessionId, cwd, mcpServers = []) {
    return this.conn.request("session/load", { sessionId, cwd, mcpServers });
  }
  resumeSession(sessionId, cwd, mcpServers = []) {
    return this.conn.request("session/resume", { sessionId, cwd, mcpServers });
  }
  listSessions({ cwd, cursor } = {}) {
    const params = {};
    if (cwd) params.cwd = cwd;
    if (cursor) params.cursor = cursor;
    return this.conn.request("session/list", params);
  }
  closeSession(sessionId) {
    return this.conn.request("session/close", { sessionId });
  }
  /** Resolves with {stopReason} when the turn ends; updates stream meanwhile. */
  prompt(sessionId, prompt) {
    return this.conn.request("session/prompt", { sessionId, prompt });
  }
  /** Asks the agent to stop the turn; the prompt then resolves with stopReason "cancelled". */
  cancel(sessionId) {
    this.conn.notify("session/cancel", { sessionId });
  }
}
