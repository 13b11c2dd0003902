// acp.js: a small ACP (Agent Client Protocol) v1 client over WebSocket or
// Streamable HTTP.
//
// This module has no dependencies and no DOM code, so it can be copied into
// any browser front end (or Node >= 22, which has a global WebSocket). It
// speaks JSON-RPC 2.0 over one of two transports, both on acpgate's /acp
// (the default agent) or /acp/<agent> (a named one, opts.agent):
//
//   "websocket" (the default)  one message per WebSocket text frame, as
//                              acpgate and the ACP remote-transport RFD expect
//   "http"                     Streamable HTTP, as the official ACP SDK's
//                              createHttpStream speaks it (see "Streamable
//                              HTTP" below); for where a WebSocket cannot go,
//                              e.g. through a proxy that refuses upgrades
//
// The pieces, from the bottom up:
//
//   gatewayUrl(url, {ticket, agent})  the /acp WebSocket URL; a one-time ticket goes in the query
//   gatewayHttpUrl(url, {agent})  the /acp URL for Streamable HTTP (http or https)
//   agentUrl(url, agent)          /acp -> /acp/<agent> (URL-encoded); no agent: url as it is
//   listAgents(url, opts)         GET /v1/agents: the agents these credentials may use
//   subprotocols(token)           ["acp"] or ["acp", "acp.bearer.<token>"]
//   AcpConnection.open(url, opts) opens the socket; resolves once it is open
//                                 (opts.transport: "websocket" or "http";
//                                 opts.agent: a named agent, at /acp/<agent>)
//     .request(method, params)    a request; resolves with result, rejects with AcpError
//     .notify(method, params)     a notification (no answer)
//     .handle(method, fn)         answers the agent's requests (fs/*, permission…)
//     .on(method, fn)             receives the agent's notifications (session/update)
//     .onLink(fn)                 "reconnecting" / "resumed" while a dropped socket
//                                 (or event stream) is resumed
//     .onClose(fn)                the connection is over (no resume possible)
//     .close()                    closes the socket (1000: the gateway forgets the connection)
//     .reopen()                   a new connection to the same agent, same options
//                                 (a ticket: a new one from getTicket; .canReopen)
//   AcpClient(conn, opts)         typed wrappers for the v1 methods; keeps the open
//                                 sessions (.sessions) and, after a refused resume,
//                                 connects anew and loads them (opts.reconnect, on by default)
//     .onReconnect(fn)            "reconnecting", "reconnected", "restoring", "restored",
//                                 "lost", "done" / "failed" (see "Connecting anew" below)
//     .close()                    closes the connection, and stops a reconnect
//     .attach(id, opts) / .detach(id)  acpgate's session sharing: join a live
//                                 session as one more of its clients (see
//                                 "Sharing a session" below), leave it
//   backoff(attempt)              the delay before reconnect attempt N
//   EventStreamParser             text/event-stream parsing, as the "http" transport reads it
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
// Several agents behind one gateway: /acp is the default agent, /acp/<name>
// a named one, and GET /v1/agents (same credentials) lists the ones this
// caller may use. Pick one and pass its name; sessions belong to an agent,
// so switching agents means a new connection:
//
//   const agents = await listAgents(location.origin + "/acp", { token });
//   // [{name, agentInfo: {name, title, version} | null, protocolVersion, ready, default}]
//   const conn = await AcpConnection.open(location.origin + "/acp", { token, agent: "second" });
//
// listAgents rejects with a ConnectError whose status is 404 when the
// gateway predates named agents: then use /acp (no agent) as before.
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
//      initialize, and session/load your session. AcpClient does that for
//      you (see "Connecting anew" below).
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
// Connecting anew (AcpClient, opts.reconnect: true by default). A refused
// resume (over HTTP: the gateway no longer has the connection, 404) means
// the gateway, or behind a balancer the replica that held the connection,
// lost it: it died or restarted, or kept it for less than the drop lasted.
// The conversation is not lost with it when the agent can load sessions
// (the replicas share the session key and the agent's session store), so
// AcpClient, which saw every session/new, session/load and session/resume
// go by (with their cwd and mcpServers), brings the sessions back itself:
//
//   1. the old connection's onClose listeners get the close with
//      resumeRefused: true and reconnecting: true (a page that reconnects
//      on its own leaves this one to AcpClient); onReconnect gets
//      {state: "reconnecting", close, sessions}.
//   2. conn.reopen(): the same URL and agent, transport and options; the
//      token, or a new ticket from getTicket. With only a ticket, spent by
//      the first connection, it cannot: onReconnect gets {state: "failed",
//      error} with error.reason "ticket spent", and nothing else happens.
//      Then initialize with the arguments the first one had (and
//      authenticate, if the client did). Up to opts.reconnectAttempts (3)
//      tries with backoff, then {state: "failed", close, error}.
//   3. {state: "reconnected", conn, previous, init}: acp.conn is the new
//      connection, with the old one's handle() and on() handlers (pending
//      requests of the old one were rejected; a turn that ran is over).
//   4. for each session, in the order they were opened: session/attach
//      (history "full"; acpgate gives the new connection a clientId of
//      its own: result.clientId) for one it attached to,
//      session/load if the agent advertises loadSession, else
//      session/resume if it has sessionCapabilities.resume, else {state:
//      "lost"}. Before each:
//      {state: "restoring", sessionId, method}; the history comes as
//      session/update before {state: "restored", sessionId, method,
//      result} (or "lost", with the error), and replaces the page's stale
//      view. Unless the gateway still kept the old connection and took the
//      session over from it (see 6 above: result._meta.acpgate.turn is
//      set): then only the updates since the drop come, after "restored".
//   5. {state: "done", restored, lost}.
//
// A page that shows one conversation at a time calls forgetSession() on
// the ones it leaves, so that only the open one is loaded again:
//
//   const acp = new AcpClient(conn); // or new AcpClient(conn, {reconnect: false})
//   const closed = (c) => c.reconnecting || showClosed(c); // reconnecting: AcpClient goes on
//   conn.onClose(closed);
//   acp.onReconnect((ev) => {
//     if (ev.state === "reconnected") ev.conn.onClose(closed);
//     if (ev.state === "restoring" && ev.method === "session/load") view.clear();
//     if (ev.state === "restored") view.note("The connection was lost and could not be resumed; the session was loaded again.");
//     if (ev.state === "failed" && ev.close.reconnecting) showClosed(ev.close);
//   });
//
// (web/static/app.js clears its view at the replay's first session/update
// instead, which also keeps it whole after a take-over.)
//
// Subagents (v1 unstable): a client that passes clientCapabilities
// {subagents: {}} to initialize may be told of an agent's child sessions:
// session/update {sessionId: PARENT, update: {sessionUpdate:
// "subagent_update", sessionId: CHILD, title?, state?: {state}}}, then the
// child's own session/update messages and requests (permission, fs) with
// sessionId CHILD, on the same connection (over HTTP, on the parent's
// stream). Through acpgate, CHILD is sealed like any session ID. A child is
// not one of .sessions: loading its parent again replays it. This client
// speaks ACP v1 only; acpgate gives a v1 client a v1 agent process, also of
// an agent that serves v1 and v2.
//
// Sharing a session (acpgate, issue #22; the initialize result carries
// agentCapabilities.sessionCapabilities.attach: canAttach()). Several
// clients, on any connections, may hold one live session:
//
//   const r = await acp.attach(sessionId, { readOnly: false });
//   // r.clientId, r.connectedClients [{clientId, name, version, readOnly}]
//   // the history came before r as session/update, as for session/load
//
// Then the session's pending permission requests come again as ordinary
// requests; the first client to answer one wins, and acpgate withdraws the
// others' copies with $/cancel_request (the handler's signal is aborted,
// signal.reason.withdrawn). Attached clients also get the session/update
// kinds permission_resolved {toolCallId, outcome, resolvedBy; policy {rule,
// decide} when the gateway's standing rule settled it},
// prompt_received {prompt, sentBy}, turn_complete {stopReason} (a turn
// another client started), client_connected and client_disconnected
// {client, timestamp}. A read-only client's writes are refused (-32007).
// detach(sessionId) leaves the session to the others.
//
// acp.js does not resume after a close 1008 "superseded": another client
// (a duplicated tab has the same sessionStorage) resumed the connection, and
// taking it back would make the two fight over it.
//
// Streamable HTTP (transport: "http"). The wire, for those who write their
// own client:
//
//   - every message the client sends is a POST of application/json, one at
//     a time and in order. The first must be initialize: it goes without an
//     Acp-Connection-Id, and its answer is the POST's 200 body, with the
//     connection's ID in the Acp-Connection-Id response header. Every later
//     POST carries that header and gets 202 (no body); one that belongs to a
//     session (params.sessionId is a string, or it answers an agent request
//     that came on a session's stream) carries Acp-Session-Id too.
//   - what the agent sends arrives as server-sent events ("id: N", "data:
//     <JSON>"), read here with fetch (EventSource cannot set headers):
//     GET /acp with Accept: text/event-stream and Acp-Connection-Id is the
//     connection's stream (answers to session/new, session/list and
//     session/load, and whatever names no session); with Acp-Session-Id too,
//     a session's stream (session/update, the agent's requests about the
//     session, the answers to the session's requests). Each stream takes one
//     reader (409 for a second). acp.js opens a session's stream when it
//     learns the session (a result with a sessionId) or before it first
//     posts to it, and waits for the stream's headers before that POST. It
//     keeps at most 3 session streams open (a browser has 6 HTTP/1.1
//     connections per host): an idle one is closed first, and opened again,
//     from where it stopped, when it is needed.
//   - credentials: opts.token goes in an Authorization: Bearer header on
//     every request. A ticket is single-use, so it covers one request: the
//     first (initialize) takes opts.ticket, every later one a new ticket from
//     opts.getTicket. Over HTTP a token is the practical choice.
//   - the open is lazy: AcpConnection.open resolves at once, and the
//     initialize POST is the handshake. A refusal (401, 403, 429…) or an
//     unreachable gateway rejects initialize with a ConnectError (opened:
//     false; status: the HTTP status, 0 when unreachable; reason: the
//     gateway's message, which over HTTP can be read) and ends the
//     connection.
//   - resume: when a stream drops (network loss, a proxy's timeout, a cut),
//     acp.js opens it again with backoff, with a Last-Event-ID header (the
//     last id it received, or 0), and the gateway sends everything after it
//     (onLink reports "reconnecting" and "resumed", as for a WebSocket).
//     Messages sent meanwhile wait and go out once the streams are back. A
//     notification or an answer whose POST fails on the network is sent
//     again then; a request is not (it may have reached the agent) and is
//     rejected with a ConnectError instead. When the gateway no longer has
//     the connection, or the events after Last-Event-ID (404), the
//     connection ends with resumeRefused: true (open a new one and
//     session/load, as AcpClient does). A reloaded page starts a new
//     connection: only a WebSocket connection resumes across a reload.
//   - close() with 1000 (the default) sends DELETE /acp: the gateway ends the
//     connection.
//   - order is kept within a stream, not across streams: the answer to
//     session/load (or session/attach) comes on the connection's stream,
//     the history it replays on the session's, and the two race. acp.js
//     holds that answer (and the connection's stream behind it) until the
//     session's stream has been quiet for 50 ms (500 ms when nothing came
//     on it since the load was sent; 2 s at most), so the replay comes
//     first, as over a WebSocket.

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

