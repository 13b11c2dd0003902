#!/usr/bin/env node
// v2-client.mjs: an ACP v2 client on the official SDK 2.4.0
// (@agentclientprotocol/sdk/experimental/v2/unstable), over the SDK's
// WebSocket transport (ws:// URL) or its Streamable HTTP one (http:// URL).
// It runs initialize (protocolVersion 2), session/new and one prompt, then
// waits for the turn's idle state_update, and prints what happened. Driven
// by v2turns_test.go.
//
// Usage:
//   node v2-client.mjs [--timeout MS] [--token T] [--v1 [--subagents]] URL CWD [PROMPT...]
//     URL       ws://HOST/acp or http://HOST/acp
//     CWD       cwd for session/new
//     PROMPT    prompt text (default "hello"), see v2-agent.mjs
//     --timeout overall limit in ms (default 30000)
//     --token   bearer token (WebSocket: subprotocol acp.bearer.T; HTTP:
//               the Authorization header)
//     --v1      speak ACP v1 instead (the SDK's v1 unstable client): the
//               prompt's answer ends the run, no idle line
//     --subagents  with --v1: offer clientCapabilities.subagents
//
// stdout, one JSON object a line: {"type":"initialize","result"},
// {"type":"session/new","result","sessionId"}, every session/update as
// {"type":"session/update","params"} and any other notification as
// {"type":"notification","method","params"} in arrival order, agent
// requests as {"type":"request","method","params","response"},
// {"type":"session/prompt","result"}, then {"type":"idle","params"} once
// the session's idle state_update after the prompt's answer has arrived;
// {"type":"error","stage","error"} then exit 1 on any failure. Exit 0 once
// idle.
import { client as clientV2 } from "@agentclientprotocol/sdk/experimental/v2/unstable";
import { client as clientV1 } from "@agentclientprotocol/sdk/unstable";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import WebSocket from "ws";
import { out, parseArgs, timeoutArg, run, exit, fail, failAfter, tapped } from "./sdk-run.mjs";

function usage(msg) {
  process.stderr.write(`v2-client.mjs: ${msg}\nusage: node v2-client.mjs [--timeout MS] [--token T] URL CWD [PROMPT...]\n`);
  process.exit(2);
}

let timeoutMs = 30000;
let token = "";
// --v1 and --subagents take no value: taken out before the others.
const argv = process.argv.slice(2);
const v1 = argv.includes("--v1");
const subagents = argv.includes("--subagents");
const pos = parseArgs(argv.filter((a) => a !== "--v1" && a !== "--subagents"), {
  "--timeout": (v) => {
    timeoutMs = timeoutArg(v, usage);
  },
  "--token": (v) => {
    token = v;
  },
});
const [url, cwd, ...words] = pos;
if (!url || !/^(wss?|https?):\/\//.test(url)) usage("URL missing or not ws://, wss://, http:// or https://");
if (!cwd) usage("CWD missing");
const promptText = words.length ? words.join(" ") : "hello";

failAfter(timeoutMs);

// idle resolves with the first idle state_update of the session once the
// prompt has been answered (armed).
let sessionId = "";
let armed = false;
let seenIdle = null;
let onIdle = () => {};
const idle = new Promise((resolve) => {
  onIdle = resolve;
});
const watch = (params) => {
  const u = params?.update;
  if (params?.sessionId === sessionId && u?.sessionUpdate === "state_update" && u.state === "idle") {
    seenIdle ??= params;
    if (armed) onIdle(seenIdle);
  }
};

const raw = /^wss?:/.test(url)
  ? createWebSocketStream(url, { WebSocket, protocols: token ? ["acp", `acp.bearer.${token}`] : ["acp"] })
  : createHttpStream(url, token ? { headers: { Authorization: `Bearer ${token}` } } : {});
const conn = tapped(raw, watch);

const app = (v1 ? clientV1 : clientV2)({ name: "acpgate-interop-v2-client" })
  .onNotification("*", () => {})
  .onRequest("session/request_permission", ({ params }) => {
    const opt = params.options.find((o) => o.kind.startsWith("allow")) ?? params.options[0];
    const response = { outcome: { outcome: "selected", optionId: opt.optionId } };
    out({ type: "request", method: "session/request_permission", params, response });
    return response;
  });

try {
  await app.connectWith(conn, async (agent) => {
    run.stage = "initialize";
    const info = { name: "acpgate-interop-v2-client", version: "0" };
    const init = await agent.request("initialize", v1
      ? { protocolVersion: 1, clientInfo: info, clientCapabilities: subagents ? { subagents: {} } : {} }
      : { protocolVersion: 2, info, capabilities: {} });
    out({ type: "initialize", result: init });
    run.stage = "session/new";
    const sess = await agent.request("session/new", { cwd, mcpServers: [] });
    sessionId = sess.sessionId;
    out({ type: "session/new", result: sess, sessionId });
    run.stage = "session/prompt";
    const res = await agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: promptText }] });
    out({ type: "session/prompt", result: res });
    if (v1) return; // the answer ends a v1 turn
    armed = true;
    if (seenIdle) onIdle(seenIdle);
    run.stage = "idle";
    out({ type: "idle", params: await idle });
  });
} catch (e) {
  fail(e);
}
run.stage = "close";
exit(0);
