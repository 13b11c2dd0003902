#!/usr/bin/env node
// probe.mjs: send initialize and session/new to an ACP agent, either directly
// over stdio or through a WebSocket gateway, and print the raw answers. Used by
// interop_test.go to compare what a client sees from acpgate with what it sees
// from the agent itself. Plain JSON-RPC 2.0; no ACP SDK.
//
// Usage:
//   node probe.mjs [options] ws://HOST:PORT/acp     through a gateway (subprotocol "acp")
//   node probe.mjs [options] -- AGENT [ARGS...]      the agent over stdio
//
// Options:
//   --cwd DIR        cwd for session/new (default: the current directory)
//   --timeout MS     overall limit (default 60000)
//   --linger MS      after the session/new answer, keep listening this long and
//                    print any notifications (default 0)
//   --grace MS       stdio only: time between SIGTERM and SIGKILL of the agent's
//                    process group at the end (default 2000)
//
// stdout, one JSON object per line:
//   {"type":"spawn","pid":N,"argv":[...]}              stdio: agent started (own process group N)
//   {"type":"open","protocol":"acp"}                   ws: connected; negotiated subprotocol
//   {"type":"response","method":"initialize","ms":N,"message":{...}}
//   {"type":"response","method":"session/new","ms":N,"message":{...}}
//   {"type":"notification","message":{...}}            anything the agent sent unasked
//   {"type":"request","message":{...}}                 agent->client request (answered -32601)
//   {"type":"other","message":{...}}                   a response to an id we did not send
//   {"type":"nonjson","line":"..."}                    a stdout line / frame that is not JSON
//   {"type":"exit","code":N,"signal":S}                stdio: the agent exited (while we waited)
//   {"type":"close","code":N,"reason":"..."}           ws: the connection closed (while we waited)
//   {"type":"error","stage":"...","message":"..."}     then exit 1
//   {"type":"done","cleanupMs":N}                      after the agent / connection was stopped
// Every line also has "t": milliseconds since the probe started.
// The agent's stderr is copied to our stderr, each line prefixed "[agent] ".
// Exit status: 0 once both answers arrived (an error answer counts as an
// answer), 1 on timeout or a transport failure, 2 on bad usage.
import { spawn } from "node:child_process";
import WebSocket from "ws";

const t0 = Date.now();
const out = (o) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() - t0 }) + "\n");

function usage(msg) {
  process.stderr.write(`probe.mjs: ${msg}\nusage: node probe.mjs [--cwd DIR] [--token TOKEN] [--timeout MS] [--linger MS] [--grace MS] (ws://URL | -- AGENT [ARGS...])\n`);
  process.exit(2);
}

const opts = { cwd: process.cwd(), timeout: 60000, linger: 0, grace: 2000 };
let url = null;
let agentArgv = null;
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") { agentArgv = argv.slice(i + 1); break; }
    if (a === "--token") {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      opts.token = argv[++i];
      continue;
    }
    if (a === "--cwd" || a === "--timeout" || a === "--linger" || a === "--grace") {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      const v = argv[++i];
      opts[a.slice(2)] = a === "--cwd" ? v : Number(v);
      if (a !== "--cwd" && !Number.isFinite(opts[a.slice(2)])) usage(`${a}: not a number: ${v}`);
      continue;
    }
    if (/^wss?:\/\//.test(a) && url === null) { url = a; continue; }
    usage(`unexpected argument ${JSON.stringify(a)}`);
  }
  if ((url === null) === (agentArgv === null)) usage("give either a ws:// URL or -- AGENT ARGS...");
  if (agentArgv !== null && agentArgv.length === 0) usage("no agent command after --");
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let stage = "start";
let cleanup = async () => {};
let finishing = false;
async function finish(code, err) {
  if (finishing) return;
  finishing = true;
  if (err) out({ type: "error", stage, message: String(err?.message ?? err) });
  const c0 = Date.now();
  try { await cleanup(); } catch (e) { process.stderr.write(`probe.mjs: cleanup: ${e}\n`); }
  out({ type: "done", cleanupMs: Date.now() - c0 });
  process.exitCode = code;
  // Flush stdout before exiting (a pipe write may still be pending).
  process.stdout.write("", () => process.exit(code));
}
setTimeout(() => finish(1, new Error(`timeout after ${opts.timeout} ms`)), opts.timeout).unref();
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(sig, () => finish(1, new Error(`got ${sig}`)));
}

// ---- transport: send(obj) and an onMessage(obj) callback ----
let send;
const pending = new Map(); // id -> {method, sent, resolve}

function onMessage(msg) {
  if (msg === null || typeof msg !== "object" || Array.isArray(msg)) {
    out({ type: "other", message: msg });
    return;
  }
  const hasId = Object.prototype.hasOwnProperty.call(msg, "id");
  if (typeof msg.method === "string") {
    if (!hasId) { out({ type: "notification", message: msg }); return; }
    out({ type: "request", message: msg });
    send({ jsonrpc: "2.0", id: msg.id, error: { code: -32601, message: "Method not found (probe)" } });
    return;
  }
  const p = hasId ? pending.get(msg.id) : undefined;
  if (!p) { out({ type: "other", message: msg }); return; }
  pending.delete(msg.id);
  out({ type: "response", method: p.method, ms: Date.now() - p.sent, message: msg });
  p.resolve(msg);
}