/**
 * The reason a handler's signal is aborted with when the request is
 * withdrawn with $/cancel_request (by the agent, or by acpgate because
 * another client of a shared session answered it): signal.reason.withdrawn
 * is true. A connection that ends aborts with no such reason.
 */
function withdrawn() {
  const err = new AcpError(ErrorCode.REQUEST_CANCELLED, "the request was withdrawn ($/cancel_request)");
  err.withdrawn = true;
  return err;
}

/** The socket could not be opened, or it closed while a request waited. */
export class ConnectError extends Error {
  constructor(message, { code = 1006, reason = "", opened = false, status = 0 } = {}) {
    super(message);
    this.name = "ConnectError";
    this.code = code; // WebSocket close code (over HTTP: the code a WebSocket would have had)
    this.reason = reason; // close reason sent by the server, if any (over HTTP: its error message)
    this.opened = opened; // false: the upgrade (over HTTP, the initialize POST) failed: refused or unreachable
    this.status = status; // over HTTP: the status that refused it, 0 if none
  }
}

/**
 * The URL of a named agent: "/<agent>" (URL-encoded) added to the path of
 * url, the gateway's /acp URL (any scheme): ws://h/acp -> ws://h/acp/second.
 * Without an agent, url unchanged (/acp is the gateway's default agent).
 */
export function agentUrl(url, agent = "") {
  if (agent === "" || agent === null || agent === undefined) return url;
  if (typeof agent !== "string") throw new TypeError("the agent name must be a string");
  const u = new URL(url, globalThis.location?.href);
  u.pathname = u.pathname.replace(/\/+$/, "") + "/" + encodeURIComponent(agent);
  return u.href;
}

/**
 * The WebSocket URL: a relative or http(s) URL becomes ws(s), a named
 * agent is added to the path (see agentUrl), and a ticket is added as
 * ?ticket=. Tokens never go here; see subprotocols().
 */
export function gatewayUrl(url, { ticket = "", agent = "" } = {}) {
  const u = new URL(agentUrl(url, agent), globalThis.location?.href);
  if (u.protocol === "http:") u.protocol = "ws:";
  if (u.protocol === "https:") u.protocol = "wss:";
  if (u.protocol !== "ws:" && u.protocol !== "wss:") {
    throw new TypeError(`not a WebSocket URL: ${url}`);
  }
  if (ticket) u.searchParams.set("ticket", ticket);
  return u.href;
}

/**
 * The Streamable HTTP URL: a relative or ws(s) URL becomes http(s), and a
 * named agent is added to the path (see agentUrl). Tickets are added per
 * request (see "Streamable HTTP" above), tokens never.
 */
