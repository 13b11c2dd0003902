// sdk-run.mjs: what sdk-client.mjs and sdk-owner.mjs share: JSON-line
// output, option parsing, the failure/exit path and the tap that prints
// notifications in arrival order. Not a script of its own.

const t0 = Date.now();

// out prints one JSON object a line, with "t": ms since the script started.
export const out = (o) => process.stdout.write(JSON.stringify({ ...o, t: Date.now() - t0 }) + "\n");

// parseArgs returns the positional arguments of argv; an option in options
// (name -> function of its value) takes the next argument; "--" ends the
// options.
export function parseArgs(argv, options) {
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (Object.hasOwn(options, a)) {
      options[a](argv[++i]);
    } else if (a === "--") {
      pos.push(...argv.slice(i + 1));
      break;
    } else {
      pos.push(a);
    }
  }
  return pos;
}

// timeoutArg is the value of --timeout: a positive number of ms.
export function timeoutArg(v, usage) {
  const ms = Number(v);
  if (!Number.isFinite(ms) || ms <= 0) usage("--timeout needs a positive number of ms");
  return ms;
}

// run.stage names what the script is doing, for the "error" line.
export const run = { stage: "connect" };
let exiting = false;

// exit flushes stdout, then exits with code (once).
export function exit(code) {
  if (exiting) return;
  exiting = true;
  process.stdout.write("", () => process.exit(code)); // flush stdout first
}

// fail prints {"type":"error","stage":...,"error":{...}} and exits 1.
export function fail(error) {
  if (exiting) return;
  const e = error instanceof Error || (error && typeof error === "object")
    ? { name: error.name, message: error.message, code: error.code, data: error.data }
    : { message: String(error) };
  out({ type: "error", stage: run.stage, error: e });
  exit(1);
}

// failAfter makes the script fail after timeoutMs, and on an unhandled
// rejection.
export function failAfter(timeoutMs) {
  setTimeout(() => fail(new Error(`timeout after ${timeoutMs} ms`)), timeoutMs).unref();
  process.on("unhandledRejection", (e) => fail(e));
}

// tapped returns stream with a tap on its inbound messages that prints every
// notification in exact arrival order ({"type":"session/update","params"} or
// {"type":"notification","method","params"}) and hands each session/update's
// params to onUpdate. (SDK notification handlers run asynchronously and may
// finish after a later response has resolved its request.)
export function tapped(stream, onUpdate = () => {}) {
  const tap = new TransformStream({
    transform(msg, controller) {
      if (msg && typeof msg === "object" && typeof msg.method === "string" && !("id" in msg)) {
        if (msg.method === "session/update") {
          out({ type: "session/update", params: msg.params });
          onUpdate(msg.params);
        } else {
          out({ type: "notification", method: msg.method, params: msg.params });
        }
      }
      controller.enqueue(msg);
    },
  });
  return { readable: stream.readable.pipeThrough(tap), writable: stream.writable };
}

// openSession runs initialize and session/new (in cwd) on agent, printing
// {"type":"initialize","result"} and {"type":"session/new","result","sessionId"},
// and returns session/new's result; it throws when that has no sessionId.
export async function openSession(agent, cwd, clientCapabilities, clientInfo) {
  run.stage = "initialize";
  const init = await agent.request("initialize", { protocolVersion: 1, clientCapabilities, clientInfo });
  out({ type: "initialize", result: init });
  run.stage = "session/new";
  const sess = await agent.request("session/new", { cwd, mcpServers: [] });
  out({ type: "session/new", result: sess, sessionId: sess.sessionId });
  if (typeof sess.sessionId !== "string" || sess.sessionId === "") throw new Error("session/new result has no sessionId");
  return sess;
}
