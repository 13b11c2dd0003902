#!/usr/bin/env node
// v2-agent.mjs: an ACP agent on the official SDK 2.4.0 that serves v1 and v2
// from one process (agentProtocolRouter), for the v2 tests (v2turns_test.go).
// What a prompt does is chosen by its text:
//
//   ticks N [COST]   N agent_message_chunk ticks, 20 ms apart, each followed
//                    by a usage_update whose cumulative cost grows by COST
//                    USD (default 0); the turn ends end_turn with usage
//                    {inputTokens:10·N, outputTokens:N, totalTokens:11·N}
//   long N           N ticks, 100 ms apart (a turn a drain or a budget
//                    meets mid-way)
//   subagent         the turn spawns a child session: subagent_update on
//                    the parent, then three updates of the child's own (v2:
//                    state running, a chunk, state idle; v1: three chunks);
//                    the parent's idle lists the child in background[]. A
//                    v1 process spawns none unless initialize offered
//                    clientCapabilities.subagents (it says "no subagents")
//   subagent!        the same, in v1 even without the capability (an agent
//                    that ignores it)
//   subagent N       the same, then N parent ticks 100 ms apart
//   subagent-permission  a child ("asking child") that says "child asks",
//                    sends session/request_permission in its own session
//                    (toolCallId child-call-1), says "child permission
//                    <optionId>", and is reported idle by a subagent_update
//                    (v1 only with the capability, as for subagent)
//   permission       session/request_permission to the client (v2: the
//                    turn is requires_action while it waits), then one tick
//   anything else    one tick
//
// v1: the PromptResponse ends the turn ({stopReason, usage}). v2: the answer
// is {messageId}; the turn is a state_update running, the ticks, and a
// state_update idle with stopReason and usage. session/cancel stops a turn
// between ticks: stopReason "cancelled". Each session remembers its updates;
// a v2 session/resume with replayFrom replays them, each session's (the
// parent's, then each child's) followed by its replay_complete, then sends
// the parent's current idle state. Sessions live in this process only.
//
// A v2 prompt's idempotencyKey (which the SDK's schema drops) is read from
// the raw line on stdin before the SDK parses it: a prompt whose key the
// session has seen is answered with the first one's messageId and runs no
// turn; a new key's turn begins with the chunk "idempotencyKey KEY". A
// session/resume's replayFrom is read from the raw line too: a replayFrom
// other than {type:"start"} replays nothing and sends the chunk
// "replayFrom RAW", RAW its bytes exactly as the agent read them.
//
// Usage: node v2-agent.mjs   (ACP on stdin/stdout)
import { Readable, Transform, Writable } from "node:stream";
import { randomUUID } from "node:crypto";
import { agent as agentV1 } from "@agentclientprotocol/sdk/unstable";
import { agent as agentV2, agentProtocolRouter, ndJsonStream } from "@agentclientprotocol/sdk/experimental/v2/unstable";

const sessions = new Map(); // sessionId -> {cost, cancelled, history: [update], children: [id], keys: Map(key -> messageId)}
const promptKeys = new Map(); // sessionId -> [idempotencyKey | undefined], one per prompt read and not yet handled
const resumeCursors = new Map(); // sessionId -> [raw replayFrom text | undefined], one per session/resume read and not yet handled

// rawMember is the text of the value of member name of the top-level
// object of params inside line (a JSON-RPC message), as it was written:
// undefined if there is none. A scan of strings and nesting, enough for a
// well-formed line.
function rawMember(line, name) {
  const at = line.indexOf('"params"');
  if (at < 0) return undefined;
  let depth = 0;
  for (let i = line.indexOf("{", at); i >= 0 && i < line.length; i++) {
    const ch = line[i];
    if (ch === '"') {
      let j = i + 1;
      while (line[j] !== '"') j += line[j] === "\\" ? 2 : 1;
      const key = line.slice(i, j + 1);
      if (depth === 1 && JSON.parse(key) === name && /^\s*:/.test(line.slice(j + 1))) {
        let k = line.indexOf(":", j) + 1;
        while (/\s/.test(line[k])) k++;
        let d = 0;
        for (let e = k; e < line.length; e++) {
          const c = line[e];
          if (c === '"') {
            e++;
            while (line[e] !== '"') e += line[e] === "\\" ? 2 : 1;
          } else if (c === "{" || c === "[") d++;
          else if (c === "}" || c === "]") d--;
          if (d === 0 && (c === '"' || c === "}" || c === "]" || /[,}\s]/.test(line[e + 1] ?? "}"))) return line.slice(k, e + 1);
        }
        return undefined;
      }
      i = j;
    } else if (ch === "{" || ch === "[") depth++;
    else if (ch === "}" || ch === "]") {
      depth--;
      if (depth === 0) return undefined;
    }
  }
  return undefined;
}
let v1Subagents = false; // the v1 initialize offered clientCapabilities.subagents
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function newSession() {
  const sessionId = randomUUID();
  sessions.set(sessionId, { cost: 0, cancelled: false, history: [], children: [], keys: new Map() });
  return sessionId;
}

