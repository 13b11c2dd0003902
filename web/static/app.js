// app.js: the acpgate web client. It wires acp.js (the protocol),
// transcript.js (the conversation), files.js (the in-browser workspace) and
// the page together: connect, initialize, sessions, prompts, permission
// requests, cancellation, and reconnecting after a drop: acp.js resumes a
// dropped connection when the gateway kept it (the turn goes on, nothing is
// reloaded). When the gateway refuses the resume (it, or behind a balancer
// the replica that held the connection, died or restarted), acp.js's
// AcpClient connects anew by itself and loads the open session: the page
// follows its onReconnect events, drops the stale conversation when the
// replay starts and renders the replayed history, with a note that the
// connection was lost and could not be resumed. The page keeps only the
// open session tracked (forgetSession), so only that one is loaded again.
// When connecting anew fails too, or the connection ended some other way,
// the page reconnects with backoff itself and loads the session
// (restoreSession); the two never both run for one drop.
//
// Transport: a WebSocket, or Streamable HTTP (POSTs and event streams on the
// same /acp) when connecting finds that a WebSocket cannot be opened to a
// gateway that answers /healthz, as behind a proxy that refuses upgrades.
// Once HTTP worked for a URL, the page stays on it (reconnects too) until
// reloaded. ?transport=http or
// ?transport=websocket in the page's address forces one. The connection
// detail line says which one is in use.
//
// Agents: a gateway may serve several agents (/acp/<name>; /acp is its
// default). Before connecting, the page asks GET /v1/agents (with the
// token, if any) and, when there are several, shows a picker; the default
// is preselected, a pick is remembered (localStorage, and ?agent=<name> in
// the page's address, which also selects one). Another pick connects anew:
// sessions belong to their agent. Without the list (an older gateway
// answers 404, or the only credential is a single-use ticket) the page
// connects to /acp as before, or to ?agent= when it cannot ask.
//
// Sharing (acpgate's session/attach, when the initialize result has
// agentCapabilities.sessionCapabilities.attach): "Share" offers a link to
// the open session, #attach=<sessionId>[&agent=<name>][&ro=1][&affinity=…],
// the session in the address's fragment so that it never reaches a
// server's log. A page opened with such a link attaches to the session
// instead of starting one (the history replayed as for a load), read-only
// with ro=1. affinity is the balancer's affinity cookie (NAME=VALUE) the
// gateway saw on the sharing page's connection: the page opening the link
// sets it before it connects, so that it reaches the replica the session is
// live on (acpgate's sessions.affinity_cookie): only a cookie of the name the
// gateway that served the page names (its acpgate-affinity-cookie meta tag),
// none if it names none. The page
// shows the session's clients (presence), prompts other clients send (as
// "<name>: …"), their turns running, and permission cards answered
// elsewhere collapsed to one line.

import { AcpConnection, AcpClient, AcpError, ConnectError, ErrorCode, agentsUrl, backoff, gatewayUrl, listAgents } from "./acp.js";
import { Transcript } from "./transcript.js";
import { VirtualFiles, FilePanel, normalizePath } from "./files.js";
import { h, clear, replace, relativeTime } from "./dom.js";

const CLIENT_INFO = { name: "acpgate-web", title: "acpgate web client", version: "1.0.0" };
// What this client can do for the agent. terminal/* and elicitation are not
// offered, so the agent never asks for them.
// subagents (v1 unstable): the page shows a subagent's child session as a
// nested transcript, so the agent may announce children (subagent_update).
const CLIENT_CAPABILITIES = { fs: { readTextFile: true, writeTextFile: true }, terminal: false, subagents: {} };

// The transport forced by the page's address (?transport=http|websocket), if any.
const FORCED_TRANSPORT = ["http", "websocket"].find((t) => t === new URLSearchParams(location.search).get("transport")) ?? null;
// The agent the page's address asks for (?agent=<name>), if any.
const QUERY_AGENT = new URLSearchParams(location.search).get("agent") || "";

