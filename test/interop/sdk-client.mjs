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
import { out, parseArgs, timeoutArg, run, exit, fail, failAfter, tapped, openSession } from "./sdk-run.mjs";

function usage(msg) {
  process.stderr.write(`sdk-client.mjs: ${msg}\nusage: node sdk-client.mjs [--timeout MS] [--permission allow|reject|cancel] WS_URL CWD [PROMPT...]\n`);
  process.exit(2);
}

let timeoutMs = 30000;
let permission = "allow";
const pos = parseArgs(process.argv.slice(2), {
  "--timeout": (v) => {
    timeoutMs = timeoutArg(v, usage);
  },
  "--permission": (v) => {
    permission = v;
    if (!["allow", "reject", "cancel"].includes(permission)) usage("--permission must be allow, reject or cancel");
  },
});
const [url, cwd, ...words] = pos;
if (!url || !/^wss?:\/\//.test(url)) usage("WS_URL missing or not ws:// / wss://");
if (!cwd) usage("CWD missing");
const promptText = words.length ? words.join(" ") : "hello";

failAfter(timeoutMs);

// Notifications are printed from a tap on the inbound message stream, so they
// appear in exact arrival order.
const conn = tapped(createWebSocketStream(url, { WebSocket, protocols: ["acp"] }));

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
    const sess = await openSession(agent, cwd,
      { fs: { readTextFile: true, writeTextFile: true }, terminal: false },
      { name: "acpgate-interop-sdk-client", version: "0" });
    run.stage = "session/prompt";
    const res = await agent.request("session/prompt", {
      sessionId: sess.sessionId,
      prompt: [{ type: "text", text: promptText }],
    });
    out({ type: "session/prompt", result: res });
  });
} catch (e) {
  fail(e);
}
run.stage = "close";
exit(0); // connectWith closed the WebSocket when the callback returned
