#!/usr/bin/env node
// http-client.mjs: the official SDK's Streamable-HTTP client
// (createHttpStream) through the balancer, with a MemoryAcpCookieStore that
// keeps the affinity cookie. Driven by scale_test.go. It uses the SDK that
// test/interop installs (npm ci there): no package of its own.
//
// Usage: node http-client.mjs --url URL --token T --cwd DIR --name NAME
//                             [--prompt TEXT] [--cookie NAME=VALUE] [--no-cookies]
//                             [--permission OPTION_ID] [--timeout MS]
//   initialize, session/new, one prompt (an echo), then the connection ends
//   (DELETE). --cookie: start with that cookie in the store. --no-cookies:
//   the SDK neither keeps nor sends cookies. --permission: the agent's
//   session/request_permission is answered with that option (without it,
//   such a request fails the run).
//
// stdout, one JSON object per line:
//   {"type":"http","method":"POST","status":200,"sentCookie":"...","setCookie":"...","connectionId":"..."}
//   {"type":"initialize"} {"type":"session/new","sessionId":"..."}
//   {"type":"permission","toolCallId":"...","optionId":"..."}   (each request answered)
//   {"type":"session/prompt","text":"...","result":{...}}
//   {"type":"done","cookie":"ACPGATE_AFFINITY=a"}
//   {"type":"error","stage":"...","error":{...}}   then exit 1
const sdk = new URL("../interop/node_modules/@agentclientprotocol/sdk/", import.meta.url);
const { client } = await import(new URL("dist/v1/stable/acp.js", sdk));
const { createHttpStream, MemoryAcpCookieStore } = await import(new URL("dist/transports/http-stream.js", sdk));

const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const opt = { timeout: 30000, prompt: "hello over Streamable HTTP", cookies: true };
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--no-cookies") opt.cookies = false;
    else if (a.startsWith("--")) opt[a.slice(2)] = argv[++i];
  }
}
if (!opt.url || !opt.token || !opt.cwd || !opt.name) {
  process.stderr.write("usage: node http-client.mjs --url URL --token T --cwd DIR --name NAME [--prompt TEXT] [--cookie NAME=VALUE] [--no-cookies] [--permission OPTION_ID] [--timeout MS]\n");
  process.exit(2);
}
let stage = "connect";
const fail = (err) => {
  out({ type: "error", stage, error: { message: String(err?.message ?? err), code: err?.code, data: err?.data } });
  process.exit(1);
};
setTimeout(() => fail(new Error(`timeout after ${opt.timeout} ms`)), Number(opt.timeout)).unref();

// Every request and its answer, as the balancer saw them from here.
const inflight = new Set();
const tracedFetch = (input, init) => {
  const p = traced(input, init);
  inflight.add(p);
  p.finally(() => inflight.delete(p)).catch(() => {});
  return p;
};
const traced = async (input, init) => {
  const res = await fetch(input, init);
  const h = new Headers(init?.headers);
  out({
    type: "http", method: init?.method ?? "GET", status: res.status,
    sentCookie: h.get("cookie") ?? "", setCookie: res.headers.getSetCookie().join("; "),
    connectionId: res.headers.get("acp-connection-id") ?? h.get("acp-connection-id") ?? "",
  });
  return res;
};

const cookieStore = new MemoryAcpCookieStore();
// --cookie NAME=VALUE: a client that comes back with the cookie it had.
if (opt.cookie) cookieStore.store(new Headers({ "Set-Cookie": opt.cookie }));
const stream = createHttpStream(opt.url, {
  fetch: tracedFetch,
  headers: { Authorization: `Bearer ${opt.token}`, "X-Scale-Client": opt.name },
  ...(opt.cookies ? { cookieStore } : { cookies: "omit" }),
});
let text = "";
try {
  await client()
    .onNotification("session/update", ({ params }) => {
      const u = params.update;
      if (u?.sessionUpdate === "agent_message_chunk" && u.content?.type === "text") text += u.content.text;
    })
    .onRequest("session/request_permission", ({ params }) => {
      if (!opt.permission) throw new Error("session/request_permission without --permission");
      out({ type: "permission", toolCallId: params.toolCall?.toolCallId ?? "", optionId: opt.permission });
      return { outcome: { outcome: "selected", optionId: opt.permission } };
    })
    .connectWith(stream, async (agent) => {
      stage = "initialize";
      await agent.request("initialize", { protocolVersion: 1, clientCapabilities: {} });
      out({ type: "initialize" });
      stage = "session/new";
      const { sessionId } = await agent.request("session/new", { cwd: opt.cwd, mcpServers: [] });
      out({ type: "session/new", sessionId });
      stage = "session/prompt";
      const result = await agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: opt.prompt }] });
      out({ type: "session/prompt", text, result });
    });
} catch (err) {
  fail(err);
}
// The SDK ends the connection (DELETE) without waiting for it: wait, so
// that the gateway sees a clean end and the trace is whole.
for (let i = 0; i < 100 && inflight.size > 0; i++) {
  await Promise.race([Promise.allSettled([...inflight]), new Promise((r) => setTimeout(r, 50))]);
}
out({ type: "done", cookie: cookieStore.cookieHeader() ?? "" });
process.exit(0);
