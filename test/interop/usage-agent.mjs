#!/usr/bin/env node
// usage-agent.mjs: an ACP agent on the official SDK (@agentclientprotocol/sdk)
// that reports usage, for usage_test.go. Each prompt is answered with three
// chunks, two usage_update notifications (the session's cumulative cost
// after half the turn, then after all of it: 0.125 USD a turn) and a
// PromptResponse with usage (100 input, 20 output, 5 thought, 7 cached
// read, 3 cached write tokens). session/load replays the session's last
// usage_update. Sessions live in this process only.
//
// Usage: node usage-agent.mjs   (ACP on stdin/stdout)
import { Readable, Writable } from "node:stream";
import { randomUUID } from "node:crypto";
import { agent, ndJsonStream } from "@agentclientprotocol/sdk";

const turnCost = 0.125;
const turnUsage = { inputTokens: 100, outputTokens: 20, thoughtTokens: 5, cachedReadTokens: 7, cachedWriteTokens: 3, totalTokens: 135 };
const sessions = new Map(); // sessionId -> {cost}

const usageUpdate = (cost) => ({ sessionUpdate: "usage_update", used: 1000, size: 200000, cost: { amount: cost, currency: "USD" } });

const app = agent({ name: "usage-agent" })
  .onRequest("initialize", () => ({ protocolVersion: 1, agentCapabilities: { loadSession: true }, authMethods: [] }))
  .onRequest("session/new", () => {
    const sessionId = randomUUID();
    sessions.set(sessionId, { cost: 0 });
    return { sessionId };
  })
  .onRequest("session/load", async ({ params, client }) => {
    const s = sessions.get(params.sessionId);
    if (!s) throw new Error(`unknown session ${params.sessionId}`);
    await client.notify("session/update", { sessionId: params.sessionId, update: { sessionUpdate: "user_message_chunk", content: { type: "text", text: "earlier" } } });
    await client.notify("session/update", { sessionId: params.sessionId, update: usageUpdate(s.cost) });
    return {};
  })
  .onRequest("session/prompt", async ({ params, client }) => {
    const s = sessions.get(params.sessionId);
    if (!s) throw new Error(`unknown session ${params.sessionId}`);
    const send = (update) => client.notify("session/update", { sessionId: params.sessionId, update });
    await send({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "one " } });
    await send(usageUpdate(s.cost + turnCost / 2));
    await send({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "two " } });
    s.cost += turnCost;
    await send(usageUpdate(s.cost));
    await send({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "three" } });
    return { stopReason: "end_turn", usage: turnUsage };
  })
  .onNotification("session/cancel", () => {});

const conn = app.connect(ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
await conn.closed;
