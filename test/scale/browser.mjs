#!/usr/bin/env node
// browser.mjs: the web client (web/static, served by the gateway at /)
// through the balancer, when the replica it is on dies. Driven by
// browser_test.go:
//
//   node browser.mjs <balancer-url> [websocket|http]
//
// websocket (the default): the page's usual transport; http: the page on
// Streamable HTTP (?transport=http in its address), whose event streams
// are what drops and whose resume (GET with Last-Event-ID) is refused.
//
// Environment:
//   ACPGATE_SCALE_TOKEN   the tenant's token (typed into the page)
//   ACPGATE_SCALE_CWD     the session's working directory (the tenant's root)
//   ACPGATE_CHROMIUM      the browser (default /usr/bin/chromium)
//   ACPGATE_BROWSER_OUT   where screenshots go (default ../out/scale)
//
// Debian's chromium, driven by the playwright-core that test/browser
// installs (cd test/browser && npm ci); this directory has no package of
// its own. The script asks the harness to act by printing "@@harness
// <action>" and waits for "ok" (or "error") on stdin:
//
//   kill <a|b>   SIGKILL the replica the page is on (named by the
//                balancer's affinity cookie; the harness checks it against
//                the replicas' metrics)
//   check <a|b>  the page is now on that replica: the harness checks its
//                metrics (one session/load, one prompt, a refused resume)
//
// It exits 0 on success.

import { mkdirSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Failure, check, harness, launch, log } from "../internal/chromium/launch.mjs";

const here = dirname(fileURLToPath(import.meta.url));

const [baseUrl, transport = "websocket"] = process.argv.slice(2);
const token = process.env.ACPGATE_SCALE_TOKEN ?? "";
const cwd = process.env.ACPGATE_SCALE_CWD ?? "";
if (!baseUrl || !token || !cwd || !["websocket", "http"].includes(transport)) {
  console.error("usage: ACPGATE_SCALE_TOKEN=… ACPGATE_SCALE_CWD=… node browser.mjs <balancer-url> [websocket|http]");
  process.exit(2);
}
const outDir = process.env.ACPGATE_BROWSER_OUT || join(here, "..", "out", "scale");
mkdirSync(outDir, { recursive: true });
const COOKIE = "ACPGATE_AFFINITY";

const browser = await launch();
const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, colorScheme: "light", reducedMotion: "reduce" });
const page = await context.newPage();
page.setDefaultTimeout(20000);

const problems = [];
const consoleLines = [];
const sockets = []; // the WebSocket URLs the page opened, in order
page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
page.on("console", (m) => {
  consoleLines.push(`${m.type()}: ${m.text()}`);
  if (/Content Security Policy/i.test(m.text())) problems.push(`CSP violation: ${m.text()}`);
});
page.on("websocket", (ws) => sockets.push(ws.url()));
const posts = []; // the initialize POSTs to /acp (a new connection each)
const streams = []; // the event stream GETs to /acp: {lastId}
page.on("request", (r) => {
  if (new URL(r.url()).pathname !== "/acp") return;
  if (r.method() === "POST" && /"method":"initialize"/.test(r.postData() ?? "")) posts.push(r.url());
  if (r.method() === "GET" && !r.headers().upgrade) streams.push({ lastId: r.headers()["last-event-id"] ?? null });
});

let step = "start";
async function run(name, fn) {
  step = name;
  log(`step: ${name}`);
  await fn();
}
async function shot(name) {
  await page.screenshot({ path: join(outDir, `${name}.png`) });
}
async function waitState(want, timeout = 20000) {
  await page.waitForSelector(`#conn-state[data-state="${want}"]`, { timeout });
}
async function affinity() {
  const c = (await context.cookies(baseUrl)).find((c) => c.name === COOKIE);
  return c?.value ?? "";
}
async function send(text, timeout = 30000) {
  const before = await page.locator("#transcript .turn-end").count();
  await page.locator("#prompt").fill(text);
  await page.locator("#prompt").press("Enter");
  await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before, { timeout });
  await page.waitForFunction((s) => [...document.querySelectorAll("#transcript .msg.agent")].some((m) => m.innerText.includes(s)), `You said: ${text}`, { timeout });
}
// How many times the user's message `prompt` and its echo are in the transcript.
async function count(prompt) {
  const users = (await page.locator("#transcript .msg.user").allInnerTexts()).filter((u) => u.trim() === prompt).length;
  const replies = (await page.locator("#transcript .msg.agent").allInnerTexts()).filter((a) => a.includes(`You said: ${prompt}`)).length;
  return { users, replies };
}
const plain = () => sockets.filter((u) => !new URL(u).searchParams.has("resume"));
const resumes = () => sockets.filter((u) => new URL(u).searchParams.has("resume"));

const RELOADED = "could not be resumed: connected anew, and the session was loaded again (history replayed";
const first = "hello through the balancer, before the replica dies";
const second = "and again, on the replica that is left";

