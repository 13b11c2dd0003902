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
//     .close()                    closes the socket
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
//     a new one.
// A refused upgrade (401/403/429) looks to a browser like any failed
// connection: the socket closes with 1006 before "open", and its body cannot
// be read. AcpConnection.open rejects with a ConnectError in that case.

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

/** A JSON-RPC 2.0 connection to an ACP agent over one WebSocket. */
export class AcpConnection {
  /**
   * Opens the socket. Resolves with the connection once it is open; rejects
   * with ConnectError if it closes first (refused upgrade, unreachable host).
   * opts: {token, ticket, protocols, timeoutMs}
   */
  static open(url, { token = "", ticket = "", timeoutMs = 15000 } = {}) {
    const ws = new WebSocket(gatewayUrl(url, { ticket }), subprotocols(token));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        ws.close();
        reject(new ConnectError("timed out opening the WebSocket"));
      }, timeoutMs);
      ws.addEventListener("open", () => {
        clearTimeout(timer);
        resolve(new AcpConnection(ws));
      }, { once: true });
      ws.addEventListener("close", (ev) => {
        clearTimeout(timer);
        reject(new ConnectError("the WebSocket closed before it opened", { code: ev.code, reason: ev.reason }));
      }, { once: true });
    });
  }

  /** Wraps an already open WebSocket. */
  constructor(ws) {
    this.ws = ws;
    this.nextId = 1;
    this.pending = new Map(); // our request id -> {resolve, reject, method}
    this.incoming = new Map(); // the agent's request id (as JSON) -> AbortController
    this.handlers = new Map(); // method -> fn(params, {id, signal}) for the agent's requests
    this.listeners = new Map(); // method -> Set of fn(params) for the agent's notifications
    this.closeListeners = new Set();
    this.closed = null; // {code, reason, wasClean} once closed
    this.onProtocolError = (err) => console.warn("acp:", err);

    ws.addEventListener("message", (ev) => this.#receive(ev.data));
    ws.addEventListener("close", (ev) => this.#onClose(ev));
  }

  /** The subprotocol the server selected ("acp" with acpgate). */
  get protocol() {
    return this.ws.protocol;
  }

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

  /** Called once with {code, reason, wasClean} when the socket closes. */
  onClose(fn) {
    if (this.closed) queueMicrotask(() => fn(this.closed));
    else this.closeListeners.add(fn);
  }

  /** Closes the socket (1000 normal closure). */
  close(code = 1000, reason = "") {
    if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING) {
      this.ws.close(code, reason);
    }
  }

  #send(msg) {
    this.ws.send(JSON.stringify(msg));
  }

  #receive(data) {
    if (typeof data !== "string") return; // binary frames are not ACP
    let msg;
    try {
      msg = JSON.parse(data);
    } catch (err) {
      this.onProtocolError(new Error("invalid JSON from the server: " + err.message));
      return;
    }
    if (Array.isArray(msg)) {
      msg.forEach((m) => this.#dispatch(m)); // ACP v1 sends no batches; tolerate them anyway
    } else {
      this.#dispatch(msg);
    }
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
    if (msg.error) p.reject(new AcpError(msg.error.code, msg.error.message, msg.error.data));
    else p.resolve(msg.result ?? null);
  }

  #notification(method, params) {
    if (method === "$/cancel_request") {
      // The agent withdraws one of its requests: abort the handler's signal.
      // The handler still answers (acpgate and the agent expect one answer).
      this.incoming.get(JSON.stringify(params.requestId))?.abort();
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
    this.incoming.set(key, ctl);
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
    if (!this.closed) this.#send(reply);
  }

  #onClose(ev) {
    this.closed = { code: ev.code, reason: ev.reason, wasClean: ev.wasClean };
    const err = new ConnectError(`connection closed (${ev.code}${ev.reason ? ": " + ev.reason : ""})`, { ...this.closed, opened: true });
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const ctl of this.incoming.values()) ctl.abort();
    for (const fn of this.closeListeners) fn(this.closed);
    this.closeListeners.clear();
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

  /** initialize: must be the first request on a connection. */
  async initialize(clientCapabilities = {}, clientInfo = { name: "acp.js", version: "1" }) {
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