// A share link's fragment:
// #attach=<sessionId>[&agent=<name>][&ro=1][&affinity=<NAME=VALUE>], or null.
function shareTarget(hash = location.hash) {
  const f = new URLSearchParams(hash.replace(/^#/, ""));
  const sessionId = f.get("attach");
  if (!sessionId) return null;
  return { sessionId, agent: f.get("agent") || "", readOnly: f.get("ro") === "1", affinity: affinityCookie(f.get("affinity")) };
}

// The name of the balancer's affinity cookie, as the gateway that served
// this page says it (sessions.affinity_cookie, in index.html's
// acpgate-affinity-cookie meta tag), or "": a share link may set this
// cookie and no other, and none when the gateway names none.
const AFFINITY_NAME = document.querySelector('meta[name="acpgate-affinity-cookie"]')?.content ?? "";

// "NAME=VALUE" of the balancer's affinity cookie (the gateway names it in
// its initialize result, _meta.acpgate.affinity, when the connection's
// opening request carried it), or "" unless NAME is exactly AFFINITY_NAME
// and VALUE is a plain cookie token of at most 256 characters (no ; , space
// or control characters; it may have | + / =, as ingress-nginx's and AWS
// ALB's do).
function affinityCookie(s) {
  if (!AFFINITY_NAME || typeof s !== "string" || !s.startsWith(AFFINITY_NAME + "=")) return "";
  return /^[A-Za-z0-9_.:~|+/=-]{1,256}$/.test(s.slice(AFFINITY_NAME.length + 1)) ? s : "";
}

// A share link's affinity cookie, set before the page connects: the
// balancer then routes the connection to the replica the session is live on.
function setAffinity(cookie) {
  if (cookie) document.cookie = `${cookie}; path=/; SameSite=Lax${location.protocol === "https:" ? "; Secure" : ""}`;
}

const SHARED = shareTarget();
setAffinity(SHARED?.affinity);

const $ = (id) => document.getElementById(id);
const PROMPT_HINT = "Enter sends · Shift+Enter new line · Esc cancels";
const els = {
  connState: $("conn-state"),
  connStateText: $("conn-state-text"),
  connDetail: $("conn-detail"),
  agentBadge: $("agent-badge"),
  connectForm: $("connect-form"),
  url: $("url"),
  agentField: $("agent-field"),
  agent: $("agent"),
  auth: $("auth"),
  token: $("token"),
  ticket: $("ticket"),
  connectBtn: $("connect-btn"),
  disconnectBtn: $("disconnect-btn"),
  agentInfo: $("agent-info"),
  newSessionForm: $("new-session-form"),
  cwd: $("cwd"),
  cwdError: $("cwd-error"),
  newSessionBtn: $("new-session-btn"),
  refreshSessions: $("refresh-sessions"),
  sessionList: $("session-list"),
  title: $("session-title"),
  sessionMeta: $("session-meta"),
  transcript: $("transcript"),
  composer: $("composer"),
  prompt: $("prompt"),
  promptHint: $("prompt-hint"),
  sendBtn: $("send-btn"),
  cancelBtn: $("cancel-btn"),
  roBadge: $("ro-badge"),
  presence: $("presence"),
  shareBtn: $("share-btn"),
  sharePanel: $("share-panel"),
  shareLink: $("share-link"),
  shareRo: $("share-ro"),
  shareCopy: $("share-copy"),
  shareStatus: $("share-status"),
  themeBtn: $("theme-toggle"),
  filesToggle: $("files-toggle"),
  filesPanel: $("files-panel"),
  announcer: $("announcer"),
};

// localStorage with JSON values; failures (private mode) are ignored.
const store = {
  get(k, d = null) {
    try {
      const v = localStorage.getItem("acpgate." + k);
      return v === null ? d : JSON.parse(v);
    } catch {
      return d;
    }
  },
  set(k, v) {
    try {
      localStorage.setItem("acpgate." + k, JSON.stringify(v));
    } catch {
      // ignore
    }
  },
};

const app = {
  conn: null, // AcpConnection
  acp: null, // AcpClient, once initialized
  state: "disconnected",
  wantConnected: false, // false after the user disconnects: no reconnect
  usedTicket: false, // the connection was opened with a (single-use) ticket
  attempt: 0, // reconnect attempts since the last good connection
  timer: null,
  session: null, // {id, cwd, title, attached, readOnly}: attached when the page joined it with session/attach
  running: null, // {started, cancelling, remote}: remote, a turn another client of the session started
  attachTarget: SHARED, // {sessionId, agent, readOnly}: the share link the page was opened with, until tried
  selfId: "", // this page's clientId in the attached session: the one the gateway's attach result gave
  presence: new Map(), // clientId -> {clientId, name, version, readOnly, self}: the open session's clients
  loading: false,
  lastClose: null, // {code, reason} of the close that lost the connection
  connDetail: "", // the "connected" detail line
  credential: "", // " · ticket", " · bearer token" or "": for the detail line
  renewing: false, // acp.js (AcpClient) is connecting anew after a refused resume
  replacing: null, // {sessionId}: acp.js is loading the open session again; its replay replaces the view
  connectSeq: 0,
  httpFallback: "", // the URL for which a refused WebSocket fell back to HTTP
  agents: null, // GET /v1/agents: [{name, agentInfo, ready, default…}], or null when unknown
  agentsListed: false, // the page asked for the list (false: it could not, e.g. a ticket alone)
  pickedAgent: "", // the agent the user picked on this page
  agent: "", // the agent of the connection ("" = /acp, the gateway's default)
  epoch: 0, // bumped when the user switches agents: late answers of the old connection are dropped
};

// ---------------------------------------------------------------------------
// Little helpers

let announceTimer;
function announce(text) {
  clearTimeout(announceTimer);
  els.announcer.textContent = "";
  announceTimer = setTimeout(() => (els.announcer.textContent = text), 50);
}

function errText(err) {
  if (err instanceof AcpError) return `${err.message} (${err.code})`;
  return String(err?.message ?? err);
}

// budgetText says what the gateway's budget refusal or cancel means: which
// cap, how much of it is spent, and when the period resets (err.data of a
// -32006, or a cancelled turn's _meta.acpgate.budget). "" when b is not one.
function budgetText(b) {
  if (!b || typeof b !== "object" || typeof b.unit !== "string" || typeof b.resets !== "string") return "";
  const amount = (v) => (b.unit === "tokens" ? Math.round(Number(v)).toLocaleString() : Number(v).toFixed(2));
  const at = Date.parse(b.resets);
  const resets = Number.isNaN(at) ? b.resets : new Date(at).toLocaleString();
  return `the budget of ${String(b.tenant ?? "this tenant")} is spent: ${amount(b.spent)} of ${amount(b.limit)} ${b.unit} this ${String(b.period ?? "period")}. Prompts are refused until it resets, ${resets}.`;
}

const CLOSE_MEANING = {
  1000: "normal closure",
  1001: "going away: the gateway is shutting down",
  1005: "no status",
  1006: "abnormal closure: the connection dropped",
  1008: "policy violation",
  1009: "message too big",
  1011: "gateway error",
  1012: "service restart",
  1013: "try again later",
};

function closeText(c) {
  if (!c) return "";
  const meaning = CLOSE_MEANING[c.code] ?? "closed";
  return `code ${c.code} (${meaning})${c.reason ? `, reason: “${c.reason}”` : ""}`;
}

function defaultUrl() {
  return new URL("/acp", location.href).href.replace(/^http/, "ws");
}

// ---------------------------------------------------------------------------
// Connection state

const STATE_LABEL = {
  disconnected: "Disconnected",
  connecting: "Connecting…",
  connected: "Connected",
  reconnecting: "Reconnecting…",
  refused: "Refused",
  failed: "Failed",
};

function setState(state, detail = "") {
  app.state = state;
  els.connState.dataset.state = state;
  els.connStateText.textContent = STATE_LABEL[state] ?? state;
  els.connDetail.textContent = detail;
  els.connDetail.dataset.state = state;
  updateControls();
}

function updateControls() {
  const connected = app.state === "connected" && !!app.acp;
  const busy = !!app.running || app.loading;
  const live = ["connected", "connecting", "reconnecting"].includes(app.state);
  // One of Connect / Disconnect at a time; both while reconnecting.
  els.connectBtn.hidden = app.state === "connected" || app.state === "connecting";
  els.connectBtn.textContent = app.state === "reconnecting" ? "Reconnect now" : "Connect";
  els.disconnectBtn.hidden = !live;
  for (const el of [els.url, els.token, els.ticket]) el.disabled = app.state === "connected" || app.state === "connecting";
  const readOnly = !!app.session?.readOnly;
  els.newSessionBtn.disabled = !connected || busy;
  els.refreshSessions.disabled = !connected;
  els.sendBtn.disabled = !connected || busy || readOnly;
  els.prompt.disabled = readOnly;
  els.prompt.placeholder = readOnly ? "Read-only: you are watching this session" : "Message the agent";
  els.roBadge.hidden = !readOnly;
  els.cancelBtn.hidden = !app.running;
  els.cancelBtn.disabled = !!app.running?.cancelling || readOnly;
  const canShare = connected && !!app.session && app.acp.canAttach();
  els.shareBtn.hidden = !canShare;
  if (!canShare) showShare(false);
  els.presence.hidden = !canShare || !app.presence.size;
  els.cancelBtn.textContent = app.running?.cancelling ? "Cancelling…" : "Cancel";
  els.composer.dataset.running = app.running ? "true" : "false";
  for (const b of els.sessionList.querySelectorAll("button")) b.disabled = !connected || busy;
}

// ---------------------------------------------------------------------------
// Connect, initialize, reconnect

async function connect({ reconnect = false } = {}) {
  clearTimeout(app.timer);
  if (app.conn) {
    app.conn.reconnectNow(); // resuming a dropped socket: try now
    return;
  }
  const seq = ++app.connectSeq; // a newer connect() (e.g. "Reconnect now") wins
  const url = els.url.value.trim() || defaultUrl();
  const token = els.token.value.trim();
  const ticket = els.ticket.value.trim();
  try {
    gatewayUrl(url);
  } catch (err) {
    setState("failed", errText(err));
    return;
  }
  store.set("url", url === defaultUrl() ? null : url);
  app.wantConnected = true;
  setState(reconnect ? "reconnecting" : "connecting",
    reconnect ? `Connection lost: ${closeText(app.lastClose)}. Attempt ${app.attempt}…` : `Opening ${url}`);

  // A ticket is single-use: take it out of the field as it is spent.
  if (ticket) els.ticket.value = "";
  app.usedTicket = !!ticket;

  // Which agent: asked for again on every connect but a reconnect, which
  // goes back to the agent it lost.
  if (!reconnect) {
    await refreshAgents(url, { token, ticket });
    if (seq !== app.connectSeq) return;
  }
  const agent = reconnect ? app.agent : targetAgent();
  app.agent = agent;
  if (!reconnect && agent) setState("connecting", `Opening ${gatewayUrl(url, { agent })}`);

  // A WebSocket first, unless HTTP is forced or already took over for this URL.
  let transport = FORCED_TRANSPORT ?? (app.httpFallback === url ? "http" : "websocket");
  const opts = { ...(ticket ? { ticket } : { token }), agent, probe };
  let conn;
  try {
    conn = await AcpConnection.open(url, { ...opts, transport });
  } catch (err) {
    if (seq !== app.connectSeq) return;
    if (!app.wantConnected) return setState("disconnected", "");
    if (!(err instanceof ConnectError)) return setState("failed", errText(err)); // e.g. a token with spaces
    // The upgrade failed: refused (a browser cannot see why) or nothing
    // answers. A gateway that answers /healthz may sit behind a proxy that
    // refuses WebSockets: try Streamable HTTP, which also tells a refused
    // token apart. Not with a ticket (it covers one request, HTTP needs
    // many), and not while reconnecting: a connection that was on a
    // WebSocket stays on one (a refusal then is the gateway's, or passing).
    const up = await probe(url);
    if (seq !== app.connectSeq) return;
    if (!app.wantConnected) return setState("disconnected", "");
    if (up !== true || reconnect || FORCED_TRANSPORT || ticket) return openFailed(url, { token, ticket, reconnect, up });
    transport = "http";
    setState(app.state, `The WebSocket was refused; trying Streamable HTTP at ${url}`);
    try {
      conn = await AcpConnection.open(url, { ...opts, transport }); // opens nothing yet: initialize does
    } catch (err2) {
      return setState("failed", errText(err2)); // a token an Authorization header cannot carry
    }
  }
  if (!app.wantConnected || seq !== app.connectSeq || app.conn) {
    conn.close();
    return;
  }
  app.conn = conn;
  wireHandlers(conn);
  conn.onLink((ev) => onLink(conn, ev));

  // reconnect (the default): after a refused resume, acp.js connects anew
  // and loads the open session (onReconnect below).
  const acp = new AcpClient(conn);
  acp.onReconnect((ev) => onReconnect(acp, ev));
  try {
    await acp.initialize(CLIENT_CAPABILITIES, CLIENT_INFO, { multiClient: true });
  } catch (err) {
    if (seq !== app.connectSeq) return; // abandoned (another agent was picked)
    if (conn.transport === "http" && err instanceof ConnectError && !err.opened) {
      // Over HTTP the initialize POST is the handshake: refused (its status
      // and message can be read), or nothing answers.
      app.conn = null;
      const up = err.status ? true : await probe(url);
      if (seq !== app.connectSeq || app.conn) return;
      if (!app.wantConnected) return setState("disconnected", "");
      return openFailed(url, { token, ticket, reconnect, up, status: err.status, message: err.reason });
    }
    if (conn.closed && !(err instanceof AcpError)) return onClosed(conn, conn.closed); // dropped: as any drop
    app.conn = null;
    setState("failed", `initialize failed: ${errText(err)}`);
    app.wantConnected = false;
    conn.close(1000, "initialize failed");
    return;
  }
  if (seq !== app.connectSeq || app.conn !== conn) {
    conn.close();
    return;
  }
  conn.onClose((c) => onClosed(conn, c));
  app.acp = acp;
  app.attempt = 0;
  if (transport === "http" && !FORCED_TRANSPORT) app.httpFallback = url;
  app.credential = ticket ? " · ticket" : token ? " · bearer token" : "";
  app.connDetail = connDetail(conn);
  setState("connected", app.connDetail + (conn.resumedAtOpen ? " · resumed the connection from before the reload" : ""));
  renderAgent(acp.init);
  transcript.shared = acp.canAttach();
  announce(`Connected to ${agentName(acp.init)}`);
  if (reconnect && app.session) await restoreSession();
  else if (!app.session && app.attachTarget) await attachShared();
  else if (!app.session) showEmpty();
  refreshSessions();
  if (!reconnect && document.activeElement !== els.agent) els.prompt.focus();
  // The agent has started now: its entry in the picker may say more.
  if (app.agents?.length > 1 && !reconnect) refreshAgents(url, { token, ticket });
}

// The "connected" detail line: the URL, the transport, the credential.
function connDetail(conn) {
  const via = conn.transport === "http"
    ? `Streamable HTTP${FORCED_TRANSPORT ? "" : " (the WebSocket was refused)"}`
    : `WebSocket, subprotocol ${conn.protocol || "(none)"}`;
  return `${conn.url} · ${via}${app.credential}`;
}

// ---------------------------------------------------------------------------
// Agents (GET /v1/agents)

// Asks the gateway at url which agents it serves, and shows them. Not with
// a ticket alone (it is single-use, and the connection needs it), nor on
// another origin (the page's Content-Security-Policy allows no fetch
// there): then what is shown stays. A gateway without the list (404, an
// older one), or one that refuses it, leaves no list: the page uses /acp.
async function refreshAgents(url, { token, ticket }) {
  let same = false;
  try {
    same = new URL(agentsUrl(url)).origin === location.origin;
  } catch {
    // not a URL: connect() says so
  }
  if ((ticket && !token) || !same) {
    app.agentsListed = false;
    return;
  }
  let agents = null;
  try {
    agents = await listAgents(url, { token, timeoutMs: 5000 });
  } catch (err) {
    // 404: an older gateway. A refusal (401, 403) or a token a header
    // cannot carry: connecting says why.
    if (err instanceof ConnectError && ![401, 403, 404].includes(err.status)) console.info("acpgate: no agent list:", errText(err));
  }
  app.agents = agents;
  app.agentsListed = true;
  renderAgentPicker();
}

// The picker's choice: the user's pick on this page, else the agent the
// page is connected to, the share link's agent, ?agent= in the address, the
// one remembered, the gateway's default, the first.
function renderAgentPicker() {
  const list = app.agents ?? [];
  const names = list.map((a) => a.name);
  const want = [app.pickedAgent, app.conn ? app.agent : "", app.attachTarget?.agent, QUERY_AGENT, store.get("agent"), list.find((a) => a.default)?.name, names[0]]
    .find((n) => n && names.includes(n)) ?? "";
  clear(els.agent);
  for (const a of list) {
    els.agent.appendChild(h("option", { value: a.name, dataset: { ready: String(a.ready) } }, agentLabel(a)));
  }
  els.agent.value = want;
  // One agent (or none): nothing to pick.
  els.agentField.hidden = list.length < 2;
}

// "second · Claude Code 1.2 (default) · not ready": the gateway's name for
// the agent, then what the agent calls itself, once it has started.
function agentLabel(a) {
  const info = a.agentInfo ?? {};
  const own = String(info.title || info.name || "");
  let label = a.name;
  if (own && own !== a.name) label += ` · ${own}`;
  if (own && info.version) label += ` ${info.version}`;
  if (a.default) label += " (default)";
  if (!a.ready) label += " · not ready";
  return label;
}

// The agent to connect to: the picker's, or "" for /acp when the list has
// only the gateway's default agent (as before agents had names) or is
// unknown (then ?agent= from the address, if the page could not ask).
function targetAgent() {
  const list = app.agents;
  if (!list) return app.agentsListed ? "" : app.attachTarget?.agent || QUERY_AGENT;
  if (!list.length || (list.length === 1 && list[0].default)) return "";
  return els.agent.value || list[0].name;
}

// Remembers a pick: in localStorage, and in ?agent= if the address has it.
function rememberAgent(name) {
  store.set("agent", name);
  const u = new URL(location.href);
  if (u.searchParams.has("agent")) {
    u.searchParams.set("agent", name);
    history.replaceState(history.state, "", u.href);
  }
}

// Another agent was picked. Its sessions are not this one's: the page
// leaves the open session and ends the connection; unless the user had
// disconnected, it connects to the new agent.
function switchAgent() {
  const conn = app.conn;
  const again = app.wantConnected || !!conn;
  const acp = app.acp;
  app.epoch++;
  app.connectSeq++; // abandon a connect() in progress
  clearTimeout(app.timer);
  app.attempt = 0;
  app.conn = null;
  app.acp = null;
  app.renewing = false;
  app.replacing = null;
  app.running = null;
  app.loading = false;
  transcript.cancelPermissions("You switched to another agent.");
  leaveShared(acp);
  acp?.close(1000, "switched to another agent"); // stops its connecting anew too
  conn?.close(1000, "switched to another agent");
  app.session = null;
  app.presence.clear();
  renderPresence();
  transcript.clear();
  setTitle("");
  els.sessionMeta.textContent = "";
  els.promptHint.textContent = PROMPT_HINT;
  refreshSessions();
  showEmpty();
  if (again) connect();
  else updateControls();
}

// Opening failed: the WebSocket upgrade, or over HTTP the initialize POST.
// up: what probe() said (an HTTP refusal implies true); status and message:
// what an HTTP refusal said.
function openFailed(url, { token, ticket, reconnect, up, status = 0, message = "" }) {
  if (reconnect) {
    // Up but refusing (a revoked token?) or still away: keep trying either way.
    const hint = up !== true ? ""
      : status ? `The gateway refused the connection (HTTP ${status}${message ? `: ${message}` : ""}). `
        : "The gateway is up but refused the upgrade: check the token. ";
    return scheduleReconnect(hint);
  }
  explainRefusal(url, { token, ticket, reachable: up, status, message });
}

// The connection was refused. A browser cannot see why a WebSocket upgrade
// failed (401/403/429, or a proxy), so the gateway's health endpoint tells
// whether it is up at all; over HTTP the status and message are known.
function explainRefusal(url, { token, ticket, reachable, status = 0, message = "" }) {
  app.wantConnected = false;
  if (reachable === false) {
    setState("failed", `Unreachable: nothing answers at ${url}. Is the gateway running?`);
    return;
  }
  if (status && status !== 401 && status !== 403) {
    setState("refused", `Refused (HTTP ${status})${message ? `: ${message}` : ""}.`);
    return;
  }
  const maybe = reachable === null ? " (or the gateway is unreachable)" : "";
  const says = message && (token || status === 403) ? ` The gateway says: “${message}”` : "";
  if (ticket) setState("refused", `Refused: the ticket is invalid, expired or already used${maybe}. Tickets are single-use.`);
  else if (token) setState("refused", `Refused: check the token${maybe}.${says}`);
  else setState("refused", `Refused: check the token. This gateway needs one (or does not allow this page's origin)${maybe}.${says}`);
  els.auth.open = true;
  (ticket ? els.ticket : els.token).focus();
}

// true: the gateway's /healthz answers; false: it does not; null: cannot tell
// (another origin, which the page's Content-Security-Policy does not reach).
async function probe(url) {
  let health;
  try {
    health = new URL("/healthz", url.replace(/^ws/, "http"));
  } catch {
    return null;
  }
  if (health.origin !== location.origin) return null;
  try {
    const r = await fetch(health, { cache: "no-store" });
    return r.ok;
  } catch {
    return false;
  }
}

// A dropped socket is being resumed (the gateway keeps the connection): the
// transcript, the running turn and open permission requests stay as they
// are; what the page sends meanwhile goes out once the socket is back.
// #conn-state (a live region) says "Reconnecting…", then "Connected".
function onLink(conn, ev) {
  if (app.conn !== conn) return;
  if (ev.state === "reconnecting") {
    app.lastClose = ev.close;
    app.attempt = ev.attempt;
    setState("reconnecting", `Connection lost: ${closeText(ev.close)}. Resuming the connection in ${(ev.delayMs / 1000).toFixed(1)} s (attempt ${ev.attempt}); the conversation goes on where it was.`);
    els.promptHint.textContent = "Reconnecting… the conversation goes on once the connection is back";
  } else if (ev.state === "resumed") {
    app.attempt = 0;
    setState("connected", `${app.connDetail} · resumed after ${closeText(app.lastClose)}`);
    els.promptHint.textContent = PROMPT_HINT;
    announce(app.running ? "Reconnected. The reply goes on." : "Reconnected.");
  }
}

function onClosed(conn, c) {
  if (app.conn !== conn) return;
  // A refused resume that acp.js handles: it connects anew and loads the
  // session (onReconnect "reconnecting" has said so already).
  if (c.reconnecting && app.renewing) return;
  app.conn = null;
  app.acp = null;
  app.lastClose = c;
  els.promptHint.textContent = PROMPT_HINT;
  endRemoteTurn();
  transcript.cancelPermissions("The connection closed.");
  if (!app.wantConnected) {
    setState("disconnected", `Closed: ${closeText(c)}`);
    return;
  }
  if (app.usedTicket && !els.token.value.trim()) {
    app.wantConnected = false;
    setState("disconnected", `Closed: ${closeText(c)}. The ticket was single-use: paste a new one to reconnect.`);
    els.auth.open = true;
    return;
  }
  if (c.resumeRefused) {
    // The gateway is up but no longer has the connection (it restarted, or
    // kept it for less than the drop lasted): connect anew at once; the
    // open session is loaded again.
    setState("reconnecting", `Connection lost: ${closeText(c)}. The gateway could not resume it: connecting anew.`);
    app.timer = setTimeout(() => connect({ reconnect: true }), 0);
    return;
  }
  scheduleReconnect();
}

// Tries again after a backoff. The detail keeps the close that lost the
// connection (failed attempts while the gateway is away are all 1006).
function scheduleReconnect(hint = "") {
  app.attempt++;
  const delay = backoff(app.attempt);
  setState("reconnecting", `Connection lost: ${closeText(app.lastClose)}. ${hint}Retrying in ${(delay / 1000).toFixed(1)} s (attempt ${app.attempt}).`);
  app.timer = setTimeout(() => connect({ reconnect: true }), delay);
}

function disconnect() {
  app.wantConnected = false;
  app.connectSeq++; // abandon a connect() in progress
  clearTimeout(app.timer);
  app.attempt = 0;
  const acp = app.acp;
  if (app.renewing) {
    // acp.js is connecting anew: stop it (no close event comes: the old
    // connection is over already).
    app.renewing = false;
    app.replacing = null;
    app.conn = null;
    app.acp = null;
    app.loading = false;
    acp?.close(1000, "client disconnected");
    setState("disconnected", `Closed: ${closeText(app.lastClose)}`);
    refreshSessions();
    return;
  }
  if (acp) acp.close(1000, "client disconnected");
  else if (app.conn) app.conn.close(1000, "client disconnected");
  else setState("disconnected", "");
}

// What acp.js (AcpClient) reports while it connects anew after a refused
// resume and loads the open session again (see acp.js, "Connecting anew").
function onReconnect(acp, ev) {
  if (app.acp !== acp) return; // an abandoned client
  const mine = app.session && ev.sessionId === app.session.id;
  switch (ev.state) {
    case "reconnecting":
      app.renewing = true;
      app.lastClose = ev.close;
      app.loading = false;
      app.replacing = null;
      endRemoteTurn();
      transcript.cancelPermissions("The connection closed.");
      setState("reconnecting", `Connection lost: ${closeText(ev.close)}. The gateway could not resume it: connecting anew${app.session ? " to load the session again" : ""}.`);
      els.promptHint.textContent = "Reconnecting… the conversation is loaded again once connected";
      break;
    case "reconnected": {
      const conn = ev.conn;
      app.renewing = false;
      app.conn = conn;
      conn.onLink((e) => onLink(conn, e));
      conn.onClose((c) => onClosed(conn, c));
      app.attempt = 0;
      app.connDetail = connDetail(conn);
      els.promptHint.textContent = PROMPT_HINT;
      setState("connected", `${app.connDetail} · connected anew after ${closeText(app.lastClose)}: the connection could not be resumed`);
      renderAgent(ev.init);
      transcript.shared = app.acp.canAttach();
      if (!app.session) {
        showEmpty();
        refreshSessions();
      }
      break;
    }
    case "restoring":
      if (!mine) break;
      app.loading = true;
      // session/load replays the history, which replaces what the page
      // shows (it may end with a turn the drop cut short): the view is
      // cleared when the replay starts (wireHandlers).
      if (ev.method === "session/load" || ev.method === "session/attach") app.replacing = { sessionId: ev.sessionId };
      updateControls();
      break;
    case "restored":
      if (!mine) break;
      app.loading = false;
      if (app.replacing) {
        app.replacing = null;
        // Nothing was replayed. The gateway took the session over from
        // the old connection, which it still kept: the updates since the
        // drop follow this answer, after what the page shows. Otherwise the
        // agent has no history for it.
        if (!ev.result?._meta?.acpgate?.turn) replaceView();
      }
      if (ev.method === "session/attach") attached(ev.result);
      transcript.notice(ev.method === "session/load"
        ? "The connection was lost and could not be resumed: connected anew, and the session was loaded again (history replayed with session/load)."
        : ev.method === "session/attach"
          ? "The connection was lost and could not be resumed: connected anew, and attached to the session again (history replayed with session/attach)."
          : "The connection was lost and could not be resumed: connected anew, and the session was resumed (session/resume, no replay).", "divider");
      announce("The connection was lost and could not be resumed; the session was loaded again.");
      updateControls();
      break;
    case "lost":
      if (!mine) break;
      app.loading = false;
      app.replacing = null;
      transcript.notice(ev.method
        ? `The connection was lost and could not be resumed, and the session could not be loaded again: ${errText(ev.error)}`
        : "The connection was lost and could not be resumed, and this agent cannot load sessions (no loadSession): start a new session to go on.", ev.method ? "error" : "warn");
      app.session = null;
      leaveShared(null);
      updateControls();
      break;
    case "done":
      refreshSessions();
      break;
    case "failed":
      // Not after "reconnecting" (a spent ticket): onClosed says so.
      if (!app.renewing) break;
      app.renewing = false;
      app.replacing = null;
      app.conn = null;
      app.acp = null;
      app.loading = false;
      if (!app.wantConnected) {
        setState("disconnected", `Closed: ${closeText(ev.close)}`);
        break;
      }
      // The page's own reconnect, with backoff: connect() then loads the
      // session (restoreSession).
      scheduleReconnect(`Connecting anew failed: ${errText(ev.error)}. `);
      break;
  }
}

// The replay of a session acp.js loads again starts: it replaces the view.
function replaceView() {
  transcript.clear();
  setTitle(app.session?.title ?? "");
}

// acp.js loads again, after a refused resume, every session it saw opened
// on the connection: the page shows one, so only that one stays tracked.
function trackOnly(id) {
  for (const sid of [...(app.acp?.sessions.keys() ?? [])]) if (sid !== id) app.acp.forgetSession(sid);
}

// After a reconnect: bring the open session back on the new connection.
async function restoreSession() {
  const s = app.session;
  if (s.attached) {
    await attachSession(s.id, { readOnly: s.readOnly, reason: "Reconnected: attached to the session again (history replayed with session/attach)." });
  } else if (app.acp.canLoad()) {
    await loadSession(s.id, s.cwd, { title: s.title, reason: "Reconnected: history replayed with session/load." });
  } else if (app.acp.canResume()) {
    try {
      await app.acp.resumeSession(s.id, s.cwd);
      transcript.notice("Reconnected: session resumed (session/resume, no replay).", "divider");
    } catch (err) {
      transcript.notice(`Reconnected, but the session could not be resumed: ${errText(err)}`, "error");
      app.session = null;
    }
  } else {
    transcript.notice("Reconnected, but this agent cannot load sessions (no loadSession): start a new session to go on.", "warn");
    app.session = null;
  }
  updateControls();
}

// The agent's requests and notifications.
function wireHandlers(conn) {
  conn.on("session/update", (p) => {
    if (!app.session) return;
    if (p.sessionId !== app.session.id) {
      // A subagent's child session of the open one: its nested transcript.
      transcript.child(p.sessionId)?.update(p.update);
      return;
    }
    if (app.replacing?.sessionId === p.sessionId) {
      app.replacing = null;
      replaceView();
    }
    if (!sharedUpdate(p.update)) transcript.update(p.update);
  });
  // The gateway says the session ended for this page: another client loaded
  // or took it over, or an administrator ended it.
  conn.on("_acpgate/session_ended", (p) => {
    if (!app.session || p.sessionId !== app.session.id) return;
    transcript.notice(`This session ended here: ${String(p.reason ?? "ended")}. Load it again to go on.`, "warn");
    app.session = null;
    updateControls();
  });
  conn.handle("session/request_permission", (p, { signal }) => {
    // The open session's, or one of its subagents' (shown in the child's transcript).
    const t = !app.session ? null : p.sessionId === app.session.id ? transcript : transcript.child(p.sessionId);
    if (!t) return { outcome: { outcome: "cancelled" } };
    return t.askPermission(p, signal).then((outcome) => ({ outcome }));
  });
  conn.handle("fs/read_text_file", (p) => files.read(p));
  conn.handle("fs/write_text_file", (p) => files.write(p));
  conn.onProtocolError = (err) => console.warn("acpgate client:", err);
}

// ---------------------------------------------------------------------------
// Agent panel

function agentName(init) {
  const i = init?.agentInfo ?? {};
  return String(i.title ?? i.name ?? "agent");
}

function renderAgent(init) {
  const info = init?.agentInfo ?? {};
  const caps = init?.agentCapabilities ?? {};
  const on = (v) => v === true || (v !== null && typeof v === "object");
  replace(els.agentBadge, h("span", { class: "agent-name" }, agentName(init)), info.version ? h("span", { class: "agent-version" }, ` ${info.version}`) : null);

  const chip = (label, enabled, title) =>
    h("li", { class: enabled ? "cap on" : "cap off", title }, label, h("span", { class: "visually-hidden" }, enabled ? " (supported)" : " (not supported)"));
  const group = (name, items) => h("div", { class: "cap-group" }, h("h3", {}, name), h("ul", { class: "caps" }, items));
  const sc = caps.sessionCapabilities ?? {};
  const pc = caps.promptCapabilities ?? {};
  const mc = caps.mcpCapabilities ?? {};
  const known = new Set(["list", "resume", "close", "delete", "additionalDirectories"]);

  replace(els.agentInfo,
    h("dl", { class: "kv" },
      h("dt", {}, "Agent"), h("dd", {}, agentName(init)),
      app.agent ? [h("dt", {}, "Endpoint"), h("dd", {}, h("code", {}, `/acp/${app.agent}`))] : null,
      h("dt", {}, "Version"), h("dd", {}, String(info.version ?? "—")),
      h("dt", {}, "Protocol"), h("dd", {}, `ACP v${init?.protocolVersion}`)),
    group("Sessions", [
      chip("load", caps.loadSession === true, "session/load: replay a saved session"),
      chip("list", on(sc.list), "session/list"),
      chip("resume", on(sc.resume), "session/resume: reattach without replay"),
      chip("close", on(sc.close), "session/close"),
      chip("delete", on(sc.delete), "session/delete"),
      chip("extra dirs", on(sc.additionalDirectories), "additionalDirectories"),
      ...Object.keys(sc).filter((k) => !known.has(k) && !k.startsWith("_")).map((k) => chip(k, on(sc[k]), `sessionCapabilities.${k}`)),
    ]),
    group("Prompt", [
      chip("text", true, "always supported"),
      chip("image", pc.image === true, "promptCapabilities.image"),
      chip("audio", pc.audio === true, "promptCapabilities.audio"),
      chip("context", pc.embeddedContext === true, "promptCapabilities.embeddedContext"),
    ]),
    group("MCP servers", [
      chip("stdio", true, "always supported"),
      chip("http", mc.http === true, "mcpCapabilities.http"),
      chip("sse", mc.sse === true, "mcpCapabilities.sse"),
    ]),
    Array.isArray(init?.authMethods) && init.authMethods.length
      ? group("Authentication", init.authMethods.map((m) => h("li", { class: "cap on" }, String(m.name ?? m.id))))
      : null,
    h("details", { class: "raw" }, h("summary", {}, "initialize result"), h("pre", { tabindex: "0" }, JSON.stringify(init, null, 2))));
}

// ---------------------------------------------------------------------------
// Sessions

function setTitle(title) {
  els.title.textContent = title || "New conversation";
  document.title = title ? `${title} · acpgate` : "acpgate";
  if (app.session) app.session.title = title;
}

function checkedCwd() {
  const cwd = normalizePath(els.cwd.value.trim());
  els.cwdError.hidden = !!cwd;
  if (!cwd) {
    els.cwdError.textContent = "The working directory must be an absolute path, like /tmp.";
    els.cwd.setAttribute("aria-invalid", "true");
    els.cwd.focus();
    return null;
  }
  els.cwd.removeAttribute("aria-invalid");
  return cwd;
}

async function newSession() {
  if (!app.acp) return false;
  const cwd = checkedCwd();
  if (!cwd) return false;
  store.set("cwd", cwd);
  app.loading = true;
  updateControls();
  const epoch = app.epoch;
  try {
    const res = await app.acp.newSession(cwd);
    if (epoch !== app.epoch) return false; // another agent was picked meanwhile
    leaveShared();
    app.session = { id: res.sessionId, cwd, title: "" };
    ownPresence();
    trackOnly(res.sessionId);
    store.set("lastSession", { id: res.sessionId, cwd, agent: app.agent });
    transcript.clear();
    setTitle("");
    els.sessionMeta.textContent = cwd;
    showEmpty();
    return true;
  } catch (err) {
    if (epoch !== app.epoch) return false;
    els.cwdError.hidden = false;
    els.cwdError.textContent = `Could not start a session in ${cwd}: ${errText(err)}`;
    els.cwd.setAttribute("aria-invalid", "true");
    announce(els.cwdError.textContent);
    return false;
  } finally {
    if (epoch === app.epoch) {
      app.loading = false;
      updateControls();
      refreshSessions();
    }
  }
}

async function loadSession(id, cwd, { title = "", reason = "Session loaded: history replayed with session/load." } = {}) {
  if (!app.acp || app.running) return;
  app.loading = true;
  updateControls();
  const previous = app.session;
  if (previous?.id !== id) leaveShared();
  app.session = { id, cwd, title };
  ownPresence();
  transcript.clear();
  setTitle(title);
  els.sessionMeta.textContent = cwd;
  const epoch = app.epoch;
  try {
    // The agent replays the history as session/update notifications, which
    // arrive (and render) before this response.
    await app.acp.loadSession(id, cwd);
    if (epoch !== app.epoch) return; // another agent was picked meanwhile
    transcript.notice(reason, "divider");
    trackOnly(id);
    store.set("lastSession", { id, cwd, agent: app.agent });
    announce(`Session ${title || ""} loaded`);
  } catch (err) {
    if (epoch !== app.epoch) return;
    transcript.notice(`Could not load the session: ${errText(err)}`, "error");
    app.session = err instanceof AcpError || previous?.attached ? null : previous;
    trackOnly(app.session?.id);
  } finally {
    if (epoch === app.epoch) {
      app.loading = false;
      updateControls();
      refreshSessions();
    }
  }
}

let listSeq = 0;
async function refreshSessions() {
  const seq = ++listSeq;
  const acp = app.acp;
  const list = els.sessionList;
  if (!acp) {
    replace(list, h("li", { class: "muted" }, "Connect to see the saved sessions."));
    return updateControls();
  }
  let sessions = [];
  let note = null;
  if (acp.canList()) {
    try {
      const res = await acp.listSessions();
      sessions = Array.isArray(res?.sessions) ? res.sessions : [];
      if (res?.nextCursor) note = "Showing the newest sessions.";
    } catch (err) {
      note = `session/list failed: ${errText(err)}`;
    }
  } else {
    note = "This agent does not list sessions (no sessionCapabilities.list).";
    const last = store.get("lastSession");
    if (last?.id && (last.agent ?? "") === app.agent) sessions = [{ sessionId: last.id, cwd: last.cwd, title: "Last session" }];
  }
  if (seq !== listSeq) return;
  clear(list);
  if (!sessions.length && !note) list.appendChild(h("li", { class: "muted" }, "No saved sessions yet."));
  const canLoad = acp.canLoad();
  const canResume = acp.canResume();
  for (const s of sessions) {
    const current = app.session?.id === s.sessionId;
    const title = String(s.title || "Untitled session");
    const action = canLoad ? "Load" : canResume ? "Resume" : null;
    list.appendChild(h("li", { class: "session-item", "aria-current": current ? "true" : null, dataset: { sessionId: s.sessionId } },
      h("div", { class: "session-text" },
        h("span", { class: "session-title" }, title),
        h("span", { class: "session-meta" }, String(s.cwd ?? ""), s.updatedAt ? ` · ${relativeTime(s.updatedAt)}` : "")),
      current ? h("span", { class: "badge" }, "open") : null,
      action && !current
        ? h("button", {
            type: "button",
            class: "btn btn-small",
            "aria-label": `${action} session ${title}`,
            onclick: () => (canLoad ? loadSession(s.sessionId, s.cwd, { title: s.title ?? "" }) : resumeSession(s)),
          }, action)
        : null));
  }
  if (note) list.appendChild(h("li", { class: "muted small" }, note));
  updateControls();
}

async function resumeSession(s) {
  const epoch = app.epoch;
  try {
    await app.acp.resumeSession(s.sessionId, s.cwd);
    if (epoch !== app.epoch) return;
    leaveShared();
    app.session = { id: s.sessionId, cwd: s.cwd, title: s.title ?? "" };
    ownPresence();
    trackOnly(s.sessionId);
    transcript.clear();
    setTitle(s.title ?? "");
    transcript.notice("Session resumed (session/resume does not replay the history).", "divider");
  } catch (err) {
    if (epoch !== app.epoch) return;
    transcript.notice(`Could not resume the session: ${errText(err)}`, "error");
  }
  refreshSessions();
}

// ---------------------------------------------------------------------------
// Sharing: session/attach, presence, the share link

// Attaches to the session of the share link the page was opened with.
async function attachShared() {
  const t = app.attachTarget;
  app.attachTarget = null;
  await attachSession(t.sessionId, { readOnly: t.readOnly });
}

// Joins a live session as one more of its clients; its kept history is
// replayed (session/update) before the answer, as for a load.
async function attachSession(id, { readOnly = false, reason = "Attached to the shared session: its history was replayed with session/attach." } = {}) {
  if (!app.acp) return false;
  if (!app.acp.canAttach()) {
    transcript.notice("This gateway does not share sessions (no sessionCapabilities.attach in its initialize result): the link cannot be opened here.", "warn");
    return false;
  }
  app.loading = true;
  if (app.session && app.session.id !== id) leaveShared();
  app.session = { id, cwd: "", title: "", attached: true, readOnly };
  transcript.readOnly = readOnly;
  transcript.member = true;
  transcript.clear();
  setTitle("");
  els.sessionMeta.textContent = "shared session";
  updateControls();
  const epoch = app.epoch;
  try {
    const res = await app.acp.attach(id, { historyPolicy: "full", clientInfo: CLIENT_INFO, readOnly });
    if (epoch !== app.epoch) return false; // another agent was picked meanwhile
    attached(res);
    const trimmed = res?._meta?.acpgate?.historyTrimmed ? " The oldest part of the history was no longer kept." : "";
    transcript.notice(reason + trimmed, "divider");
    trackOnly(id);
    announce(app.session.readOnly ? "Attached to the shared session, read-only" : "Attached to the shared session");
    return true;
  } catch (err) {
    if (epoch !== app.epoch) return false;
    transcript.notice(`Could not attach to the session: ${errText(err)}`, "error");
    app.session = null;
    leaveShared(null);
    trackOnly(null);
    return false;
  } finally {
    if (epoch === app.epoch) {
      app.loading = false;
      updateControls();
      refreshSessions();
    }
  }
}

// The session/attach result (or a reconnect's): who this page is in the
// session, and who else is there. The page is the client whose ID the
// gateway answered (it mints every one, unique in the session): a clientId
// anyone may ask for, or a name, never makes another client "me".
function attached(res) {
  const s = app.session;
  if (!s) return;
  if (typeof res?.readOnly === "boolean") s.readOnly = res.readOnly; // the gateway's policy may force it
  transcript.readOnly = s.readOnly;
  app.selfId = String(res?.clientId ?? "");
  app.presence.clear();
  for (const c of Array.isArray(res?.connectedClients) ? res.connectedClients : []) presenceAdd(c);
  if (!app.presence.has(app.selfId)) presenceAdd({ clientId: app.selfId, name: CLIENT_INFO.name, readOnly: s.readOnly });
  renderPresence();
}

// The page leaves the session it shows: detached if it attached to it (the
// session goes on for its other clients), its link taken out of the address.
function leaveShared(acp = app.acp) {
  const s = app.session;
  if (s?.attached) {
    acp?.detach(s.id).catch(() => {}); // best effort: the gateway drops a gone client anyway
    if (shareTarget()?.sessionId === s.id) history.replaceState(history.state, "", location.pathname + location.search);
  }
  endRemoteTurn();
  transcript.readOnly = false;
  transcript.member = false;
  app.selfId = "";
  app.presence.clear();
  renderPresence();
}

// A session the page started or loaded: it is its one client so far. As
// its owner it asked (initialize _meta.acpgate.multiClient) to hear who
// else joins, prompts and answers; it is the client whose ID the
// initialize result gave ("" from a gateway that gives none: then no
// update names it).
function ownPresence() {
  app.selfId = String(app.acp?.init?._meta?.acpgate?.clientId ?? "");
  app.presence.clear();
  presenceAdd({ clientId: app.selfId, name: CLIENT_INFO.name });
  renderPresence();
}

function clientName(c) {
  return String(c?.name || c?.clientId || "another client");
}

function presenceAdd(c) {
  if (!c || typeof c !== "object") return;
  const clientId = String(c.clientId ?? "");
  app.presence.set(clientId, { clientId, name: clientName(c), readOnly: c.readOnly === true, self: clientId === app.selfId });
}

function renderPresence() {
  const list = [...app.presence.values()];
  replace(els.presence, list.map((c) => h("li", {
    class: c.self ? "self" : null,
    title: c.clientId ? `client ${c.clientId}` : null,
    dataset: { clientId: c.clientId, readOnly: String(c.readOnly) },
  }, c.self ? `${c.name} (you)` : c.name)));
  els.presence.setAttribute("aria-label", `${list.length} client${list.length === 1 ? "" : "s"} connected to this session`);
  updateControls();
}

// The session/update kinds acpgate sends only to attached clients; true
// when u was one of them.
function sharedUpdate(u) {
  switch (u?.sessionUpdate) {
    case "permission_resolved":
      transcript.permissionResolved(u, app.selfId);
      return true;
    case "prompt_received":
      promptReceived(u);
      return true;
    case "turn_complete":
      turnComplete(u);
      return true;
    case "client_connected":
      presenceAdd(u.client);
      renderPresence();
      if (!app.loading) announce(`${clientName(u.client)} joined the session`);
      return true;
    case "client_disconnected":
      app.presence.delete(String(u.client?.clientId ?? ""));
      renderPresence();
      if (!app.loading) announce(`${clientName(u.client)} left the session`);
      return true;
    default:
      return false;
  }
}

// Another client's prompt: shown as theirs, and its turn runs.
function promptReceived(u) {
  if (u.sentBy?.clientId && u.sentBy.clientId === app.selfId) return;
  transcript.addPromptFrom(clientName(u.sentBy), u.prompt);
  if (app.running || app.loading) return;
  app.running = { started: performance.now(), remote: true };
  transcript.beginTurn({ remote: true });
  updateControls();
}

// A turn this page did not start ended (our own ends with its session/prompt answer).
function turnComplete(u) {
  const r = app.running;
  if (r && !r.remote) return;
  app.running = null;
  transcript.endTurn(String(u.stopReason ?? "end_turn"), r ? performance.now() - r.started : null);
  updateControls();
}

// No longer following another client's turn (the page left the session or
// lost the connection).
function endRemoteTurn() {
  if (!app.running?.remote) return;
  app.running = null;
  transcript.idle();
  updateControls();
}

// The share link: this page's address with the session in the fragment.
function shareLink() {
  const f = new URLSearchParams({ attach: app.session?.id ?? "" });
  if (app.agent) f.set("agent", app.agent);
  if (els.shareRo.checked) f.set("ro", "1");
  const affinity = connAffinity();
  if (affinity) f.set("affinity", affinity);
  const u = new URL(location.pathname, location.href);
  u.hash = f.toString();
  return u.href;
}

function showShare(show) {
  if (els.sharePanel.hidden === !show) return;
  els.sharePanel.hidden = !show;
  els.shareBtn.setAttribute("aria-expanded", String(show));
  if (!show) return;
  // A read-only page shares read-only.
  els.shareRo.checked ||= !!app.session?.readOnly;
  els.shareRo.disabled = !!app.session?.readOnly;
  els.shareLink.value = shareLink();
  els.shareStatus.textContent = "";
  els.shareCopy.focus();
}

async function copyShareLink() {
  els.shareLink.value = shareLink();
  try {
    await navigator.clipboard.writeText(els.shareLink.value);
    els.shareStatus.textContent = els.shareRo.checked ? "Read-only link copied." : "Link copied.";
  } catch {
    els.shareLink.select();
    els.shareStatus.textContent = "The browser did not allow the clipboard: the link is selected, copy it with Ctrl+C.";
  }
}

// The affinity cookie the connection's opening request carried (what
// routes a share link's page to this replica), or "".
function connAffinity() {
  return affinityCookie(app.acp?.init?._meta?.acpgate?.affinity);
}

// A share link opened in this tab: leave the open session for its session.
function onHashChange() {
  const t = shareTarget();
  if (!t || t.sessionId === app.session?.id) return;
  app.attachTarget = t;
  setAffinity(t.affinity);
  if (t.agent && t.agent !== app.agent && app.agents?.some((a) => a.name === t.agent)) {
    app.pickedAgent = t.agent;
    renderAgentPicker();
    switchAgent(); // connects to that agent, then attaches
  } else if (t.affinity && app.conn && t.affinity !== connAffinity()) {
    switchAgent(); // the same agent, connected anew: the balancer routes by the cookie now
  } else if (app.acp && app.state === "connected" && !app.running && !app.loading) {
    attachShared();
  }
}

// ---------------------------------------------------------------------------
// Prompts

async function sendPrompt(text = els.prompt.value) {
  if (app.running) {
    announce("The agent is still working: wait for it, or press Escape to cancel.");
    els.promptHint.textContent = "The agent is still working · Esc cancels";
    return;
  }
  if (app.session?.readOnly) {
    announce("Read-only: you are watching this session and cannot send prompts.");
    return;
  }
  if (!text.trim() || app.loading || !app.acp || app.state !== "connected") return;
  if (!app.session && !(await newSession())) return;
  if (text === els.prompt.value) {
    els.prompt.value = "";
    autosize();
  }
  const session = app.session;
  transcript.addUser(text);
  transcript.beginTurn();
  const started = performance.now();
  app.running = { started };
  updateControls();
  const epoch = app.epoch;
  try {
    const res = await app.acp.prompt(session.id, [{ type: "text", text }]);
    if (epoch !== app.epoch) return; // another agent was picked: this turn's page is gone
    const stopped = budgetText(res?._meta?.acpgate?.budget);
    if (stopped) transcript.notice(`The gateway stopped this turn: ${stopped}`, "warn");
    transcript.endTurn(String(res?.stopReason ?? "end_turn"), performance.now() - started);
  } catch (err) {
    if (epoch !== app.epoch) return;
    const lost = err instanceof ConnectError;
    const budget = err instanceof AcpError && err.code === -32006 ? budgetText(err.data) : "";
    if (budget) transcript.notice(`Not sent: ${budget}`, "warn");
    else transcript.notice(lost ? `The connection closed during the turn: ${errText(err)}` : `The prompt failed: ${errText(err)}`, "error");
    transcript.endTurn("error", performance.now() - started);
  } finally {
    if (epoch === app.epoch) app.running = null;
    els.promptHint.textContent = PROMPT_HINT;
    updateControls();
    if (!document.activeElement || document.activeElement === document.body || document.activeElement === els.cancelBtn) els.prompt.focus();
  }
  if (app.acp && app.session === session) refreshSessions();
}

function cancelPrompt() {
  if (!app.running || !app.acp || !app.session || app.session.readOnly) return;
  app.running.cancelling = true;
  // session/cancel is a notification; the prompt then ends with
  // stopReason "cancelled". Open permission requests must be answered
  // "cancelled" by the client.
  app.acp.cancel(app.session.id);
  transcript.cancelPermissions("You cancelled the turn.");
  updateControls();
  els.prompt.focus();
}

function autosize() {
  const p = els.prompt;
  p.style.height = "auto";
  p.style.height = Math.min(p.scrollHeight + 2, 220) + "px";
}

// The first screen: what to try with the demo agent, or a hint.
function showEmpty() {
  const demo = app.acp?.init?.agentInfo?.name === "acpgate-demo-agent";
  const cwd = app.session?.cwd ?? (normalizePath(els.cwd.value.trim()) || "/tmp");
  const base = cwd === "/" ? "" : cwd;
  const tries = demo
    ? [
        ["markdown", "a formatted reply"],
        ["plan", "a plan that completes"],
        ["think", "thoughts, then a reply"],
        ["permission", "asks before it runs"],
        [`read ${base}/notes.txt`, "reads from the Files panel"],
        [`write ${base}/hello.txt Hello from the agent`, "writes after you allow it"],
        ["slow", "a long stream to cancel"],
      ]
    : [];
  transcript.showEmpty(h("div", { class: "empty-inner" },
    h("p", { class: "empty-title" }, demo ? "Say something to the demo agent, or try one of these:" : "Type a message below to start."),
    tries.length
      ? h("ul", { class: "suggestions" }, tries.map(([t, what]) => h("li", {},
          h("button", { type: "button", class: "suggestion", onclick: () => sendPrompt(t), disabled: !app.acp },
            h("code", {}, t), h("span", {}, what)))))
      : null));
}

// ---------------------------------------------------------------------------
// Theme and panels

// The toggle goes auto -> the scheme the system does not use -> the one it
// does -> auto, so the first click always changes what you see.
const THEMES = window.matchMedia("(prefers-color-scheme: dark)").matches ? ["auto", "light", "dark"] : ["auto", "dark", "light"];
function applyTheme(t) {
  if (!THEMES.includes(t)) t = "auto";
  if (t === "auto") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
  const next = THEMES[(THEMES.indexOf(t) + 1) % THEMES.length];
  els.themeBtn.dataset.theme = t;
  els.themeBtn.querySelector(".theme-label").textContent = t[0].toUpperCase() + t.slice(1);
  els.themeBtn.setAttribute("aria-label", `Theme: ${t}. Switch to ${next}.`);
  store.set("theme", t);
}

function toggleFiles(show) {
  els.filesPanel.hidden = !show;
  els.filesToggle.setAttribute("aria-expanded", String(show));
  document.body.classList.toggle("files-open", show);
}

// ---------------------------------------------------------------------------
// Start

const transcript = new Transcript(els.transcript, {
  onTitle: (t) => {
    setTitle(t);
    const li = els.sessionList.querySelector(`[aria-current="true"] .session-title`);
    if (li) li.textContent = t;
  },
  announce,
  onUsage: (u) => {
    if (Number.isFinite(u.used) && Number.isFinite(u.size)) {
      els.sessionMeta.textContent = `${app.session?.cwd ?? ""} · ${u.used.toLocaleString()} / ${u.size.toLocaleString()} tokens`;
    }
  },
});

const vfs = new VirtualFiles();
if (!store.get("seeded")) {
  vfs.set("/tmp/notes.txt", "Hello from the browser's file panel.\nThe agent reads this file with fs/read_text_file.\n");
  store.set("seeded", true);
}
const files = new FilePanel(vfs, {
  allow: $("fs-allow"),
  list: $("file-list"),
  form: $("file-form"),
  path: $("file-path"),
  content: $("file-content"),
  newBtn: $("file-new"),
  deleteBtn: $("file-delete"),
  status: $("file-status"),
  log: $("fs-log"),
}, {
  announce,
  onRefused: (what, path) => {
    const btn = h("button", {
      type: "button",
      class: "btn btn-small",
      onclick: () => {
        files.setAllowed(true);
        toggleFiles(true);
        btn.disabled = true;
      },
    }, "Allow file access");
    transcript.notice(`Refused the agent's ${what} of ${path}: file access is off. `, "warn", btn);
  },
});

els.url.value = store.get("url") || defaultUrl();
els.cwd.value = store.get("cwd") || "/tmp";
applyTheme(store.get("theme", "auto"));
toggleFiles(window.matchMedia("(min-width: 1200px)").matches);

els.connectForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  app.attempt = 0;
  connect();
});
els.disconnectBtn.addEventListener("click", disconnect);
// A native <select>: the keyboard picks as well as the mouse, and each
// change is a pick (a new connection; a quick run of them ends with the last).
els.agent.addEventListener("change", () => {
  app.pickedAgent = els.agent.value;
  rememberAgent(els.agent.value);
  if (!app.conn || targetAgent() !== app.agent) switchAgent();
});
els.newSessionForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  newSession().then((ok) => ok && els.prompt.focus());
});
els.refreshSessions.addEventListener("click", refreshSessions);
els.composer.addEventListener("submit", (ev) => {
  ev.preventDefault();
  sendPrompt();
});
els.prompt.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing && !ev.altKey && !ev.ctrlKey && !ev.metaKey) {
    ev.preventDefault();
    sendPrompt();
  } else if (ev.key === "Escape" && app.running) {
    ev.preventDefault();
    cancelPrompt();
  }
});
els.prompt.addEventListener("input", autosize);
els.cancelBtn.addEventListener("click", cancelPrompt);
els.shareBtn.addEventListener("click", () => showShare(els.sharePanel.hidden));
els.shareRo.addEventListener("change", () => {
  els.shareLink.value = shareLink();
  els.shareStatus.textContent = "";
});
els.shareCopy.addEventListener("click", copyShareLink);
els.shareLink.addEventListener("focus", () => els.shareLink.select());
window.addEventListener("hashchange", onHashChange);
els.themeBtn.addEventListener("click", () => {
  const t = els.themeBtn.dataset.theme;
  applyTheme(THEMES[(THEMES.indexOf(t) + 1) % THEMES.length]);
});
els.filesToggle.addEventListener("click", () => toggleFiles(els.filesPanel.hidden));
// A page going away leaves a WebSocket to the browser (closed with 1001, the
// gateway keeps the connection for this tab's resume after a reload). An HTTP
// connection is not resumed across a reload: end it now (DELETE) rather than
// leave its agent to the gateway's idle timeout.
window.addEventListener("pagehide", () => {
  if (app.conn?.transport === "http") (app.acp ?? app.conn).close(1000, "the page went away");
});
window.addEventListener("online", () => {
  if (app.state === "reconnecting") connect({ reconnect: true }); // or resume now
});

setState("disconnected", "");
refreshSessions();
showEmpty();
// Talk at once: connect on load. A token is never stored, so a gateway that
// needs one shows "refused" and asks for it.
connect();

// Exposed for debugging in the console; the UI does not depend on it.
window.acpgate = { app, transcript, files: vfs, ErrorCode };