function onText(text) {
  let msg;
  try { msg = JSON.parse(text); } catch { out({ type: "nonjson", line: text }); return; }
  onMessage(msg);
}

let transportDown; // rejects when the transport ends before we are done
const down = new Promise((_, reject) => { transportDown = reject; });
down.catch(() => {});

if (url !== null) {
  stage = "connect";
  // A tenant's token rides in the subprotocol list, as a browser would send it.
  const protocols = opts.token ? ["acp", `acp.bearer.${opts.token}`] : ["acp"];
  const ws = new WebSocket(url, protocols, { handshakeTimeout: opts.timeout });
  send = (obj) => ws.send(JSON.stringify(obj));
  ws.on("message", (data, isBinary) => {
    if (isBinary) { out({ type: "nonjson", line: `<binary frame, ${data.length} bytes>` }); return; }
    onText(data.toString("utf8"));
  });
  ws.on("close", (code, reason) => {
    if (!finishing) out({ type: "close", code, reason: reason.toString() });
    transportDown(new Error(`websocket closed (${code} ${reason})`));
  });
  ws.on("error", (e) => transportDown(e));
  ws.on("unexpected-response", (req, res) => transportDown(new Error(`HTTP ${res.statusCode} on upgrade`)));
  cleanup = async () => {
    if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) {
      const closed = new Promise((r) => ws.once("close", r));
      if (ws.readyState === WebSocket.OPEN) ws.close(1000, "probe done"); else ws.terminate();
      await Promise.race([closed, sleep(2000)]);
      ws.terminate();
    }
  };
  await Promise.race([new Promise((r) => ws.once("open", r)), down]).catch((e) => finish(1, e));
  if (finishing) await new Promise(() => {});
  out({ type: "open", protocol: ws.protocol });
} else {
  stage = "spawn";
  const child = spawn(agentArgv[0], agentArgv.slice(1), {
    detached: true, // own process group: the agent and everything it starts are stopped together
    stdio: ["pipe", "pipe", "pipe"],
    cwd: opts.cwd,
  });
  let exited = null;
  const exitedP = new Promise((r) => child.once("exit", (code, signal) => { exited = { code, signal }; r(); }));
  child.once("exit", (code, signal) => {
    if (!finishing) out({ type: "exit", code, signal });
    transportDown(new Error(`agent exited (code ${code}, signal ${signal})`));
  });
  child.once("error", (e) => transportDown(e));
  child.stdin.on("error", () => {}); // EPIPE after the agent died: reported via "exit"
  send = (obj) => child.stdin.write(JSON.stringify(obj) + "\n");
  let buf = "";
  child.stdout.on("data", (d) => {
    buf += d.toString("utf8");
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).replace(/\r$/, "");
      buf = buf.slice(i + 1);
      if (line.trim() !== "") onText(line);
    }
  });
  let ebuf = "";
  child.stderr.on("data", (d) => {
    ebuf += d.toString("utf8");
    let i;
    while ((i = ebuf.indexOf("\n")) >= 0) {
      process.stderr.write(`[agent] ${ebuf.slice(0, i)}\n`);
      ebuf = ebuf.slice(i + 1);
    }
  });
  const groupAlive = () => { try { process.kill(-child.pid, 0); return true; } catch { return false; } };
  cleanup = async () => {
    if (!child.pid) return;
    // Agents differ: some exit on stdin EOF, some ignore it. Close stdin, then
    // SIGTERM the whole group, then SIGKILL whatever is left after the grace.
    child.stdin.end();
    try { process.kill(-child.pid, "SIGTERM"); } catch {}
    const deadline = Date.now() + opts.grace;
    while (Date.now() < deadline && (exited === null || groupAlive())) await sleep(25);
    if (exited === null || groupAlive()) {
      process.stderr.write(`probe.mjs: agent group ${child.pid} still alive ${opts.grace} ms after SIGTERM; SIGKILL\n`);
      try { process.kill(-child.pid, "SIGKILL"); } catch {}
      await Promise.race([exitedP, sleep(2000)]);
    }
  };
  if (child.pid === undefined) {
    await Promise.race([down, sleep(5000)]).catch((e) => finish(1, e));
    await new Promise(() => {});
  }
  out({ type: "spawn", pid: child.pid, argv: agentArgv });
}

function request(id, method, params) {
  stage = method;
  const answer = new Promise((resolve) => pending.set(id, { method, sent: Date.now(), resolve }));
  send({ jsonrpc: "2.0", id, method, params });
  return Promise.race([answer, down]);
}

try {
  await request(1, "initialize", {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: true, writeTextFile: true }, terminal: false },
    clientInfo: { name: "acpgate-interop-probe", version: "0" },
  });
  await request(2, "session/new", { cwd: opts.cwd, mcpServers: [] });
  stage = "linger";
  if (opts.linger > 0) await Promise.race([sleep(opts.linger), down]);
} catch (e) {
  await finish(1, e);
  await new Promise(() => {});
}
await finish(0);
