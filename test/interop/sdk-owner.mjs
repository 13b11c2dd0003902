#!/usr/bin/env node
// sdk-owner.mjs: the official TypeScript SDK's client (@agentclientprotocol/sdk
// 2.4.0), unchanged, owning a session that another client attaches to. It
// connects over WebSocket (experimental/ws-client) or Streamable HTTP
// (experimental/http-client), creates a session and runs its prompts one
// after the other. Its session/request_permission handler waits a fixed time
// before it answers "allow", so that an attached client can answer first;
// it does not look at the request's AbortSignal (a client slow to notice a
// $/cancel_request), and only records whether it was aborted. Driven by
// attach_test.go.
//
// Usage:
//   node sdk-owner.mjs [--timeout MS] [--transport ws|http] [--permission-delay MS] URL CWD PROMPT...
//     URL        ws://HOST/acp (subprotocol "acp") or http://HOST/acp
//     CWD        cwd for session/new
//     PROMPT     one argument a turn, run in order (default: one turn "hello")
//     --permission-delay  how long the permission handler waits (default 2000)
//
// stdout, one JSON object per line (each with "t", ms since start):
//   {"type":"initialize","result":{...}}
//   {"type":"session/new","sessionId":"..."}
//   {"type":"prompt","prompt":"..."}                 a turn starts
//   {"type":"session/update","params":{...}}         every session/update, in arrival order
//   {"type":"notification","method":"...","params":{...}}   any other notification ($/cancel_request)
//   {"type":"request","method":"...","requestId":...,"params":{...}}   an agent->client request arrived
//   {"type":"answer","method":"...","requestId":...,"response":{...},"aborted":bool,"abortReason":{...}}
//                                                    our answer to it, and whether its signal was aborted
//   {"type":"session/prompt","prompt":"...","text":"...","result":{...}}   a turn ended
//   {"type":"console","level":"error"|"warn","args":[...]}   anything the SDK logged
//   {"type":"done"}                                  everything answered, about to close
//   {"type":"error","stage":"...","error":{...}}     then exit 1
// Exit status: 0 when every turn ended, 1 on any failure or the timeout, 2 on
// bad usage.
import { client, RequestError } from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import WebSocket from "ws"; // Node 20 has no global WebSocket
import { out, parseArgs, timeoutArg, run, exit, fail, failAfter, tapped, openSession } from "./sdk-run.mjs";

const usageLine = "usage: node sdk-owner.mjs [--timeout MS] [--transport ws|http] [--permission-delay MS] URL CWD PROMPT...";
function usage(msg) {
  process.stderr.write(`sdk-owner.mjs: ${msg}\n${usageLine}\n`);
  process.exit(2);
}

// The SDK reports protocol trouble (a response to an unknown request, a
// notification it failed to handle) with console.error: print it as a line
// of our own, so the test can tell.
const printable = (a) => (a instanceof Error ? { name: a.name, message: a.message, code: a.code } : a);
for (const level of ["error", "warn"]) {
  console[level] = (...args) => out({ type: "console", level, args: args.map(printable) });
}

let timeoutMs = 30000;
let transport = "ws";
let permissionDelay = 2000;
const pos = parseArgs(process.argv.slice(2), {
  "--timeout": (v) => {
    timeoutMs = timeoutArg(v, usage);
  },
  "--transport": (v) => {
    transport = v;
    if (!["ws", "http"].includes(transport)) usage("--transport must be ws or http");
  },
  "--permission-delay": (v) => {
    permissionDelay = Number(v);
    if (!Number.isFinite(permissionDelay) || permissionDelay < 0) usage("--permission-delay needs a number of ms");
  },
});
const [url, cwd, ...prompts] = pos;
if (transport === "ws" && !/^wss?:\/\//.test(url ?? "")) usage("URL missing or not ws:// / wss://");
if (transport === "http" && !/^https?:\/\//.test(url ?? "")) usage("URL missing or not http:// / https://");
if (!cwd) usage("CWD missing");
if (prompts.length === 0) prompts.push("hello");

failAfter(timeoutMs);

const stream = transport === "ws"
  ? createWebSocketStream(url, { WebSocket, protocols: ["acp"] })
  : createHttpStream(url);

// Notifications are printed from a tap on the inbound message stream, in
// exact arrival order, and the agent's text is gathered per turn there.
let text = "";
const conn = tapped(stream, (params) => {
  const u = params?.update;
  if (u?.sessionUpdate === "agent_message_chunk" && u.content?.type === "text") text += u.content.text;
});

const handlers = new Set(); // permission handlers still running
const app = client({ name: "acpgate-interop-sdk-owner" })
  // A notification handler must return undefined, or the SDK treats the
  // notification as unhandled. Printing happens in the tap above.
  .onNotification("*", () => {})
  .onRequest("session/request_permission", ({ params, requestId, signal }) => {
    out({ type: "request", method: "session/request_permission", requestId, params });
    const run = (async () => {
      await new Promise((r) => setTimeout(r, permissionDelay));
      const opt = params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
      const response = opt ? { outcome: { outcome: "selected", optionId: opt.optionId } } : { outcome: { outcome: "cancelled" } };
      const reason = signal.aborted ? printable(signal.reason) : undefined;
      out({ type: "answer", method: "session/request_permission", requestId, response, aborted: signal.aborted, abortReason: reason });
      return response;
    })();
    handlers.add(run);
    run.finally(() => handlers.delete(run)).catch(() => {});
    return run;
  })
  .onRequest("*", ({ method, params, requestId }) => {
    out({ type: "request", method, requestId, params, error: { message: "method not found" } });
    throw RequestError.methodNotFound(method);
  });

try {
  await app.connectWith(conn, async (agent) => {
    const sess = await openSession(agent, cwd,
      { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      { name: "acpgate-interop-sdk-owner", version: "1" });
    for (const p of prompts) {
      run.stage = `session/prompt ${p}`;
      text = "";
      out({ type: "prompt", prompt: p });
      const result = await agent.request("session/prompt", { sessionId: sess.sessionId, prompt: [{ type: "text", text: p }] });
      out({ type: "session/prompt", prompt: p, text, result });
    }
    // A permission handler may still be waiting (its request was answered
    // by another client): let it answer, and let that answer go out, before
    // the connection closes.
    run.stage = "drain";
    while (handlers.size > 0) await Promise.allSettled([...handlers]);
    await new Promise((r) => setTimeout(r, 300));
    out({ type: "done" });
  });
} catch (e) {
  fail(e);
}
run.stage = "close";
exit(0); // connectWith closed the connection when the callback returned
