#!/usr/bin/env node
// reference-server.mjs: the official SDK's own Streamable-HTTP server
// (@agentclientprotocol/sdk 2.4.0, experimental/server AcpServer served by
// experimental/node createNodeHttpHandler), in front of a stdio agent. Each
// HTTP connection (each initialize) gets a fresh agent subprocess. Used by
// wire_test.go as the reference the gateway's /acp is compared with.
//
// Usage:
//   node reference-server.mjs [--lifetime MS] [--log] -- AGENT [ARGS...]
//     AGENT ARGS   the agent's command line (spawned directly, no shell);
//                  it speaks newline-delimited JSON-RPC on stdin/stdout, and
//                  its stderr is passed through to ours
//     --lifetime   exit after this long whatever happens (default 120000)
//     --log        one line on stderr for each HTTP request and its status
//
// stdout, one JSON object per line:
//   {"type":"listening","addr":"127.0.0.1:PORT","url":"http://127.0.0.1:PORT/acp"}
//   {"type":"agent","pid":N}                    an agent subprocess started
//   {"type":"agent-exit","pid":N,"code":C,"signal":S}
//   {"type":"closed"}                           then the process exits 0
//
// It listens on 127.0.0.1 with a port the kernel picks. It stops on SIGTERM,
// SIGINT, or when its stdin ends (so it does not outlive the test that
// started it): AcpServer.close() ends every connection, and every agent
// still running gets SIGTERM, then SIGKILL 2 s later.
import http from "node:http";
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { ndJsonStream } from "@agentclientprotocol/sdk";
import { AcpServer } from "@agentclientprotocol/sdk/experimental/server";
import { createNodeHttpHandler } from "@agentclientprotocol/sdk/experimental/node";

const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
function usage(msg) {
  process.stderr.write(`reference-server.mjs: ${msg}\nusage: node reference-server.mjs [--lifetime MS] [--log] -- AGENT [ARGS...]\n`);
  process.exit(2);
}

let lifetimeMs = 120000;
let log = false;
let agentArgv = [];
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      agentArgv = argv.slice(i + 1);
      break;
    } else if (a === "--lifetime") {
      lifetimeMs = Number(argv[++i]);
      if (!Number.isFinite(lifetimeMs) || lifetimeMs <= 0) usage("--lifetime needs a positive number of ms");
    } else if (a === "--log") {
      log = true;
    } else {
      usage(`unknown argument ${JSON.stringify(a)}`);
    }
  }
}
if (agentArgv.length === 0) usage("no agent command after --");

// The agent processes running now.
const agents = new Set();

// stdioAgent is an AgentConnector: for each connection AcpServer hands it a
// stream of JSON-RPC objects ({readable: from the client, writable: to the
// client}); it pipes that to and from a new agent subprocess.
const stdioAgent = {
  connect(stream) {
    const child = spawn(agentArgv[0], agentArgv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
    agents.add(child);
    out({ type: "agent", pid: child.pid });
    const exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        agents.delete(child);
        out({ type: "agent-exit", pid: child.pid, code, signal });
        resolve();
      });
      child.once("error", (err) => {
        agents.delete(child);
        process.stderr.write(`reference-server.mjs: agent: ${err.message}\n`);
        resolve();
      });
    });
    const agentSide = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
    // Client → agent. This ends when the connection shuts down (DELETE,
    // close()); the agent's stdin is then closed, and it should exit. If it
    // does not within 2 s, it is stopped.
    const inbound = stream.readable.pipeTo(agentSide.writable).catch(() => {});
    inbound.finally(() => {
      child.stdin.destroy();
      const timer = setTimeout(() => child.kill("SIGTERM"), 2000);
      exited.finally(() => clearTimeout(timer));
    });
    // Agent → client, until the agent's stdout ends.
    const outbound = agentSide.readable.pipeTo(stream.writable).catch(() => {});
    // The connection is over once the agent has exited and its output is
    // drained, or its output failed.
    return { closed: Promise.all([exited, outbound]).then(() => {}) };
  },
};

const acp = new AcpServer({ agent: stdioAgent });
const handler = createNodeHttpHandler(acp);
const server = http.createServer((req, res) => {
  if (log) {
    res.once("finish", () => process.stderr.write(`reference-server.mjs: ${req.method} ${req.url} -> ${res.statusCode}\n`));
  }
  handler(req, res);
});

let stopping = false;
async function stop(why) {
  if (stopping) return;
  stopping = true;
  if (log) process.stderr.write(`reference-server.mjs: stopping (${why})\n`);
  server.close();
  server.closeAllConnections?.(); // open SSE responses would hold close() up
  await Promise.race([acp.close().catch(() => {}), new Promise((r) => setTimeout(r, 3000))]);
  for (const child of agents) child.kill("SIGTERM");
  const deadline = Date.now() + 2000;
  while (agents.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  for (const child of agents) child.kill("SIGKILL");
  out({ type: "closed" });
  process.exit(0);
}
process.on("SIGTERM", () => stop("SIGTERM"));
process.on("SIGINT", () => stop("SIGINT"));
process.stdin.on("end", () => stop("stdin closed"));
process.stdin.on("error", () => stop("stdin error"));
process.stdin.resume();
setTimeout(() => stop(`--lifetime ${lifetimeMs} ms`), lifetimeMs).unref();

server.listen(0, "127.0.0.1", () => {
  const { address, port } = server.address();
  out({ type: "listening", addr: `${address}:${port}`, url: `http://${address}:${port}/acp` });
});