export function gatewayHttpUrl(url, { agent = "" } = {}) {
  const u = new URL(agentUrl(url, agent), globalThis.location?.href);
  if (u.protocol === "ws:") u.protocol = "http:";
  if (u.protocol === "wss:") u.protocol = "https:";
  if (u.protocol !== "http:" && u.protocol !== "https:") {
    throw new TypeError(`not an HTTP URL: ${url}`);
  }
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

// singleUse returns a function that returns value the first time it is
// called and null after (always null for an empty value): a ticket given
// to open is good for one socket or request, later ones take one from
// getTicket. The value comes back as is, not as a promise, so that what
// uses it does not wait.
function singleUse(value) {
  return () => {
    const v = value || null;
    value = "";
    return v;
  };
}

// A resume in progress, from a drop: the attempts so far, when the drop
// was, how it closed, the timer of the next attempt, and whether one is
// dialing. Both transports resume on this schedule.
function resumeState(close) {
  return { attempt: 0, since: Date.now(), close, timer: null, dialing: false };
}

// The next attempt of resume rc after a backoff: tryResume(rc) when it is
// due and link({state: "reconnecting", …}) now; or end(close, with
// resumeRefused) once resumeForMs has passed since the drop.
function nextResume(rc, resumeForMs, { end, link, tryResume }) {
  rc.attempt++;
  if (Date.now() - rc.since > resumeForMs) return end({ ...rc.close, resumeRefused: true });
  const delayMs = backoff(rc.attempt);
  link({ state: "reconnecting", attempt: rc.attempt, delayMs, close: rc.close });
  rc.timer = setTimeout(() => tryResume(rc), delayMs);
}

// Skips the backoff of resume rc (if any, and not dialing) and tries now.
function resumeNow(rc, tryResume) {
  if (!rc || rc.dialing) return;
  clearTimeout(rc.timer);
  tryResume(rc);
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
 * The URL of GET /v1/agents for a gateway's /acp URL (or an agent's
 * /acp/<agent>; any scheme): next to /acp, so a gateway behind a path
 * prefix is found too (wss://h/gw/acp -> https://h/gw/v1/agents); at the
 * root otherwise.
 */
export function agentsUrl(url) {
  const u = new URL(gatewayHttpUrl(url));
  u.search = "";
  u.hash = "";
  const m = /^(.*)\/acp(\/[^/]*)?\/?$/.exec(u.pathname);
  u.pathname = (m ? m[1] : "") + "/v1/agents";
  return u.href;
}

/**
 * The agents a gateway serves to these credentials: GET /v1/agents, with
 * the same credentials a connection takes (opts: {token, ticket,
 * getTicket, timeoutMs, signal}: a token goes in an Authorization: Bearer
 * header; without one, a ticket, or a new one from getTicket, goes in the
 * query and is spent). url is the gateway's /acp URL (ws(s) or http(s)).
 *
 * Resolves with the list, in the gateway's order: [{name, agentInfo:
 * {name, title, version} | null (the agent has not started yet),
 * protocolVersion, ready, default}]; connect to one with
 * AcpConnection.open(url, {agent: name}). Rejects with a ConnectError
 * (opened: false) whose status is the HTTP status that refused the list
 * (404: a gateway without named agents, where /acp is the only agent; 401
 * or 403: the credentials), 0 when the gateway cannot be reached (or,
 * from another origin, does not allow this page to read it), and whose
 * reason is the gateway's message.
 */
export async function listAgents(url, { token = "", ticket = "", getTicket = null, timeoutMs = 15000, signal } = {}) {
  const u = new URL(agentsUrl(url));
  const headers = { Accept: "application/json" };
  if (token) {
    if (!/^[\x21-\x7e]+$/.test(token)) throw new TypeError("the token contains characters an Authorization header cannot carry");
    headers.Authorization = "Bearer " + token;
  } else {
    const t = ticket || (getTicket ? await getTicket() : "");
    if (t) u.searchParams.set("ticket", t);
  }
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  const abort = () => ctl.abort();
  signal?.addEventListener("abort", abort, { once: true });
  let res;
  let text = "";
  try {
    res = await fetch(u, { headers, signal: ctl.signal, cache: "no-store" });
    text = await res.text();
  } catch (err) {
    const why = ctl.signal.aborted ? (signal?.aborted ? "aborted" : "no answer in time") : String(err?.message ?? err);
    throw new ConnectError(`cannot list the agents at ${u.origin}${u.pathname}: ${why}`, { reason: why, status: 0 });
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", abort);
  }
  if (!res.ok) {
    const why = errorBodyText(text) || res.statusText;
    throw new ConnectError(`the gateway refused the agent list (HTTP ${res.status}): ${why}`, { code: res.status === 401 || res.status === 403 ? 1008 : 1006, reason: why, status: res.status });
  }
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: handled below
  }
  if (!Array.isArray(body?.agents)) {
    throw new ConnectError("the gateway's agent list is not {\"agents\": [...]}", { reason: "not an agent list", status: res.status });
  }
  return body.agents
    .filter((a) => typeof a?.name === "string" && a.name)
    .map((a) => ({
      name: a.name,
      agentInfo: a.agentInfo !== null && typeof a.agentInfo === "object" && !Array.isArray(a.agentInfo) ? a.agentInfo : null,
      protocolVersion: Number.isInteger(a.protocolVersion) ? a.protocolVersion : 0,
      ready: a.ready === true,
      default: a.default === true,
    }));
}

/**
 * A JSON-RPC 2.0 connection to an ACP agent through acpgate. It usually
 * lives on one WebSocket; when that socket drops and the gateway keeps the
 * connection, it moves to a new socket (see "Resuming" above) without the
 * caller noticing, except through onLink. With transport "http" it lives on
 * POSTs and event streams instead (see "Streamable HTTP" above), with the
 * same API.
 */
export class AcpConnection {
  /**
   * Opens the connection. Resolves once the socket is open (or, when a
   * saved connection of this tab was resumed, once it is resumed: then
   * .resumedAtOpen is true). Rejects with ConnectError if the socket closes
   * first (refused upgrade, unreachable host). Over HTTP it resolves at
   * once: initialize is the handshake.
   * opts: {transport, agent, token, ticket, getTicket, timeoutMs, resume, storage, probe, resumeForMs}
   *   transport  "websocket" (the default) or "http" (Streamable HTTP)
   *   agent      the name of one of the gateway's agents (see listAgents):
   *              the connection is to url + "/<agent>" (/acp/<agent>),
   *              resumes included; "" (the default): url itself, /acp
   *              being the gateway's default agent
   *   getTicket  async () => a new one-time ticket, for reconnects (over
   *              HTTP: for every request after the first)
   *   timeoutMs  how long opening a socket (over HTTP: a POST other than
   *              initialize, or an event stream's headers) may take
   *   resume     false: never resume (a plain connection; over HTTP, a
   *              dropped event stream ends it)
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
  #base; // the url given to open, before the agent was added (for reopen)
  #ticketOnce; // the single-use ticket (see singleUse)
  #closing = false; // close() was called
  #rc = null; // while resuming: {attempt, since, close, timer, dialing}
  #key;
  #link = null; // the HttpLink, with transport "http"

  constructor(url, { transport = "websocket", agent = "", token = "", ticket = "", getTicket = null, timeoutMs = 15000, resume = true, storage = defaultStorage(), probe = probeGateway, resumeForMs = 300000 } = {}) {
    if (transport !== "websocket" && transport !== "http") throw new TypeError(`unknown transport: ${transport}`);
    this.transport = transport;
    this.agent = agent ?? ""; // the named agent, "" for the gateway's default (/acp)
    // The agent's URL; resumes, event streams and the resume state saved
    // for a reload (keyed by this URL) all stay with it.
    this.url = transport === "http" ? gatewayHttpUrl(url, { agent: this.agent }) : gatewayUrl(url, { agent: this.agent });
    this.#opts = { token, ticket, getTicket, timeoutMs, resume, storage, probe, resumeForMs };
    this.#ticketOnce = singleUse(ticket);
    this.#base = url;
    this.#key = "acp.resume:" + this.url;
    if (transport === "websocket") {
      subprotocols(token); // throws early on a token a subprotocol cannot carry
    } else if (token && !/^[\x21-\x7e]+$/.test(token)) {
      throw new TypeError("the token contains characters an Authorization header cannot carry");
    }
    this.ws = null; // the current socket; null while resuming (and over HTTP)
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

  /** The subprotocol the server selected ("acp" with acpgate; "" over HTTP). */
  get protocol() {
    return this.ws?.protocol ?? "";
  }

  /** Whether a dropped socket (or event stream) is being resumed right now. */
  get resuming() {
    return !!this.#rc || !!this.#link?.resuming;
  }

  // -- opening and resuming ---------------------------------------------------

  async #start() {
    if (this.transport === "http") {
      this.#link = new HttpLink(this.url, this.#opts, {
        message: (msg) => this.#route(msg),
        link: (ev) => this.#emitLink(ev),
        end: (close) => this.#end(close),
        failed: (msg, err) => {
          const p = this.pending.get(msg.id);
          if (!p) return;
          this.pending.delete(msg.id);
          p.reject(err);
        },
        error: (err) => this.onProtocolError(err),
      });
      return;
    }
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
    const ticket = this.#ticketOnce() ?? (getTicket ? await getTicket() : "");
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
    this.#rc = resumeState(close);
    this.#next();
  }

  // Waits a backoff, then tries to resume.
  #next() {
    nextResume(this.#rc, this.#opts.resumeForMs, {
      end: (close) => this.#end(close),
      link: (ev) => this.#emitLink(ev),
      tryResume: (rc) => this.#tryResume(rc),
    });
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

  /**
   * Whether reopen() can open another connection with these credentials:
   * false when the only one was a single-use ticket (opts.ticket without
   * opts.getTicket), which this connection spent.
   */
  get canReopen() {
    return !this.#opts.ticket || !!this.#opts.getTicket;
  }

  /**
   * Opens a new connection to the same agent with the same options (the
   * transport, the token, getTicket for a new ticket, the timeouts…): what
   * to do when this one ended with resumeRefused. AcpClient does it for
   * you (see AcpClient, "reconnect"). The new connection has a new resume
   * token and counters, and needs initialize. Rejects with a ConnectError
   * (opened: false, code 1008, reason "ticket spent") when canReopen is
   * false, and as AcpConnection.open does otherwise.
   */
  reopen() {
    if (!this.canReopen) {
      return Promise.reject(new ConnectError("the connection was opened with a single-use ticket and no getTicket: a new connection needs a new ticket", { code: 1008, reason: "ticket spent" }));
    }
    return AcpConnection.open(this.#base, { ...this.#opts, ticket: "", transport: this.transport, agent: this.agent });
  }

  /** While resuming: skip the backoff and try now ("Reconnect now", back online). */
  reconnectNow() {
    if (this.#link) return this.#link.reconnectNow();
    resumeNow(this.#rc, (rc) => this.#tryResume(rc));
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
   * aborted if the agent withdraws the request with $/cancel_request (then
   * signal.reason.withdrawn is true; acpgate withdraws a permission request
   * that way when another client of a shared session answered it first).
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
   * session; with reconnecting: true too when the AcpClient on this
   * connection does that, see AcpClient.onReconnect). code is the close
   * that lost the socket. Over HTTP code is
   * the one a WebSocket would have had (1006 for a lost or forgotten
   * connection, 1008 for a refused credential), reason says what happened,
   * and status is the HTTP status that ended it, if one did.
   */
  onClose(fn) {
    if (this.closed) queueMicrotask(() => fn(this.closed));
    else this.closeListeners.add(fn);
  }

  /**
   * Called while a dropped socket is resumed: {state: "reconnecting",
   * attempt, delayMs, close} before each attempt, then {state: "resumed",
   * received, resent} ({state: "resumed"} over HTTP, where a dropped event
   * stream is what is resumed). Pending requests stay pending meanwhile.
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
   * Closes the connection. With 1000 (the default) the gateway forgets it
   * (over HTTP: DELETE /acp); either way this client stops here: no resume.
   */
  close(code = 1000, reason = "") {
    this.#closing = true;
    if (this.#link) return this.#link.close(code, reason);
    const ws = this.ws;
    if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) {
      ws.close(code, reason);
    } else {
      this.#end({ code, reason, wasClean: true });
    }
  }

  // Every message is counted and logged; it goes out now if the socket is
  // open, or with the others once the connection is resumed. Over HTTP the
  // link keeps the order and does the waiting (no counts: event ids resume).
  #send(msg) {
    if (this.#link) return this.#link.send(msg);
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
    this.#route(msg);
    this.#save();
  }

  #route(msg) {
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
    if (p.method === "initialize") this.#takeToken(msg.result);
    if (msg.error) p.reject(new AcpError(msg.error.code, msg.error.message, msg.error.data));
    else p.resolve(msg.result ?? null);
  }

  // Keeps the resume token of an initialize result, and takes it out of
  // the result so that it is not shown or logged with it. Over HTTP it is
  // not kept: Last-Event-ID does the resuming there.
  #takeToken(result) {
    const meta = result?._meta?.acpgate;
    if (!meta || typeof meta.resumeToken !== "string") return;
    if (this.#opts.resume && !this.#link) this.resumeToken = meta.resumeToken;
    delete meta.resumeToken;
    this.#save();
  }

  #notification(method, params) {
    if (method === "$/cancel_request") {
      // The agent withdraws one of its requests (or acpgate does: another
      // client of the session answered it first): abort the handler's
      // signal, with a reason that says so (signal.reason.withdrawn). The
      // handler still answers (acpgate and the agent expect one answer).
      this.incoming.get(JSON.stringify(params.requestId))?.ctl.abort(withdrawn());
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

// -- Streamable HTTP -----------------------------------------------------------

const SESSION_STREAMS = 3; // session event streams open at once (see "Streamable HTTP")
const SETTLE_QUIET = 50; // ms without events on a session's stream before its session/load answer…
const SETTLE_FIRST = 500; // …(as long when nothing came on it since the load was sent)…
const SETTLE_MAX = 2000; // …or this long at most
// Requests whose history is replayed on the session's stream before their
// answer: the answer waits for the replay (see "Streamable HTTP").
const REPLAYING = new Set(["session/load", "session/attach"]);

/**
 * Splits a text/event-stream body into events: the parts of the WHATWG
 * rules an ACP stream uses (data and id fields; comments, event and retry
 * ignored; lines end in CRLF, LF or CR). push() takes decoded text and
 * returns the events it completed, each {id, data}: id is the stream's last
 * event id so far (null before the first), data the joined data lines.
 */
export class EventStreamParser {
  #rest = ""; // an unfinished line
  #data = null; // the data lines of the event being read
  #id = null;

  push(text) {
    const events = [];
    const buf = this.#rest + text;
    const eol = /\r\n|\n|\r/g;
    let start = 0;
    for (let m; (m = eol.exec(buf)); ) {
      if (m[0] === "\r" && m.index === buf.length - 1) break; // maybe the first half of a CRLF
      this.#line(buf.slice(start, m.index), events);
      start = eol.lastIndex;
    }
    this.#rest = buf.slice(start);
    return events;
  }

  #line(line, events) {
    if (line === "") {
      if (this.#data !== null) events.push({ id: this.#id, data: this.#data.join("\n") });
      this.#data = null;
      return;
    }
    if (line.startsWith(":")) return; // a comment (the gateway's keep-alive)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") (this.#data ??= []).push(value);
    else if (field === "id" && !value.includes("\0")) this.#id = value;
  }
}

// The text of an HTTP error body: the gateway's {"error", "message"}, or
// its plain text, shortened.
function errorBodyText(text) {
  try {
    const v = JSON.parse(text);
    if (typeof v?.message === "string") return v.message;
    if (typeof v?.error === "string") return v.error;
    if (typeof v?.error?.message === "string") return v.error.message; // a JSON-RPC error
  } catch {
    // plain text
  }
  text = text.trim();
  return text.length > 300 ? text.slice(0, 300) + "…" : text;
}

/**
 * One Streamable-HTTP connection (see "Streamable HTTP" at the top): POSTs
 * go out one at a time, in order; event streams are opened as sessions
 * appear, and opened again with Last-Event-ID when they drop. AcpConnection
 * keeps the JSON-RPC side; this is the wire. cb: {message(msg), link(ev),
 * end(close), failed(msg, err) for a request that cannot be sent, error(err)}.
 */
class HttpLink {
  #url;
  #opts;
  #cb;
  #id = ""; // the Acp-Connection-Id, once initialize is answered
  #queue = Promise.resolve(); // the POST chain
  #ticketOnce; // the single-use ticket (see singleUse)
  #streams = new Map(); // "" (the connection's) or a session ID -> stream
  #stoppedAt = new Map(); // a closed idle session stream's last event id
  #replyOn = new Map(); // our request's id (JSON) -> the session stream its answer comes on
  #askedOn = new Map(); // the agent's request id (JSON) -> the stream it came on ("" or a session ID)
  #loads = new Map(); // a session/load's (or attach's) id (JSON) -> its session (its answer waits for the replay)
  #rc = null; // while resuming: {attempt, since, close, timer, dialing}
  #stuck = null; // a notification or answer to send again: {msg, session, done}
  #waiting = []; // POSTs held while resuming: resolve functions
  #ended = false;

  constructor(url, opts, cb) {
    this.#url = url;
    this.#opts = opts;
    this.#ticketOnce = singleUse(opts.ticket);
    this.#cb = cb;
  }

  get resuming() {
    return !!this.#rc;
  }

  /** Queues a message; POSTs go out one at a time, in order. */
  send(msg) {
    this.#queue = this.#queue.then(() => this.#deliver(msg)).catch((err) => this.#cb.error(err));
  }

  /** Ends the connection; with 1000 the gateway is told (DELETE). */
  close(code, reason) {
    if (this.#ended) return;
    const id = this.#id;
    this.#end({ code, reason, wasClean: true });
    if (id && code === 1000) {
      this.#fetch("DELETE", { id, keepalive: true }).catch(() => {}); // best effort: an idle connection ends anyway
    }
  }

  reconnectNow() {
    resumeNow(this.#rc, (rc) => this.#tryResume(rc));
  }

  // One request to /acp with the transport's headers and a credential.
  async #fetch(method, { id = this.#id, session = "", lastId = null, body, signal, keepalive = false } = {}) {
    const u = new URL(this.#url);
    const headers = {};
    const { token, getTicket } = this.#opts;
    if (token) {
      headers.Authorization = "Bearer " + token;
    } else {
      const ticket = this.#ticketOnce() ?? (getTicket ? await getTicket() : "");
      if (ticket) u.searchParams.set("ticket", ticket);
    }
    if (id) headers["Acp-Connection-Id"] = id;
    if (session) headers["Acp-Session-Id"] = session;
    if (method === "POST") headers["Content-Type"] = "application/json";
    if (method === "GET") headers.Accept = "text/event-stream";
    if (lastId !== null) headers["Last-Event-ID"] = lastId;
    return fetch(u, { method, headers, body, signal, keepalive, cache: "no-store" });
  }

  // POSTs one message: {ok} or {status, text}; status 0 when the request
  // got no answer (network, timeout).
  async #post(msg, session, timeoutMs = this.#opts.timeoutMs) {
    const ctl = new AbortController();
    const timer = timeoutMs ? setTimeout(() => ctl.abort(), timeoutMs) : null;
    let res;
    try {
      res = await this.#fetch("POST", { session, body: JSON.stringify(msg), signal: ctl.signal });
    } catch (err) {
      return { status: 0, text: ctl.signal.aborted ? "no answer in time" : String(err?.message ?? err) };
    } finally {
      clearTimeout(timer);
    }
    if (res.ok) {
      res.body?.cancel().catch(() => {});
      return { ok: true };
    }
    return { status: res.status, text: await res.text().catch(() => "") };
  }

  async #deliver(msg) {
    if (this.#ended) return;
    if (!this.#id) return this.#initialize(msg);
    const isRequest = typeof msg?.method === "string" && msg.id !== undefined && msg.id !== null;
    const key = JSON.stringify(msg?.id);
    let session = "";
    if (typeof msg?.method === "string") {
      if (typeof msg.params?.sessionId === "string") session = msg.params.sessionId;
    } else if (this.#askedOn.has(key)) {
      session = this.#askedOn.get(key); // an answer goes with the stream its request came on
      this.#askedOn.delete(key);
    }
    if (this.#rc) await new Promise((resolve) => this.#waiting.push(resolve));
    if (session) {
      // Marked busy first, so that #closeIdle leaves the stream open.
      if (isRequest) (REPLAYING.has(msg.method) ? this.#loads : this.#replyOn).set(key, session);
      const st = this.#stream(session);
      st.used = Date.now();
      try {
        await st.opened; // the session's stream first: the gateway's answer goes there
      } catch {
        return; // the connection ended: pending requests have failed with it
      }
      if (isRequest && REPLAYING.has(msg.method)) st.loadAt = Date.now(); // see #settle
    }
    if (this.#ended) return;
    let r = await this.#post(msg, session);
    if (r.status === 0 && !this.#ended) {
      if (isRequest) {
        this.#replyOn.delete(key);
        this.#loads.delete(key);
        return this.#cb.failed(msg, new ConnectError(`${msg.method} could not be sent (${r.text}); it may or may not have reached the agent`, { opened: true }));
      }
      // A notification or an answer: sent again once the link is back.
      r = await new Promise((done) => {
        this.#stuck = { msg, session, done };
        this.#trouble({ code: 1006, reason: "a message could not be sent", wasClean: false });
      });
    }
    if (r.ok || this.#ended) return;
    this.#refused(r, () => {
      this.#replyOn.delete(key);
      this.#loads.delete(key);
      const error = new AcpError(ErrorCode.INTERNAL_ERROR, `the gateway refused ${msg.method ?? "an answer"} (HTTP ${r.status}): ${errorBodyText(r.text)}`, { status: r.status });
      if (isRequest) this.#cb.failed(msg, error);
      else this.#cb.error(error);
    });
  }

  // A non-2xx answer: the connection is gone (404) or the credential no
  // longer works (401, 403): the end; otherwise other() (this message only).
  #refused(r, other) {
    const why = errorBodyText(r.text);
    if (r.status === 404) return this.#end({ code: 1006, reason: `the gateway no longer has the connection: ${why}`, wasClean: false, resumeRefused: true, status: 404 });
    if (r.status === 401 || r.status === 403) return this.#end({ code: 1008, reason: `HTTP ${r.status}: ${why}`, wasClean: false, status: r.status });
    other();
  }

  // The initialize POST: its answer is the body, the connection's ID a header.
  async #initialize(msg) {
    const refuse = (message, opts) => {
      const err = new ConnectError(message, { opened: false, ...opts });
      this.#cb.failed(msg, err);
      this.#end({ code: err.code, reason: err.reason, wasClean: false, status: err.status });
    };
    if (msg?.method !== "initialize" || msg.id === undefined || msg.id === null) {
      return refuse("over HTTP the first message must be the initialize request", { code: 1002 });
    }
    let res;
    try {
      res = await this.#fetch("POST", { body: JSON.stringify(msg) }); // no time limit: an agent may be starting
    } catch (err) {
      return refuse(`cannot reach the gateway: ${err?.message ?? err}`, { code: 1006 });
    }
    const text = await res.text().catch(() => "");
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
      // not JSON: an error page
    }
    const id = res.headers.get("Acp-Connection-Id");
    if (res.ok && id && body?.id === msg.id) {
      this.#id = id;
      this.#stream(""); // the connection's stream, in the background (as the SDK's client does)
      return this.#cb.message(body);
    }
    if (body && body.id === msg.id && body.error) {
      this.#cb.message(body); // the agent's (or the gateway's) JSON-RPC error
      return this.#end({ code: 1011, reason: errorBodyText(text), wasClean: false, status: res.status });
    }
    const why = res.ok ? "the initialize answer has no Acp-Connection-Id or is not the answer" : errorBodyText(text) || res.statusText;
    refuse(`the gateway refused the connection (HTTP ${res.status}): ${why}`, { code: res.status === 401 || res.status === 403 ? 1008 : 1006, reason: why, status: res.status });
  }

  // The stream of a session ("" = the connection's), opened if it is not.
  #stream(name) {
    let st = this.#streams.get(name);
    if (st) return st;
    st = { name, lastId: null, ctl: null, state: "down", used: Date.now(), heard: 0, ever: false, reopened: false, stopped: false };
    if (this.#stoppedAt.has(name)) {
      st.lastId = this.#stoppedAt.get(name); // go on from where it was closed
      st.ever = true;
      st.reopened = true;
      this.#stoppedAt.delete(name);
    }
    st.opened = new Promise((resolve, reject) => Object.assign(st, { resolveOpened: resolve, rejectOpened: reject }));
    st.opened.catch(() => {}); // nobody may be waiting
    this.#streams.set(name, st);
    if (name) this.#closeIdle();
    this.#dial(st).then((r) => {
      if (r.fatal) this.#end(r.fatal);
      else if (r.retry) this.#trouble(r.retry);
    });
    return st;
  }

  // At most SESSION_STREAMS session streams: the least used idle ones go.
  #closeIdle() {
    const sessions = [...this.#streams.values()].filter((st) => st.name);
    if (sessions.length <= SESSION_STREAMS) return;
    const busy = new Set([...this.#replyOn.values(), ...this.#askedOn.values(), ...this.#loads.values()]);
    const idle = sessions.filter((st) => st.state === "open" && !busy.has(st.name)).sort((a, b) => a.used - b.used);
    for (const st of idle.slice(0, sessions.length - SESSION_STREAMS)) {
      st.stopped = true;
      st.ctl?.abort();
      this.#streams.delete(st.name);
      if (st.lastId !== null) this.#stoppedAt.set(st.name, st.lastId);
    }
  }

  // Opens a stream: {ok}, {retry: close} (try again later) or {fatal: close}.
  // Once open, its events are read in the background until it drops.
  async #dial(st) {
    const ctl = new AbortController();
    st.ctl = ctl;
    st.state = "dialing";
    // After a first open, "0" asks for every event: none may be lost.
    const lastId = st.lastId ?? (st.ever ? "0" : null);
    const timer = setTimeout(() => ctl.abort(), this.#opts.timeoutMs);
    let res;
    try {
      res = await this.#fetch("GET", { session: st.name, lastId, signal: ctl.signal });
    } catch {
      st.state = "down";
      if (st.stopped || this.#ended) return {};
      return { retry: { code: 1006, reason: "the event stream could not be opened", wasClean: false } };
    } finally {
      clearTimeout(timer);
    }
    if (st.stopped || this.#ended) {
      res.body?.cancel().catch(() => {});
      return {};
    }
    if (!res.ok) {
      const text = await res.text().catch(() => "");
      st.state = "down";
      if (res.status === 404 && st.reopened && /resume_refused/.test(text)) {
        // A session stream closed while idle, whose events the gateway no
        // longer keeps (nothing was waiting on it): start it afresh.
        st.lastId = null;
        st.ever = false;
        st.reopened = false;
        return this.#dial(st);
      }
      // 409: the gateway has not seen the old reader go yet; 5xx: it is
      // restarting. Anything else ends the connection.
      if (res.status === 409 || res.status >= 500) return { retry: { code: 1006, reason: `the event stream was refused (HTTP ${res.status})`, wasClean: false } };
      const why = errorBodyText(text);
      if (res.status === 404) return { fatal: { code: 1006, reason: `the gateway no longer has the connection: ${why}`, wasClean: false, resumeRefused: true, status: 404 } };
      return { fatal: { code: res.status === 401 || res.status === 403 ? 1008 : 1002, reason: `HTTP ${res.status}: ${why}`, wasClean: false, status: res.status } };
    }
    st.state = "open";
    st.ever = true;
    st.resolveOpened();
    this.#read(st, ctl, res.body);
    return { ok: true };
  }

  async #read(st, ctl, body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    const parser = new EventStreamParser();
    let why = "the event stream ended";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        st.heard = Date.now();
        for (const ev of parser.push(decoder.decode(value, { stream: true }))) {
          if (st.ctl !== ctl) return;
          let msg;
          try {
            msg = JSON.parse(ev.data);
          } catch (err) {
            msg = undefined;
            this.#cb.error(new Error("invalid JSON from the server: " + err.message));
          }
          const key = JSON.stringify(msg?.id);
          if (!st.name && typeof msg?.method !== "string" && this.#loads.has(key)) {
            const session = this.#loads.get(key);
            this.#loads.delete(key);
            await this.#settle(session);
            if (st.ctl !== ctl || this.#ended) return;
          }
          if (ev.id !== null) st.lastId = ev.id;
          if (msg !== undefined) this.#incoming(msg, st);
        }
      }
    } catch {
      why = "the event stream dropped";
    }
    if (st.ctl !== ctl || st.stopped || this.#ended) return;
    st.state = "down";
    this.#trouble({ code: 1006, reason: why, wasClean: false });
  }

  // Waits until a session's stream has been quiet for SETTLE_QUIET ms (at
  // most SETTLE_MAX): what the gateway queued on it has then arrived. When
  // nothing has come on it since the load was sent, the replay may still
  // be on its way (the streams are separate connections, and a loaded
  // replica can be slow to write one of them): it waits SETTLE_FIRST for
  // the first event. Only a load with no history to replay pays that.
  async #settle(name) {
    const st = this.#streams.get(name);
    const start = Date.now();
    while (st?.state === "open" && !this.#ended && Date.now() - start < SETTLE_MAX) {
      const wait = st.heard >= (st.loadAt ?? start) ? SETTLE_QUIET : SETTLE_FIRST;
      const quiet = Date.now() - Math.max(st.heard, start);
      if (quiet >= wait) return;
      await new Promise((resolve) => setTimeout(resolve, wait - quiet));
    }
  }

  #incoming(msg, st) {
    st.used = Date.now();
    if (msg !== null && typeof msg === "object" && !Array.isArray(msg)) {
      const key = JSON.stringify(msg.id);
      const hasId = msg.id !== undefined && msg.id !== null;
      if (typeof msg.method === "string") {
        if (hasId) this.#askedOn.set(key, st.name);
      } else if (hasId) {
        this.#replyOn.delete(key);
        this.#loads.delete(key);
        // A new session (session/new, session/fork): open its stream now.
        const sid = msg.result?.sessionId;
        if (typeof sid === "string" && sid) this.#stream(sid);
      }
    }
    this.#cb.message(msg);
  }

  // Something dropped: resume with backoff (or end, with resume false).
  #trouble(close) {
    if (this.#ended || this.#rc) return;
    if (!this.#opts.resume) return this.#end(close);
    this.#rc = resumeState(close);
    this.#next();
  }

  #next() {
    nextResume(this.#rc, this.#opts.resumeForMs, {
      end: (close) => this.#end(close),
      link: (ev) => this.#cb.link(ev),
      tryResume: (rc) => this.#tryResume(rc),
    });
  }

  // Opens every dropped stream again, then sends the stuck message.
  async #tryResume(rc) {
    rc.timer = null;
    rc.dialing = true;
    const down = [...this.#streams.values()].filter((st) => st.state === "down");
    const results = await Promise.all(down.map((st) => this.#dial(st)));
    if (this.#rc !== rc) return;
    const fatal = results.find((r) => r.fatal);
    if (fatal) return this.#end(fatal.fatal);
    let ok = results.every((r) => !r.retry);
    const stuck = this.#stuck;
    if (ok && stuck) {
      const r = await this.#post(stuck.msg, stuck.session);
      if (this.#rc !== rc) return;
      if (r.status === 0) {
        ok = false;
      } else {
        this.#stuck = null;
        stuck.done(r);
      }
    }
    rc.dialing = false;
    if (!ok) return this.#next();
    this.#rc = null;
    this.#cb.link({ state: "resumed" });
    for (const resolve of this.#waiting.splice(0)) resolve();
    // A stream that dropped (or a message that failed) while this attempt ran: again.
    if (this.#stuck || [...this.#streams.values()].some((st) => st.state === "down")) this.#trouble(rc.close);
  }

  #end(close) {
    if (this.#ended) return;
    this.#ended = true;
    clearTimeout(this.#rc?.timer);
    this.#rc = null;
    const err = new ConnectError("the connection ended", { ...close, opened: true });
    for (const st of this.#streams.values()) {
      st.stopped = true;
      st.ctl?.abort();
      st.rejectOpened(err);
    }
    this.#stuck?.done({ ok: false, status: 0 });
    this.#stuck = null;
    for (const resolve of this.#waiting.splice(0)) resolve();
    this.#cb.end(close);
  }
}

/**
 * Typed wrappers for the ACP v1 client-to-agent methods (PROTOCOL.md §3.1).
 * Each returns the method's result. Check the capabilities from initialize
 * before calling a gated method (loadSession, sessionCapabilities.list, …).
 *
 * It also keeps track of the sessions open on the connection (from the
 * results of newSession, loadSession and resumeSession, with their cwd and
 * mcpServers; closeSession and forgetSession drop one), and when the
 * connection ends because its resume was refused (resumeRefused: the
 * gateway, or the replica that held the connection, died or restarted), it
 * opens a new connection and brings them back: see "reconnect" below and
 * onReconnect.
 */
export class AcpClient {
  #reconnect;
  #attempts;
  #initArgs = null; // [clientCapabilities, clientInfo, options] once initialize succeeded
  #authMethod = null; // the methodId of the last authenticate that succeeded
  #listeners = new Set(); // onReconnect
  #rc = null; // while reconnecting: {cancelled}
  #closed = false; // close() was called

  /**
   * opts: {reconnect, reconnectAttempts}
   *   reconnect          true (the default): when the connection ends with
   *                      resumeRefused, open a new one to the same URL and
   *                      agent with the same options (conn.reopen()),
   *                      initialize it as before (and authenticate, if this
   *                      client did), and bring back every session it had
   *                      open: session/load when the agent has loadSession
   *                      (the history is replayed as session/update), else
   *                      session/resume, else the session is lost. Events
   *                      go to onReconnect. false: the connection just ends
   *                      (onClose with resumeRefused: true), as before.
   *   reconnectAttempts  how many times to try opening and initializing the
   *                      new connection, with backoff between (default 3)
   */
  constructor(conn, { reconnect = true, reconnectAttempts = 3 } = {}) {
    this.conn = conn; // the current connection: a new one after a reconnect
    this.init = null; // the initialize result (of the current connection)
    this.sessions = new Map(); // sessionId -> {sessionId, cwd, mcpServers}: what a reconnect brings back
    this.#reconnect = reconnect !== false;
    this.#attempts = Math.max(1, Math.floor(Number(reconnectAttempts)) || 1);
    this.#watch(conn);
  }

  /**
   * initialize: must be the first request on a connection. On a connection
   * that resumed this tab's connection after a reload (conn.resumedAtOpen),
   * the gateway already has it: this returns the saved result instead.
   * A reconnect initializes the new connection with the same arguments.
   */
  async initialize(clientCapabilities = {}, clientInfo = { name: "acp.js", version: "1" }, { multiClient = false } = {}) {
    this.init = await this.#initialize(this.conn, clientCapabilities, clientInfo, { multiClient });
    this.#initArgs = [clientCapabilities, clientInfo, { multiClient }];
    return this.init;
  }

  // multiClient asks acpgate for the multi-client updates of the sessions
  // this connection owns (presence, prompt_received, permission_resolved,
  // turn_complete): the result's _meta.acpgate.clientId is then this
  // client's ID in them. A plain client gets only standard ACP.
  async #initialize(conn, clientCapabilities, clientInfo, { multiClient = false } = {}) {
    if (conn.resumedAtOpen && conn.savedInit) return conn.savedInit;
    const params = { protocolVersion: PROTOCOL_VERSION, clientCapabilities, clientInfo };
    if (multiClient) params._meta = { acpgate: { multiClient: true } };
    const init = await conn.request("initialize", params);
    if (init?.protocolVersion !== PROTOCOL_VERSION) {
      // The agent answered with a version we do not speak: the spec says close.
      conn.close(1000, "unsupported protocol version");
      throw new AcpError(ErrorCode.INVALID_REQUEST, `the agent speaks ACP v${init?.protocolVersion}, this client v${PROTOCOL_VERSION}`);
    }
    conn.saveInit(init);
    return init;
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
  /** acpgate shares sessions: session/attach (its initialize result says so). */
  canAttach() {
    return AcpClient.supported(this.capabilities.sessionCapabilities?.attach);
  }

  async authenticate(methodId) {
    const result = await this.conn.request("authenticate", { methodId });
    this.#authMethod = methodId;
    return result;
  }
  async newSession(cwd, mcpServers = []) {
    const result = await this.conn.request("session/new", { cwd, mcpServers });
    this.#track(result?.sessionId, cwd, mcpServers);
    return result;
  }
  /** Replays the history as session/update notifications, then resolves. */
  async loadSession(sessionId, cwd, mcpServers = []) {
    const result = await this.conn.request("session/load", { sessionId, cwd, mcpServers });
    this.#track(sessionId, cwd, mcpServers);
    return result;
  }
  async resumeSession(sessionId, cwd, mcpServers = []) {
    const result = await this.conn.request("session/resume", { sessionId, cwd, mcpServers });
    this.#track(sessionId, cwd, mcpServers);
    return result;
  }
  /**
   * session/attach (acpgate): joins a live session another client holds,
   * as one more of its clients. opts: {historyPolicy, clientId, clientInfo,
   * readOnly}
   *   historyPolicy  "full" (the default: the session's kept history is
   *                  replayed as session/update before the answer, as
   *                  session/load does), "pending_only" or "none"
   *   clientId       the ID this client asks for (RFD #533); acpgate
   *                  ignores it and mints each client's own, unique in the
   *                  session: know yourself by result.clientId only
   *   clientInfo     {name, version} shown to the session's other clients
   *                  (default: what initialize sent)
   *   readOnly       true: watch only (sent as _meta.acpgate.readOnly); the
   *                  gateway refuses prompts, cancels, mode and config
   *                  changes and permission answers (-32007)
   * Resolves with {sessionId, clientId, connectedClients, historyPolicy,
   * readOnly, modes?, configOptions?, models?, _meta}. After it, the
   * session's pending permission requests come again as ordinary requests,
   * and the session's updates as for any of its clients, plus the kinds
   * only attached clients get (permission_resolved, prompt_received,
   * turn_complete, client_connected, client_disconnected). A reconnect
   * attaches again (history "full") instead of loading.
   */
  async attach(sessionId, { historyPolicy = "full", clientId, clientInfo, readOnly = false } = {}) {
    const info = clientInfo ?? this.#initArgs?.[1];
    const params = { sessionId, historyPolicy };
    if (clientId) params.clientId = clientId;
    if (info) params.clientInfo = { name: String(info.name ?? ""), version: String(info.version ?? "") };
    if (readOnly) params._meta = { acpgate: { readOnly: true } };
    const result = await this.conn.request("session/attach", params);
    this.#track(sessionId, "", [], { clientId: result?.clientId || clientId, clientInfo: params.clientInfo, readOnly: !!readOnly });
    return result;
  }
  /** session/detach (acpgate): this client leaves a session it attached to; the session goes on. */
  async detach(sessionId) {
    const result = await this.conn.request("session/detach", { sessionId });
    this.sessions.delete(sessionId);
    return result;
  }
  listSessions({ cwd, cursor } = {}) {
    const params = {};
    if (cwd) params.cwd = cwd;
    if (cursor) params.cursor = cursor;
    return this.conn.request("session/list", params);
  }
  async closeSession(sessionId) {
    const result = await this.conn.request("session/close", { sessionId });
    this.sessions.delete(sessionId);
    return result;
  }
  /**
   * Stops tracking a session: a reconnect will not bring it back (for a
   * page that left it for another one). The agent is not told.
   */
  forgetSession(sessionId) {
    this.sessions.delete(sessionId);
  }
  /** Resolves with {stopReason} when the turn ends; updates stream meanwhile. */
  prompt(sessionId, prompt) {
    return this.conn.request("session/prompt", { sessionId, prompt });
  }
  /** Asks the agent to stop the turn; the prompt then resolves with stopReason "cancelled". */
  cancel(sessionId) {
    this.conn.notify("session/cancel", { sessionId });
  }

  // The most recently opened last: a reconnect restores them in this order.
  // attach: {clientId, clientInfo, readOnly} for a session this client
  // attached to (a reconnect attaches again).
  #track(sessionId, cwd, mcpServers, attach = null) {
    if (typeof sessionId !== "string" || !sessionId) return;
    this.sessions.delete(sessionId);
    this.sessions.set(sessionId, { sessionId, cwd, mcpServers: Array.isArray(mcpServers) ? mcpServers : [], ...(attach ? { attach } : {}) });
  }

  // How a reconnect brings a tracked session back: [method, params], or
  // null when it cannot.
  #restoreCall(s) {
    const { sessionId, cwd, mcpServers, attach } = s;
    if (attach) {
      const params = { sessionId, historyPolicy: "full", ...(attach.clientId ? { clientId: attach.clientId } : {}) };
      if (attach.clientInfo) params.clientInfo = attach.clientInfo;
      if (attach.readOnly) params._meta = { acpgate: { readOnly: true } };
      return ["session/attach", params];
    }
    const method = this.canLoad() ? "session/load" : this.canResume() ? "session/resume" : "";
    return method ? [method, { sessionId, cwd, mcpServers }] : null;
  }

  // -- reconnecting after a refused resume --------------------------------------

  /** Whether a new connection is being opened, initialized or its sessions loaded. */
  get reconnecting() {
    return !!this.#rc;
  }

  /**
   * Called as a refused resume is handled (opts.reconnect), with one of:
   *   {state: "reconnecting", close, sessions}  the connection ended with
   *       resumeRefused (close, as onClose has it, now with reconnecting:
   *       true); a new one is being opened. sessions: the IDs to bring back
   *   {state: "reconnected", conn, previous, init}  the new connection is
   *       open and initialized; this.conn is now conn. It answers the
   *       agent's requests and notifications with the old one's handlers
   *       and listeners (handle, on: the same maps, so earlier unsubscribe
   *       functions still work) and onProtocolError; onLink and onClose
   *       are per connection: subscribe to conn's here
   *   {state: "restoring", sessionId, cwd, method}  method ("session/load",
   *       "session/resume", or "session/attach" for a session this client
   *       attached to) is being sent for the session. After session/load
   *       (and session/attach) the session's history is replayed as
   *       session/update, before "restored": it replaces the stale view
   *   {state: "restored", sessionId, cwd, method, result}  the session is
   *       back (its history replayed, for session/load; but when
   *       result._meta.acpgate.turn is set, the gateway took the session
   *       over from the old connection, which it still kept, and only the
   *       updates since the drop follow)
   *   {state: "lost", sessionId, cwd, method, error}  it could not be
   *       brought back: the agent has neither loadSession nor
   *       sessionCapabilities.resume (method ""), or refused it (error:
   *       the AcpError; a ConnectError if the request could not be sent).
   *       It is no longer tracked
   *   {state: "done", restored, lost}  every session was tried (IDs)
   *   {state: "failed", close, error}  no new connection: opening or
   *       initializing it failed reconnectAttempts times (error, the last
   *       reason), or it cannot be opened because the only credential was
   *       a spent single-use ticket (no getTicket; error.reason "ticket
   *       spent"; then close has no reconnecting: true and no
   *       "reconnecting" came first). The client is over, as its
   *       connection is
   * If the new connection itself ends while its sessions are loaded, the
   * rest is not tried (no "done"): its onClose says so, and when that is a
   * refused resume again, the cycle starts over with "reconnecting".
   * Returns an unsubscribe function.
   */
  onReconnect(fn) {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }

  /**
   * Closes the connection (conn.close) and stops a reconnect in progress
   * (a connection it opened is closed at once); no reconnect after this.
   */
  close(code = 1000, reason = "") {
    this.#closed = true;
    if (this.#rc) this.#rc.cancelled = true;
    this.#rc = null;
    this.conn.close(code, reason);
  }

  #emit(ev) {
    for (const fn of this.#listeners) {
      try {
        fn(ev);
      } catch (err) {
        this.conn.onProtocolError?.(err);
      }
    }
  }

  // Listens for the end of conn. Our listener goes before any other, so
  // that the close every onClose listener of the page gets already says
  // reconnecting: true.
  #watch(conn) {
    if (conn.closed) return;
    const fn = (c) => this.#onClose(conn, c);
    conn.closeListeners = new Set([fn, ...conn.closeListeners]);
  }

  #onClose(conn, close) {
    if (conn !== this.conn || !close.resumeRefused || !this.#reconnect || this.#closed || !this.#initArgs) return;
    if (!conn.canReopen) {
      this.#emit({ state: "failed", close, error: new ConnectError("the connection could not be resumed, and it was opened with a single-use ticket and no getTicket: a new connection needs a new ticket", { code: 1008, reason: "ticket spent" }) });
      return;
    }
    close.reconnecting = true;
    this.#renew(conn, close);
  }

  async #renew(old, close) {
    const rc = { cancelled: false };
    this.#rc = rc;
    this.#emit({ state: "reconnecting", close, sessions: [...this.sessions.keys()] });
    const over = () => rc.cancelled || this.#rc !== rc;
    let conn = null;
    let error = null;
    for (let attempt = 1; attempt <= this.#attempts && !conn; attempt++) {
      if (attempt > 1) {
        await new Promise((resolve) => setTimeout(resolve, backoff(attempt - 1)));
        if (over()) return;
      }
      let c;
      try {
        c = await old.reopen();
      } catch (err) {
        if (over()) return;
        error = err;
        if (err instanceof TypeError) break; // a credential or URL that cannot work
        continue;
      }
      if (over()) return c.close(1000, "client closed");
      // The new connection answers the agent as the old one did.
      c.handlers = old.handlers;
      c.listeners = old.listeners;
      c.onProtocolError = old.onProtocolError;
      let init;
      try {
        init = await this.#initialize(c, ...this.#initArgs);
        if (this.#authMethod !== null) await c.request("authenticate", { methodId: this.#authMethod });
      } catch (err) {
        c.close(1000, "initialize failed");
        if (over()) return;
        error = err;
        if (err instanceof AcpError) break; // the agent's answer: another try gets the same
        continue;
      }
      if (over()) return c.close(1000, "client closed");
      conn = c;
      this.init = init;
    }
    if (!conn) {
      this.#rc = null;
      this.#emit({ state: "failed", close, error });
      return;
    }
    this.conn = conn;
    this.#watch(conn);
    this.#emit({ state: "reconnected", conn, previous: old, init: this.init });

    const restored = [];
    const lost = [];
    const gone = () => over() || this.conn !== conn || !!conn.closed;
    for (const s of [...this.sessions.values()]) {
      if (gone()) break;
      if (this.sessions.get(s.sessionId) !== s) continue; // forgotten or opened again meanwhile
      const { sessionId, cwd } = s;
      const call = this.#restoreCall(s);
      if (!call) {
        this.sessions.delete(sessionId);
        lost.push(sessionId);
        this.#emit({ state: "lost", sessionId, cwd, method: "", error: new AcpError(ErrorCode.METHOD_NOT_FOUND, "the agent can neither load nor resume sessions (no loadSession, no sessionCapabilities.resume)") });
        continue;
      }
      const [method, params] = call;
      this.#emit({ state: "restoring", sessionId, cwd, method });
      try {
        const result = await conn.request(method, params);
        if (s.attach && result?.clientId) s.attach.clientId = result.clientId;
        if (gone()) break;
        restored.push(sessionId);
        this.#emit({ state: "restored", sessionId, cwd, method, result });
      } catch (err) {
        if (gone()) break;
        if (this.sessions.get(sessionId) === s) this.sessions.delete(sessionId);
        lost.push(sessionId);
        this.#emit({ state: "lost", sessionId, cwd, method, error: err });
      }
    }
    if (this.#rc !== rc) return; // closed, or a newer reconnect took over
    this.#rc = null;
    if (this.conn !== conn || conn.closed) return; // it ended meanwhile: its onClose says so
    this.#emit({ state: "done", restored, lost });
  }
}