function scenario(params) {
  const text = (params.prompt ?? []).filter((b) => b.type === "text").map((b) => b.text).join(" ").trim();
  const [name, n, cost] = text.split(/\s+/);
  return { name, n: Math.max(1, Number(n) || 1), counted: Number(n) > 0, cost: Number(cost) || 0 };
}

// turn runs one prompt's work on session sid: send(sid, update) sends a
// session/update (and records it), request asks the client. It returns the
// stop reason and usage.
async function turn(v2, sid, params, send, request) {
  const s = sessions.get(sid);
  s.cancelled = false;
  const sc = scenario(params);
  const chunk = (text) => ({ sessionUpdate: "agent_message_chunk", content: { type: "text", text } });
  const usage = { inputTokens: 10 * sc.n, outputTokens: sc.n, totalTokens: 11 * sc.n };
  let background;
  switch (sc.name) {
    case "ticks":
    case "long":
      for (let i = 1; i <= sc.n; i++) {
        await sleep(sc.name === "long" ? 100 : 20);
        if (s.cancelled) return { stopReason: "cancelled", usage };
        await send(sid, chunk(`tick ${i} `));
        if (sc.cost > 0) {
          s.cost += sc.cost;
          await send(sid, { sessionUpdate: "usage_update", used: 100 * i, size: 200000, cost: { amount: s.cost, currency: "USD" } });
        }
      }
      break;
    case "subagent":
    case "subagent!": {
      if (!v2 && !v1Subagents && sc.name === "subagent") {
        await send(sid, chunk("no subagents"));
        break;
      }
      const child = newSession();
      s.children.push(child);
      const title = "child of " + sid.slice(0, 8);
      await send(sid, { sessionUpdate: "subagent_update", sessionId: child, title, state: { state: "running" } });
      await send(child, v2 ? { sessionUpdate: "state_update", state: "running" } : chunk("child starts"));
      await send(child, chunk("child says " + child));
      await send(child, v2 ? { sessionUpdate: "state_update", state: "idle", stopReason: "end_turn" } : chunk("child ends"));
      if (sc.counted) {
        for (let i = 1; i <= sc.n; i++) {
          await sleep(100);
          if (s.cancelled) return { stopReason: "cancelled", usage, background: [{ type: "subagent", sessionId: child }] };
          await send(sid, chunk(`tick ${i} `));
        }
      }
      await send(sid, chunk("parent done"));
      background = [{ type: "subagent", sessionId: child }];
      break;
    }
    case "subagent-permission": {
      if (!v2 && !v1Subagents) {
        await send(sid, chunk("no subagents"));
        break;
      }
      const child = newSession();
      s.children.push(child);
      await send(sid, { sessionUpdate: "subagent_update", sessionId: child, title: "asking child", state: { state: "running" } });
      await send(child, chunk("child asks"));
      if (v2) await send(child, { sessionUpdate: "state_update", state: "requires_action" });
      const res = await request("session/request_permission", {
        sessionId: child,
        toolCall: { toolCallId: "child-call-1", title: "touch a file in the child", kind: "edit", status: "pending" },
        options: [{ optionId: "allow", name: "Allow", kind: "allow_once" }, { optionId: "reject", name: "Reject", kind: "reject_once" }],
      });
      await send(child, chunk("child permission " + (res?.outcome?.optionId ?? res?.outcome?.outcome)));
      if (v2) await send(child, { sessionUpdate: "state_update", state: "idle", stopReason: "end_turn" });
      await send(sid, { sessionUpdate: "subagent_update", sessionId: child, state: { state: "idle", stopReason: "end_turn" } });
      await send(sid, chunk("parent done"));
      background = [{ type: "subagent", sessionId: child }];
      break;
    }
    case "permission": {
      if (v2) await send(sid, { sessionUpdate: "state_update", state: "requires_action" });
      const res = await request("session/request_permission", {
        sessionId: sid,
        toolCall: { toolCallId: "call-1", title: "touch a file", kind: "edit", status: "pending" },
        options: [{ optionId: "allow", name: "Allow", kind: "allow_once" }, { optionId: "reject", name: "Reject", kind: "reject_once" }],
      });
      if (v2) await send(sid, { sessionUpdate: "state_update", state: "running" });
      await send(sid, chunk("permission " + (res?.outcome?.optionId ?? res?.outcome?.outcome)));
      break;
    }
    default:
      await send(sid, chunk("tick 1"));
  }
  return { stopReason: s.cancelled ? "cancelled" : "end_turn", usage, background };
}

const recorder = (client) => async (sid, update) => {
  sessions.get(sid)?.history.push(update);
  await client.notify("session/update", { sessionId: sid, update });
};

