#!/usr/bin/env node
// sdk-lastword.mjs: an application on the official TypeScript SDK's app
// API (@agentclientprotocol/sdk 2.4.0: client().connect(stream), a
// session from buildSession(cwd).start(), its prompt() and its update
// queue read with nextUpdate()), as a real client reads a turn. It sends
// one prompt, reads the session's updates until the turn's stop message,
// then closes the connection. Driven by lastword_test.go, which drains
// the gateway mid-turn: the stop message must still be read.
//
// Usage:
//   node sdk-lastword.mjs [--timeout MS] [--http] URL CWD PROMPT...
//     URL     ws://127.0.0.1:8080/acp, or http://… with --http (Streamable HTTP)
//
// stdout, one JSON object per line:
//   {"type":"streaming"}                       the first update of the turn was read
//   {"type":"stop","stopReason":"...","chunks":N}   the turn's answer was read
//   {"type":"error","stage":"...","error":{...}}    then exit 1
// Every line also has "t": milliseconds since the client started.
import { client } from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import WebSocket from "ws"; // Node 20 has no global WebSocket
import { out, parseArgs, timeoutArg, run, exit, fail, failAfter } from "./sdk-run.mjs";

function usage(msg) {
  process.stderr.write(`sdk-lastword.mjs: ${msg}\nusage: node sdk-lastword.mjs [--timeout MS] [--http] URL CWD PROMPT...\n`);
  process.exit(2);
}

let timeoutMs = 30000;
const argv = process.argv.slice(2);
const http = argv.includes("--http"); // a flag without a value
const [url, cwd, ...words] = parseArgs(argv.filter((a) => a !== "--http"), {
  "--timeout": (v) => {
    timeoutMs = timeoutArg(v, usage);
  },
});
if (!url || !(http ? /^https?:\/\//.test(url) : /^wss?:\/\//.test(url))) usage("URL missing or of the wrong scheme");
if (!cwd) usage("CWD missing");
if (!words.length) usage("PROMPT missing");

failAfter(timeoutMs);

const stream = http ? createHttpStream(url) : createWebSocketStream(url, { WebSocket, protocols: ["acp"] });
const conn = client({ name: "acpgate-interop-lastword" }).connect(stream);
try {
  run.stage = "initialize";
  await conn.agent.request("initialize", {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    clientInfo: { name: "acpgate-interop-lastword", version: "0" },
  });
  run.stage = "session/new";
  const session = await conn.agent.buildSession(cwd).start();
  run.stage = "session/prompt";
  session.prompt(words.join(" ")).catch(() => {}); // its end is read from the queue below
  run.stage = "updates";
  let chunks = 0;
  for (;;) {
    const msg = await session.nextUpdate();
    if (msg.kind === "stop") {
      out({ type: "stop", stopReason: msg.stopReason, chunks });
      break;
    }
    if (chunks++ === 0) out({ type: "streaming" });
  }
  session.dispose();
} catch (e) {
  fail(e);
}
run.stage = "close";
conn.close(); // right after the answer: the gateway must not wait for more
await conn.closed;
exit(0);
