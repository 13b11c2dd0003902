#!/usr/bin/env node
// http-client.mjs: the official SDK's Streamable-HTTP client
// (@agentclientprotocol/sdk 2.4.0, experimental/http-client createHttpStream)
// against a gateway, with the SDK's client(). Driven by interop_test.go.
//
// Usage: node http-client.mjs [--timeout MS] [--token T] [--load SESSION_ID] URL CWD
//   Without --load: initialize, session/new, then prompts: "echo" through
//   _demo/echo, "read <CWD>/hello.txt" (fs/read_text_file answered by this
//   client), "permission" (allowed), and "slow" cancelled with
//   session/cancel. With --load: initialize and session/load of that id.
//
// stdout, one JSON object per line (each with "t"):
//   {"type":"initialize","result":{...}}
//   {"type":"session/new","sessionId":"..."} / {"type":"session/load","result":{...}}
//   {"type":"session/update","params":{...}}
//   {"type":"request","method":"...","params":{...}}
//   {"type":"echo","result":{...}}
//   {"type":"session/prompt","text":"...","result":{...}}
//   {"type":"error","stage":"...","error":{...}}   then exit 1
import { client } from "@agentclientprotocol/sdk";
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { readFile } from "node:fs/promises";

const t0 = Date.now();
const out = (o) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() - t0 }) + "\n");
let timeoutMs = 30000, token = null, load = null;
const pos = [];
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--timeout") timeoutMs = Number(argv[++i]);
    else if (argv[i] === "--token") token = argv[++i];
    else if (argv[i] === "--load") load = argv[++i];
    else pos.push(argv[i]);
  }
}
const [url, cwd] = pos;
if (!url || !cwd) { process.stderr.write("usage: node http-client.mjs [--timeout MS] [--token T] [--load SID] URL CWD\n"); process.exit(2); }
let stage = "connect";
const fail = (err) => {
  out({ type: "error", stage, error: { message: String(err?.message ?? err), code: err?.code, data: err?.data } });
  process.exit(1);
};
setTimeout(() => fail(new Error(`timeout after ${timeoutMs} ms`)), timeoutMs).unref();

const stream = createHttpStream(url, token ? { headers: { Authorization: `Bearer ${token}` } } : {});
const texts = new Map();
const updated = new Set(); // sessions with an update seen
try {
  await client()
    .onNotification("session/update", ({ params }) => {
      out({ type: "session/update", params });
      updated.add(params.sessionId);
      const u = params.update;
      if (u?.sessionUpdate === "agent_message_chunk" && u.content?.type === "text") {
        texts.set(params.sessionId, (texts.get(params.sessionId) ?? "") + u.content.text);
      }
    })
    .onRequest("session/request_permission", ({ params }) => {
      out({ type: "request", method: "session/request_permission", params });
      const allow = params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
      return { outcome: { outcome: "selected", optionId: allow.optionId } };
    })
    .onRequest("fs/read_text_file", async ({ params }) => {
      out({ type: "request", method: "fs/read_text_file", params });
      return { content: await readFile(params.path, "utf8") };
    })
    .connectWith(stream, async (agent) => {
      stage = "initialize";
      const init = await agent.request("initialize", { protocolVersion: 1, clientCapabilities: { fs: { readTextFile: true, writeTextFile: false } } });
      out({ type: "initialize", result: init });
      if (load) {
        stage = "session/load";
        const res = await agent.request("session/load", { sessionId: load, cwd, mcpServers: [] });
        // The replayed history comes on the session's stream, the answer on
        // the connection's: no order between them (as in the SDK's server).
        for (let i = 0; i < 150 && !updated.has(load); i++) await new Promise((r) => setTimeout(r, 20));
        out({ type: "session/load", result: res, text: texts.get(load) ?? "" });
        return;
      }
      stage = "session/new";
      const { sessionId } = await agent.request("session/new", { cwd, mcpServers: [] });
      out({ type: "session/new", sessionId });
      stage = "_demo/echo";
      out({ type: "echo", result: await agent.request("_demo/echo", { hello: "http" }) });
      const prompt = async (text) => {
        texts.set(sessionId, "");
        stage = `session/prompt ${text}`;
        const result = await agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] });
        out({ type: "session/prompt", prompt: text, text: texts.get(sessionId), result });
      };
      await prompt(`read ${cwd}/hello.txt`);
      await prompt("permission");
      // A slow turn, cancelled once it streams.
      texts.set(sessionId, "");
      stage = "session/prompt slow";
      const slow = agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "slow" }] });
      while (!(texts.get(sessionId) ?? "").includes("tick")) await new Promise((r) => setTimeout(r, 20));
      await agent.notify("session/cancel", { sessionId });
      out({ type: "session/prompt", prompt: "slow", text: texts.get(sessionId), result: await slow });
    });
} catch (err) {
  fail(err);
}
process.exit(0);
