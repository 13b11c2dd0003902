#!/usr/bin/env node
// sdk-client.mjs: an ACP client built on the official TypeScript SDK
// (@agentclientprotocol/sdk) and its experimental WebSocket transport. It
// connects to a gateway, runs initialize, session/new and one prompt, and
// prints what happened. Driven by interop_test.go.
//
// Usage:
//   node sdk-client.mjs [--timeout MS] [--permission allow|reject|cancel] WS_URL CWD [PROMPT...]
//     WS_URL   e.g. ws://127.0.0.1:8080/acp (subprotocol "acp" is offered)
//     CWD      cwd for session/new
//     PROMPT   prompt text (default "hello"); several words are joined by spaces
//     --timeout     overall limit in ms (default 30000)
//     --permission  how session/request_permission is answered (default allow)
//
// stdout, one JSON object per line, in this order:
//   {"type":"initialize","result":{...}}
//   {"type":"session/new","result":{...},"sessionId":"..."}
//   {"type":"session/update","params":{...}}       every session/update, in arrival order
//   {"type":"notification","method":"...","params":{...}}   any other notification
//   {"type":"request","method":"...","params":{...},"response":{...}}
//                                                  an agent->client request and our answer
//                                                  ("error" instead of "response" if we failed it)
//   {"type":"session/prompt","result":{...}}
//   {"type":"error","stage":"...","error":{...}}   then exit 1
// Every line also has "t": milliseconds since the client started.
// Exit status: 0 when the prompt was answered, 1 on any failure or the
// timeout, 2 on bad usage.
import { client, RequestError } from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import WebSocket from "ws"; // Node 20 has no global WebSocket
import { readFile, writeFile } from "node:fs/promises";

const t0 = Date.now();
const out = (o) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() - t0 }) + "\n");
function usage(msg) {
  process.stderr.write(`sdk-client.mjs: ${msg}\nusage: node sdk-client.mjs [--timeout MS] [--permission allow|reject|cancel] WS_URL CWD [PROMPT...]\n`);
  process.exit(2);
}

let timeoutMs = 30000;
let permission = "allow";
const pos = [];
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--timeout") {
      timeoutMs = Number(argv[++i]);
      if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) usage("--timeout needs a positive number of ms");
    } else if (a === "--permission") {
      permission = argv[++i];
      if (!["allow", "reject", "cancel"].includes(permission)) usage("--permission must be allow, reject or cancel");
    } else if (a === "--") {
      pos.push(...argv.slice(i + 1));
      break;
    } else {
      pos.push(a);
    }
  }
}
const [url, cwd, ...words] = pos;
if (!url || !/^wss?:\/\//.test(url)) usage("WS_URL missing or not ws:// / wss://");
if (!cwd) usage("CWD missing");
const promptText = words.length ? words.join(" ") : "hello";

let stage = "connect";
let exiting = false;
function exit(code) {
  if (exiting) return;
  exiting = true;
  process.stdout.write("", () => process.exit(code)); // flush stdout first
}
function fail(error) {
  if (exiting) return;
  const e = error instanceof Error || (error && typeof error === "object")
    ? { name: error.name, message: error.message, code: error.code, data: error.data }
    : { message: String(error) };
  out({ type: "error", stage, error: e });
  exit(1);
}
setTimeout(() => fail(new Error(`timeout after ${timeoutMs} ms`)), timeoutMs).unref();
process.on("unhandledRejection", (e) => fail(e));

const stream = createWebSocketStream(url, { WebSocket, protocols: ["acp"] });

// Notifications are printed from a tap on the inbound message stream, so they
// appear in exact arrival order. (SDK notification handlers run
// asynchronously and may finish after a later response has resolved its
// request.)
const tap = new TransformStream({
  transform(msg, controller) {
    if (msg && typeof msg === "object" && typeof msg.method === "string" && !("id" in msg)) {
      out(msg.method === "session/update"
        ? { type: "session/update", params: msg.params }
        : { type: "notification", method: msg.method, params: msg.params });
    }
    controller.enqueue(msg);
  },
});
const conn = { readable: stream.readable.pipeThrough(tap), writable: stream.writable };

// Wraps an agent->client request handler so that every call is printed with
// its answer (or the error we answered with).
const logged = (method, handler, show = (p) => p) => async ({ params }) => {
  try {
    const response = await handler(params);
    out({ type: "request", method, params: show(params), response });
    return response;
  } catch (e) {
    out({ type: "request", method, params: show(params), error: { message: e?.message, code: e?.code } });
    throw e;
  }
};

const app = client({ name: "acpgate-interop-sdk-client" })
  // A notification handler must return undefined, or the SDK treats the
  // notification as unhandled. Printing happens in the tap above.
  .onNotification("*", () => {})
  .onRequest("session/request_permission", logged("session/request_permission", (params) => {
    if (permission === "cancel") return { outcome: { outcome: "cancelled" } };
    const opt = params.options.find((o) => o.kind.startsWith(permission)) ?? params.options[0];
    return opt ? { outcome: { outcome: "selected", optionId: opt.optionId } } : { outcome: { outcome: "cancelled" } };
  }))
  .onRequest("fs/read_text_file", logged("fs/read_text_file", async (params) => {
    let content = await readFile(params.path, "utf8");
    if (params.line != null || params.limit != null) {
      const lines = content.split("\n");
      const start = Math.max((params.line ?? 1) - 1, 0);
      content = lines.slice(start, params.limit != null ? start + params.limit : undefined).join("\n");
    }
    return { content };
  }))
  .onRequest("fs/write_text_file", logged("fs/write_text_file", async (params) => {
    await writeFile(params.path, params.content, "utf8");
    return {};
  }, (p) => ({ ...p, content: `<${p.content.length} chars>` })))
  .onRequest("*", ({ method, params }) => {
    out({ type: "request", method, params, error: { message: "method not found" } });
    throw RequestError.methodNotFound(method);
  });

try {
  await app.connectWith(conn, async (agent) => {
    stage = "initialize";
    const init = await agent.request("initialize", {
      protocolVersion: 1,
      clientCapabilities: { fs: { readTextFile: true, writeTextFile: true }, terminal: false },
      clientInfo: { name: "acpgate-interop-sdk-client", version: "0" },
    });
    out({ type: "initialize", result: init });
    stage = "session/new";
    const sess = await agent.request("session/new", { cwd, mcpServers: [] });
    out({ type: "session/new", result: sess, sessionId: sess.sessionId });
    if (typeof sess.sessionId !== "string" || sess.sessionId === "") throw new Error("session/new result has no sessionId");
    stage = "session/prompt";
    const res = await agent.request("session/prompt", {
      sessionId: sess.sessionId,
      prompt: [{ type: "text", text: promptText }],
    });
    out({ type: "session/prompt", result: res });
  });
} catch (e) {
  fail(e);
}
stage = "close";
exit(0); // connectWith closed the WebSocket when the callback returned
