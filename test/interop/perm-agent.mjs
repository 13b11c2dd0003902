#!/usr/bin/env node
// perm-agent.mjs: an ACP agent on the official SDK (@agentclientprotocol/sdk)
// that asks for permission, for permrules_test.go. Each prompt's text is a
// JSON tool call ({"kind", "title", "paths": [...]}, paths relative to the
// session's cwd unless absolute); the agent reports it (tool_call), sends
// session/request_permission with it and the four ACP options (allow_once
// "yes", allow_always "always", reject_once "no", reject_always "never"),
// then answers with one text chunk: "outcome: selected <optionId>" or
// "outcome: cancelled", and ends the turn.
//
// Usage: node perm-agent.mjs   (ACP on stdin/stdout)
import { Readable, Writable } from "node:stream";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { agent, ndJsonStream } from "@agentclientprotocol/sdk";

const sessions = new Map(); // sessionId -> {cwd, calls}
const options = [
  { optionId: "yes", name: "Allow", kind: "allow_once" },
  { optionId: "always", name: "Always allow", kind: "allow_always" },
  { optionId: "no", name: "Reject", kind: "reject_once" },
  { optionId: "never", name: "Never", kind: "reject_always" },
];

const app = agent({ name: "perm-agent" })
  .onRequest("initialize", () => ({ protocolVersion: 1, agentCapabilities: {}, authMethods: [] }))
  .onRequest("session/new", ({ params }) => {
    const sessionId = randomUUID();
    sessions.set(sessionId, { cwd: params.cwd, calls: 0 });
    return { sessionId };
  })
  .onRequest("session/prompt", async ({ params, client }) => {
    const s = sessions.get(params.sessionId);
    if (!s) throw new Error(`unknown session ${params.sessionId}`);
    const text = params.prompt.filter((b) => b.type === "text").map((b) => b.text).join("");
    const call = JSON.parse(text);
    const toolCall = { toolCallId: `call-${++s.calls}`, title: call.title, kind: call.kind, status: "pending" };
    if (call.paths) toolCall.locations = call.paths.map((p) => ({ path: path.resolve(s.cwd, p) }));
    const send = (update) => client.notify("session/update", { sessionId: params.sessionId, update });
    await send({ sessionUpdate: "tool_call", ...toolCall });
    const res = await client.request("session/request_permission", { sessionId: params.sessionId, toolCall, options });
    const o = res.outcome;
    const said = o.outcome === "selected" ? `outcome: selected ${o.optionId}` : `outcome: ${o.outcome}`;
    await send({ sessionUpdate: "tool_call_update", toolCallId: toolCall.toolCallId, status: o.optionId === "yes" || o.optionId === "always" ? "completed" : "failed" });
    await send({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: said } });
    return { stopReason: "end_turn" };
  })
  .onNotification("session/cancel", () => {});

const conn = app.connect(ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
await conn.closed;
