#!/usr/bin/env node
// use-acp-client.mjs: an ACP client wired exactly as marimo's use-acp 0.2.6
// hook wires it (hooks/use-acp-client.js): the browser WebSocket that
// use-acp opens with no subprotocol, its createWebSocketReadableStream and
// createWebSocketWritableStream (components/streams.js), and the SDK it
// depends on (0.4.9) for ndJsonStream and ClientSideConnection. Its writer
// sends each newline-terminated JSON message as a binary frame. It runs
// initialize, session/new and one prompt. Driven by interop_test.go.
//
// Usage: node use-acp-client.mjs [--timeout MS] WS_URL CWD [PROMPT...]
//
// stdout, one JSON object per line (each with "t", ms since start):
//   {"type":"initialize","result":{...}}
//   {"type":"session/new","result":{...},"sessionId":"..."}
//   {"type":"session/update","params":{...}}
//   {"type":"request","method":"...","params":{...},"response":{...}}
//   {"type":"session/prompt","result":{...}}
//   {"type":"error","stage":"...","error":{...}}   then exit 1
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import WebSocket from "ws"; // Node 20 has no global WebSocket; ws has the browser API

const t0 = Date.now();
const out = (o) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() - t0 }) + "\n");
function usage(msg) {
  process.stderr.write(`use-acp-client.mjs: ${msg}\nusage: node use-acp-client.mjs [--timeout MS] WS_URL CWD [PROMPT...]\n`);
  process.exit(2);
}
let timeoutMs = 30000;
const pos = [];
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--timeout") {
      timeoutMs = Number(argv[++i]);
      if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) usage("--timeout needs a positive number of ms");
    } else pos.push(argv[i]);
  }
}
if (pos.length < 2) usage("need WS_URL and CWD");
const [url, cwd, ...words] = pos;
const promptText = words.length ? words.join(" ") : "hello";

// use-acp's own modules, by file: its package exports only the React hooks.
const require = createRequire(import.meta.url);
const useAcpDir = dirname(require.resolve("use-acp/package.json"));
const { createWebSocketReadableStream, createWebSocketWritableStream } =
  await import(pathToFileURL(join(useAcpDir, "dist", "components", "streams.js")).href);
// The SDK use-acp resolves (its own dependency, not the test's newer one).
const sdkRequire = createRequire(join(useAcpDir, "dist", "hooks", "use-acp-client.js"));
const sdkEntry = sdkRequire.resolve("@agentclientprotocol/sdk");
const { ClientSideConnection, ndJsonStream } = await import(pathToFileURL(sdkEntry).href);
const sdkVersion = sdkRequire("@agentclientprotocol/sdk/package.json").version;

globalThis.WebSocket = WebSocket; // what streams.js checks readyState against
let stage = "connect";
const fail = (err) => {
  out({ type: "error", stage, error: { message: String(err?.message ?? err), code: err?.code, data: err?.data } });
  process.exit(1);
};
setTimeout(() => fail(new Error(`timeout after ${timeoutMs} ms`)), timeoutMs).unref();

const ws = new WebSocket(url); // as use-acp: no subprotocol, no headers
await new Promise((resolve, reject) => {
  ws.onopen = resolve;
  ws.onerror = (e) => reject(new Error(`websocket error: ${e.message ?? e}`));
}).catch(fail);
const readable = createWebSocketReadableStream(ws);
const writable = createWebSocketWritableStream(ws);
out({ type: "open", protocol: ws.protocol, sdk: sdkVersion });

const conn = new ClientSideConnection(() => ({
  async requestPermission(params) {
    const allow = params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
    const response = { outcome: { outcome: "selected", optionId: allow.optionId } };
    out({ type: "request", method: "session/request_permission", params, response });
    return response;
  },
  async sessionUpdate(params) {
    out({ type: "session/update", params });
  },
  async readTextFile(params) {
    out({ type: "request", method: "fs/read_text_file", params, error: { code: -32601 } });
    throw new Error("not supported");
  },
  async writeTextFile(params) {
    out({ type: "request", method: "fs/write_text_file", params, error: { code: -32601 } });
    throw new Error("not supported");
  },
}), ndJsonStream(writable, readable));

try {
  stage = "initialize";
  const init = await conn.initialize({ protocolVersion: 1, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false } } });
  out({ type: "initialize", result: init });
  stage = "session/new";
  const sn = await conn.newSession({ cwd, mcpServers: [] });
  out({ type: "session/new", result: sn, sessionId: sn.sessionId });
  stage = "session/prompt";
  const pr = await conn.prompt({ sessionId: sn.sessionId, prompt: [{ type: "text", text: promptText }] });
  out({ type: "session/prompt", result: pr });
} catch (err) {
  fail(err);
}
ws.close(1000);
process.exit(0);