let code = 0;
try {
  let on = "";
  await run("the page through the balancer, refused without the token", async () => {
    await page.goto(baseUrl + (transport === "http" ? "/?transport=http" : "/"));
    await waitState("refused");
    on = await affinity();
    check(on === "a" || on === "b", `the balancer set no ${COOKIE} cookie naming a replica: ${JSON.stringify(on)}`);
    log(`the balancer put the page on replica ${on}`);
  });

  await run("connect with the tenant's token", async () => {
    check(await page.locator("#auth").evaluate((d) => d.open), "the authentication fields are not open");
    await page.locator("#token").fill(token);
    await page.locator("#cwd").fill(cwd);
    await page.locator("#connect-btn").click();
    await waitState("connected");
    const detail = await page.locator("#conn-detail").innerText();
    check(detail.includes(transport === "http" ? "Streamable HTTP" : "WebSocket") && detail.includes("bearer token"), `connection detail: ${detail}`);
    check(sockets.every((u) => !u.includes(token)), "the token went into a WebSocket URL");
    check((await affinity()) === on, "the affinity cookie changed");
  });

  await run("a session and a turn", async () => {
    await send(first);
    check(await page.locator("#session-meta").innerText().then((t) => t.startsWith(cwd)), "the session is not in the tenant's root");
    await shot(`browser-${transport}-01-before-kill`);
  });

  const plainBefore = plain().length;
  const postsBefore = posts.length;
  const streamsBefore = streams.length;
  const survivor = on === "a" ? "b" : "a";
  await run(`SIGKILL replica ${on}`, async () => {
    // Every state the page goes through from here.
    await page.evaluate(() => {
      window.__states = [];
      const el = document.getElementById("conn-state");
      const detail = document.getElementById("conn-detail");
      new MutationObserver(() => window.__states.push(`${el.dataset.state}: ${detail.textContent}`))
        .observe(el, { attributes: true, attributeFilter: ["data-state"] });
      // For a failure's report: when the session's updates and the notes came.
      const t0 = performance.now();
      window.__events = [];
      window.acpgate.app.conn.on("session/update", (p) => window.__events.push(`${(performance.now() - t0).toFixed(0)}ms update ${p.update?.sessionUpdate}`));
      new MutationObserver((ms) => {
        for (const m of ms) for (const n of m.addedNodes) if (n.classList?.contains("notice")) window.__events.push(`${(performance.now() - t0).toFixed(0)}ms note ${n.textContent.slice(0, 60)}`);
      }).observe(document.getElementById("transcript"), { childList: true, subtree: true });
    });
    await harness(`kill ${on}`);
  });

  await run("the resume is refused; acp.js connects anew and loads the session", async () => {
    await page.waitForFunction((s) => document.getElementById("transcript").innerText.includes(s), RELOADED, { timeout: 30000 });
    await waitState("connected");
    // The replayed history (over HTTP it comes on the session's stream, the
    // answer to session/load on the connection's: they may cross).
    await page.waitForFunction((s) => [...document.querySelectorAll("#transcript .msg.agent")].some((m) => m.innerText.includes(s)), `You said: ${first}`, { timeout: 10000 });
    const states = await page.evaluate(() => window.__states);
    log("states:", JSON.stringify(states));
    log("events:", JSON.stringify(await page.evaluate(() => window.__events)));
    check(states.some((s) => s.startsWith("reconnecting: ") && s.includes("could not resume it: connecting anew")),
      `the page never said it was connecting anew: ${JSON.stringify(states)}`);
    const text = await page.locator("#transcript").innerText();
    check(text.split(RELOADED).length === 2, `the session was loaded ${text.split(RELOADED).length - 1} times`);
    check(!/Reconnected: history replayed/.test(text), "the page loaded the session itself too");
    const n = await count(first);
    check(n.users === 1 && n.replies === 1, `after the reload the first prompt is in the transcript ${n.users} times and its reply ${n.replies} times, want once each`);
    if (transport === "http") {
      // The event streams opened again with Last-Event-ID (refused), then
      // one new connection: one initialize POST.
      check(sockets.length === 0, `the page opened WebSockets: ${JSON.stringify(sockets)}`);
      check(streams.slice(streamsBefore).some((s) => s.lastId !== null), `the page never resumed an event stream: ${JSON.stringify(streams.slice(streamsBefore))}`);
      check(posts.length === postsBefore + 1, `${posts.length - postsBefore} initialize POSTs after the kill, want 1`);
    } else {
      check(resumes().length >= 1, `the page never tried to resume: ${JSON.stringify(sockets)}`);
      check(plain().length === plainBefore + 1, `${plain().length - plainBefore} new connections after the kill, want 1: ${JSON.stringify(sockets.slice(-4))}`);
    }
    check((await affinity()) === survivor, `the affinity cookie is ${JSON.stringify(await affinity())} after the kill, want ${survivor}`);
    const detail = await page.locator("#conn-detail").innerText();
    check(detail.includes("connected anew"), `connection detail: ${detail}`);
    await shot(`browser-${transport}-02-loaded-again`);
  });

  await run(`a new prompt on replica ${survivor}`, async () => {
    await send(second);
    const a = await count(first);
    const b = await count(second);
    check(a.users === 1 && a.replies === 1 && b.users === 1 && b.replies === 1, `transcript counts: first ${JSON.stringify(a)}, second ${JSON.stringify(b)}`);
    await harness(`check ${survivor}`);
    await shot(`browser-${transport}-03-after`);
  });

  check(problems.length === 0, problems.join("\n"));
  log("PASS");
} catch (err) {
  code = 1;
  console.error(`FAIL at step "${step}": ${err instanceof Failure ? err.message : err.stack}`);
  if (problems.length) console.error(problems.join("\n"));
  console.error("browser console:\n  " + consoleLines.slice(-40).join("\n  "));
  console.error("WebSockets:\n  " + sockets.map((u) => u.replace(/resume=[^&]*/, "resume=…")).join("\n  "));
  console.error("transcript:\n" + (await page.locator("#transcript").innerText().catch(() => "?")));
  await new Promise((r) => setTimeout(r, 2000));
  console.error("transcript 2 s later:\n" + (await page.locator("#transcript").innerText().catch(() => "?")));
  console.error("events:\n  " + (await page.evaluate(() => window.__events ?? []).catch(() => [])).join("\n  "));
  await page.screenshot({ path: join(outDir, `browser-${transport}-fail.png`) }).catch(() => {});
} finally {
  await browser.close().catch(() => {});
}
process.exit(code);