const v1 = agentV1({ name: "v2-agent" })
  .onRequest("initialize", ({ params }) => {
    v1Subagents = params.clientCapabilities?.subagents != null;
    return { protocolVersion: 1, agentCapabilities: { loadSession: false }, authMethods: [] };
  })
  .onRequest("session/new", () => ({ sessionId: newSession() }))
  .onRequest("session/prompt", async ({ params, client }) => {
    promptKeys.get(params.sessionId)?.shift(); // v1 has no idempotencyKey
    if (!sessions.has(params.sessionId)) throw new Error(`unknown session ${params.sessionId}`);
    const send = recorder(client);
    const { stopReason, usage } = await turn(false, params.sessionId, params, send, (m, p) => client.request(m, p));
    return { stopReason, usage };
  })
  .onNotification("session/cancel", ({ params }) => {
    const s = sessions.get(params.sessionId);
    if (s) s.cancelled = true;
  });

const v2 = agentV2({ name: "v2-agent" })
  .onRequest("initialize", () => ({
    protocolVersion: 2,
    info: { name: "v2-agent", version: "1.0.0" },
    capabilities: { session: { resume: {}, close: {}, status: {} } },
    authMethods: [],
  }))
  .onRequest("session/new", () => ({ sessionId: newSession() }))
  .onRequest("session/prompt", ({ params, client }) => {
    const sid = params.sessionId;
    if (!sessions.has(sid)) throw new Error(`unknown session ${sid}`);
    const send = recorder(client);
    const key = promptKeys.get(sid)?.shift();
    const s = sessions.get(sid);
    if (key !== undefined && s.keys.has(key)) return { messageId: s.keys.get(key) }; // a retry: it ran once
    const messageId = params.messageId ?? randomUUID();
    if (key !== undefined) s.keys.set(key, messageId);
    // The answer goes first; the turn's progress follows it.
    setTimeout(async () => {
      try {
        await send(sid, { sessionUpdate: "state_update", state: "running" });
        if (key !== undefined) await send(sid, { sessionUpdate: "agent_message_chunk", content: { type: "text", text: `idempotencyKey ${key}` } });
        const { stopReason, usage, background } = await turn(true, sid, params, send, (m, p) => client.request(m, p));
        const idle = { sessionUpdate: "state_update", state: "idle", stopReason, usage };
        if (background) idle.background = background;
        await send(sid, idle);
      } catch (e) {
        await client.notify("session/update", { sessionId: sid, update: { sessionUpdate: "state_update", state: "idle", stopReason: "error", error: { code: -32603, message: String(e?.message ?? e) } } });
      }
    }, 5);
    return { messageId };
  })
  .onRequest("session/resume", async ({ params, client }) => {
    const raw = resumeCursors.get(params.sessionId)?.shift();
    const s = sessions.get(params.sessionId);
    if (!s) throw Object.assign(new Error("Resource not found"), { code: -32002 });
    if (params.replayFrom && params.replayFrom.type !== "start") {
      const update = { sessionUpdate: "agent_message_chunk", content: { type: "text", text: `replayFrom ${raw}` } };
      await client.notify("session/update", { sessionId: params.sessionId, update });
    } else if (params.replayFrom) {
      for (const sid of [params.sessionId, ...s.children]) {
        for (const update of sessions.get(sid).history) await client.notify("session/update", { sessionId: sid, update });
        await client.notify("session/update", { sessionId: sid, update: { sessionUpdate: "replay_complete" } });
      }
    }
    await client.notify("session/update", { sessionId: params.sessionId, update: { sessionUpdate: "state_update", state: "idle" } });
    return {};
  })
  .onRequest("session/status", ({ params }) => {
    if (!sessions.has(params.sessionId)) throw Object.assign(new Error("Resource not found"), { code: -32002 });
    return { status: "open", state: { state: "idle" } };
  })
  .onRequest("session/close", ({ params }) => {
    sessions.delete(params.sessionId);
    return {};
  })
  .onNotification("session/cancel", ({ params }) => {
    const s = sessions.get(params.sessionId);
    if (s) s.cancelled = true;
  });

// tap passes stdin through unchanged, noting each session/prompt's
// idempotencyKey (in order, by session) before the SDK reads the line.
let partial = "";
const tap = new Transform({
  transform(chunk, _enc, done) {
    const lines = (partial + chunk.toString("utf8")).split("\n");
    partial = lines.pop();
    for (const line of lines) {
      let m;
      try {
        m = JSON.parse(line);
      } catch {
        continue;
      }
      if (m?.method === "session/resume" && typeof m.params?.sessionId === "string") {
        const q = resumeCursors.get(m.params.sessionId) ?? [];
        q.push(rawMember(line, "replayFrom"));
        resumeCursors.set(m.params.sessionId, q);
      }
      if (m?.method === "session/prompt" && typeof m.params?.sessionId === "string") {
        const q = promptKeys.get(m.params.sessionId) ?? [];
        q.push(typeof m.params.idempotencyKey === "string" ? m.params.idempotencyKey : undefined);
        promptKeys.set(m.params.sessionId, q);
      }
    }
    done(null, chunk);
  },
});
process.stdin.pipe(tap);

const conn = agentProtocolRouter().withV1(v1).withV2(v2)
  .connect(ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(tap)));
await conn.closed;
