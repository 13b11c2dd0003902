#!/usr/bin/env node
// End-to-end test of acpgate's web client in a real browser: Debian's
// chromium driven by playwright-core. browser_test.go builds and starts the
// gateway and runs this script:
//
//   node e2e.mjs <gateway-url> [main|tenant|resume|http|fallback|agents|attach|spoof|affinity|affinity-off|budget|policy|subagent]
//
// main    the built-in demo agent, no authentication: connect, stream,
//         permission, file panel, cancel, XSS, reconnect, reload + load
// tenant  a gateway with one tenant: refused without / with a bad token,
//         connects with the good token (subprotocol carrier) and a ticket
// resume  the page loaded through a TCP proxy that the harness cuts: a
//         streamed turn and a permission request survive the dropped
//         socket (the connection is resumed, not the session reloaded)
// http    the page on Streamable HTTP (?transport=http in the URL) with a
//         tenant's token, through the TCP proxy: refused without the token,
//         a streamed turn, a permission card, an event stream cut and
//         resumed with Last-Event-ID, DELETE on disconnect
// fallback the page through a reverse proxy that refuses WebSocket
//         upgrades: it falls back to HTTP, takes a turn with a permission
//         card, loads a session, ends its connection (DELETE) when it is
//         reloaded, and falls back again
// agents  a gateway with the agents demo (default), second (fakeagent) and
//         broken (never ready): the picker lists them, a turn with demo,
//         second picked with the keyboard and a turn with it, a reload
//         keeps the pick, switching back finds demo's session, ?agent=,
//         /v1/agents answering 404 (an older gateway) means /acp and no
//         picker; then through a proxy that refuses WebSockets: the
//         fallback to Streamable HTTP goes to the picked agent too
// attach  several pages on one session (session/attach): a share link,
//         presence, a permission card answered in one page collapses in
//         the others, a read-only page cannot send, cancel or answer
// spoof   another client attaches with an attached page's clientId and
//         name: the page still shows that client's prompt and answer as
//         another's, and keeps itself in presence when it leaves
// affinity a gateway with sessions.affinity_cookie: the share link carries
//         the balancer's cookie, and a page opening it sets it first,
//         no cookie of another name
// affinity-off a gateway without it: a share link sets no cookie
// budget  a tenant with a budget on test/fakeagent: the turn that crosses
//         the cap is stopped, the next prompt refused; the page names the
//         budget and when it resets
// subagent the agent is test/interop/v2-agent.mjs (v1 and v2 in one
//         process): the v1 page takes an ordinary turn, and a prompt that
//         spawns a subagent shows the child's nested transcript (title,
//         state, its messages) under the gateway's sealed child ID, never
//         the agent's own; an attached page gets it too (replayed and
//         live); a child's permission request shows (and is
//         answered) in the child's transcript; over WebSocket, then
//         Streamable HTTP
//
// Environment:
//   ACPGATE_BROWSER_OUT      where screenshots go (default ../out/browser)
//   ACPGATE_GOOD_TOKEN       the tenant's token (tenant scenario)
//   ACPGATE_FALLBACK_URL     the gateway behind a proxy refusing upgrades (agents scenario)
//   ACPGATE_AFFINITY         NAME=VALUE of the affinity cookie (affinity scenario)
//   ACPGATE_CWD              the session's working directory (subagent scenario)
//   ACPGATE_CHROMIUM         the browser binary (default /usr/bin/chromium)
//
// The script asks the harness to act (stop, kill or start the gateway; cut,
// hold or release the proxy) by printing "@@harness <action>" and waits for
// a line on stdin. It exits 0 on success.

import { mkdirSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Failure, check, harness, launch, log } from "../internal/chromium/launch.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const [baseUrl, scenario = "main"] = process.argv.slice(2);
if (!baseUrl) {
  console.error("usage: node e2e.mjs <gateway-url> [main|tenant|resume|http|fallback|agents|attach|spoof|affinity|affinity-off|budget|policy|subagent]");
  process.exit(2);
}
const outDir = process.env.ACPGATE_BROWSER_OUT || join(here, "..", "out", "browser");
mkdirSync(outDir, { recursive: true });

// -- browser -----------------------------------------------------------------
const browser = await launch();
const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, colorScheme: "light", reducedMotion: "reduce" });
const page = await context.newPage();
page.setDefaultTimeout(15000);

const problems = []; // uncaught page errors and CSP violations fail the run
const consoleLines = [];
const wsUrls = [];
page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
page.on("console", (m) => {
  const line = `${m.type()}: ${m.text()}`;
  consoleLines.push(line);
  if (/Content Security Policy/i.test(m.text())) problems.push(`CSP violation: ${m.text()}`);
});
page.on("websocket", (ws) => wsUrls.push(ws.url()));

let step = "start";
async function shot(name) {
  const path = join(outDir, `${name}.png`);
  await page.screenshot({ path });
  log(`screenshot ${path}`);
}

// -- helpers on the page -------------------------------------------------------
const state = () => page.locator("#conn-state").getAttribute("data-state");
async function waitState(want, timeout = 15000) {
  await page.waitForSelector(`#conn-state[data-state="${want}"]`, { timeout });
}
const turnEnds = () => page.locator("#transcript .turn-end").count();
const lastAgentText = () => page.locator("#transcript .msg.agent").last().innerText();

// Clicks Disconnect and waits until the page shows it disconnected; with
// code, the connection detail must show that close code.
async function disconnect({ code } = {}) {
  await page.locator("#disconnect-btn").click();
  await waitState("disconnected");
  if (code) check((await page.locator("#conn-detail").innerText()).includes(code), "close code not shown");
}

// Sends a prompt with the keyboard and returns once the turn has ended
// (unless wait is false).
async function send(text, { wait = true, timeout = 15000 } = {}) {
  const before = await turnEnds();
  await page.locator("#prompt").fill(text);
  await page.locator("#prompt").press("Enter");
  if (!wait) return before;
  await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before, { timeout });
  return before;
}

async function expectAgentText(substr, timeout = 15000) {
  await page.waitForFunction((s) => [...document.querySelectorAll("#transcript .msg.agent")].some((m) => m.innerText.includes(s)), substr, { timeout });
}

// After a refused resume: acp.js connected anew and loaded the session
// (the page's note; the history replayed before it, once).
const RELOADED = "could not be resumed: connected anew, and the session was loaded again (history replayed";
async function waitReloaded(timeout = 15000) {
  await page.waitForFunction((s) => document.getElementById("transcript").innerText.includes(s), RELOADED, { timeout });
  const text = await page.locator("#transcript").innerText();
  check(text.split(RELOADED).length === 2, `the session was loaded ${text.split(RELOADED).length - 1} times: ${JSON.stringify(text.slice(-400))}`);
  check(!/Reconnected: history replayed/.test(text), "the page loaded the session itself too");
}

// The user's message `prompt` and its echo are in the transcript exactly once.
async function checkReplayedOnce(prompt) {
  const users = (await page.locator("#transcript .msg.user").allInnerTexts()).filter((u) => u.trim() === prompt).length;
  const replies = (await page.locator("#transcript .msg.agent").allInnerTexts()).filter((a) => a.includes(`You said: ${prompt}`)).length;
  check(users === 1 && replies === 1, `"${prompt}" is in the transcript ${users} times and its reply ${replies} times, want once each`);
}

async function run(name, fn) {
  step = name;
  log(`step: ${name}`);
  await fn();
}

// -- scenarios -----------------------------------------------------------------

async function mainScenario() {
  const firstPrompt = "hello from the browser test, streaming in order";

  await run("connect without a token", async () => {
    await page.goto(baseUrl);
    await waitState("connected");
    check((await page.locator("#agent-badge").innerText()).includes("acpgate-demo-agent"), "agent name missing from the header");
    const detail = await page.locator("#conn-detail").innerText();
    check(detail.includes("subprotocol acp"), `connection detail: ${detail}`);
    const caps = await page.locator("#agent-info .cap.on").allInnerTexts();
    for (const c of ["load", "list", "resume", "context"]) check(caps.some((x) => x.startsWith(c)), `capability ${c} not shown as supported: ${caps}`);
    check(await page.locator(".suggestion").count() > 3, "no suggestions on the first screen");
    check(wsUrls.every((u) => !/token|bearer/i.test(u)), `a WebSocket URL carries a token: ${wsUrls}`);
    await shot("01-connected");
  });

  await run("every control has a label", async () => {
    const unlabeled = await page.evaluate(() => [...document.querySelectorAll("input, textarea, select")]
      .filter((el) => !(el.labels?.length || el.getAttribute("aria-label") || el.getAttribute("aria-labelledby")))
      .map((el) => el.id || el.outerHTML));
    check(unlabeled.length === 0, `unlabeled controls: ${unlabeled}`);
    check(await page.locator("#transcript[role=log][aria-live=polite]").count() === 1, "the transcript is not an aria-live log");
  });

  await run("markdown renderer", async () => {
    const r = await page.evaluate(async () => {
      const { renderMarkdown } = await import("/markdown.js");
      const md = (text) => {
        const d = document.createElement("div");
        d.append(renderMarkdown(text));
        return d;
      };
      const out = {};
      let d = md("[x](javascript:alert(1)) [y](https://example.com/a_(b)) <https://e.org/> see http://bare.example/x.");
      out.links = [...d.querySelectorAll("a")].map((a) => [a.getAttribute("href"), a.rel, a.target, a.textContent]);
      out.linkText = d.textContent;
      d = md("<b>x</b> <img src=x onerror=alert(1)>\n\n<script>alert(2)</script>");
      out.raw = [d.querySelectorAll("b, img, script").length, d.textContent];
      d = md("```js\nlet a = 1;");
      out.openFence = [d.querySelector("pre code")?.textContent, d.querySelector("pre code")?.className];
      d = md("- a\n  - b\n- c\n\n3. three\n4. four");
      out.lists = [d.querySelector("ul").children.length, d.querySelectorAll("ul ul > li").length, d.querySelectorAll("ol > li").length, d.querySelector("ol").start];
      d = md("snake_case_name, *em*, **strong**, ~~del~~, `a <b> c`, \\*not em\\*");
      out.inline = [d.querySelectorAll("em").length, d.querySelectorAll("strong").length, d.querySelectorAll("del").length, d.querySelector("code")?.textContent, d.textContent];
      d = md("> quoted\n\n---\n\n###### six\nline one\nline two");
      out.blocks = [d.querySelectorAll("blockquote").length, d.querySelectorAll("hr").length, d.querySelector("h6")?.textContent, d.querySelectorAll("p br").length];
      return out;
    });
    const J = JSON.stringify;
    check(J(r.links) === J([["https://example.com/a_(b)", "noopener noreferrer", "_blank", "y"], ["https://e.org/", "noopener noreferrer", "_blank", "https://e.org/"], ["http://bare.example/x", "noopener noreferrer", "_blank", "http://bare.example/x"]]), `links: ${J(r.links)}`);
    check(r.linkText.startsWith("x y "), `a javascript: link should keep its text: ${J(r.linkText)}`);
    check(r.raw[0] === 0 && r.raw[1].includes("<img src=x onerror=alert(1)>") && r.raw[1].includes("<script>"), `raw HTML: ${J(r.raw)}`);
    check(J(r.openFence) === J(["let a = 1;", "language-js"]), `open fence: ${J(r.openFence)}`);
    check(J(r.lists) === J([2, 1, 2, 3]), `lists: ${J(r.lists)}`);
    check(J(r.inline) === J([1, 1, 1, "a <b> c", "snake_case_name, em, strong, del, a <b> c, *not em*"]), `inline: ${J(r.inline)}`);
    check(J(r.blocks) === J([1, 1, "six", 1]), `blocks: ${J(r.blocks)}`);
  });

  await run("acp.js connects anew after a refused resume (AcpClient, fake connections)", async () => {
    const r = await page.evaluate(async () => {
      const { AcpClient, AcpError, ConnectError } = await import("/acp.js");
      // A stand-in for AcpConnection: what AcpClient uses of it.
      let made = 0;
      class FakeConn {
        constructor(caps, { canReopen = true, failLoad = "", reopenFails = 0 } = {}, log = []) {
          Object.assign(this, { caps, canReopen, failLoad, reopenFails, log, n: ++made });
          this.closed = null;
          this.closeListeners = new Set();
          this.handlers = new Map();
          this.listeners = new Map();
          this.onProtocolError = () => {};
          this.resumedAtOpen = false;
        }
        saveInit() {}
        onClose(fn) {
          this.closeListeners.add(fn);
        }
        on(method, fn) {
          if (!this.listeners.has(method)) this.listeners.set(method, new Set());
          this.listeners.get(method).add(fn);
        }
        async request(method, params) {
          this.log.push(`${this.n} ${method}${params.sessionId ? " " + params.sessionId : ""}`);
          if (this.closed) throw new ConnectError("closed", { opened: true });
          if (method === "initialize") return { protocolVersion: 1, agentCapabilities: this.caps };
          if (method === "session/new") return { sessionId: `s${this.log.length}` };
          if (method === "session/load" && params.sessionId === this.failLoad) throw new AcpError(-32002, "no such session");
          if (method === "session/load") for (const fn of this.listeners.get("session/update") ?? []) fn({ sessionId: params.sessionId, update: { replay: true } });
          return {};
        }
        close(code = 1000) {
          this.end({ code, reason: "", wasClean: true });
        }
        end(c) {
          if (this.closed) return;
          this.closed = { resumeRefused: false, ...c };
          for (const fn of this.closeListeners) fn(this.closed);
        }
        async reopen() {
          if (this.reopenFails-- > 0) throw new ConnectError("unreachable");
          return new FakeConn(this.caps, { failLoad: this.failLoad }, this.log);
        }
      }
      const refused = { code: 1006, reason: "", wasClean: false, resumeRefused: true };
      // Runs a client to the end of a reconnect: the events, and what was sent.
      async function scenario(caps, opts = {}, clientOpts = {}) {
        const log = [];
        const conn = new FakeConn(caps, opts, log);
        let seenByPage = null;
        conn.onClose((c) => (seenByPage = { ...c })); // before the client: it still sees reconnecting
        const acp = new AcpClient(conn, clientOpts);
        const events = [];
        const replayed = [];
        conn.on("session/update", (p) => replayed.push(p.sessionId));
        acp.onReconnect((ev) => events.push(ev.state + (ev.sessionId ? " " + ev.sessionId : "") + (ev.method ? " " + ev.method : "") + (ev.error?.reason ? " " + ev.error.reason : "")));
        await acp.initialize({});
        const a = (await acp.newSession("/a")).sessionId;
        const b = (await acp.newSession("/b")).sessionId;
        const c = (await acp.newSession("/c")).sessionId;
        acp.forgetSession(c);
        conn.end(refused);
        for (let i = 0; i < 100 && !/^(done|failed)/.test(events.at(-1) ?? "") && (events.length || acp.reconnecting); i++) await new Promise((r) => setTimeout(r, 20));
        return { a, b, events, log, replayed, seenByPage, reconnecting: acp.reconnecting, renewed: acp.conn !== conn, sessions: [...acp.sessions.keys()] };
      }
      return {
        load: await scenario({ loadSession: true }),
        resume: await scenario({ sessionCapabilities: { resume: {} } }, { reopenFails: 1 }),
        none: await scenario({}),
        failLoad: await scenario({ loadSession: true }, { failLoad: "s3" }),
        off: await scenario({ loadSession: true }, {}, { reconnect: false }),
        ticket: await scenario({ loadSession: true }, { canReopen: false }),
        unreachable: await scenario({ loadSession: true }, { reopenFails: 9 }, { reconnectAttempts: 2 }),
      };
    });
    const J = JSON.stringify;
    const { load, resume, none, failLoad, off, ticket, unreachable } = r;
    check(J(load.events) === J(["reconnecting", "reconnected", "restoring s2 session/load", "restored s2 session/load", "restoring s3 session/load", "restored s3 session/load", "done"]), `load: events ${J(load.events)}`);
    check(J(load.log.slice(4)) === J(["2 initialize", "2 session/load s2", "2 session/load s3"]), `load: requests ${J(load.log)}`);
    check(J(load.replayed) === J(["s2", "s3"]) && load.renewed && !load.reconnecting, `load: replay ${J(load.replayed)}, a new connection: ${load.renewed}`);
    check(load.seenByPage?.resumeRefused === true && load.seenByPage?.reconnecting === true, `load: the page's onClose got ${J(load.seenByPage)}`);
    check(J(resume.events) === J(["reconnecting", "reconnected", "restoring s2 session/resume", "restored s2 session/resume", "restoring s3 session/resume", "restored s3 session/resume", "done"]), `resume: events ${J(resume.events)}`);
    check(J(none.events) === J(["reconnecting", "reconnected", "lost s2", "lost s3", "done"]) && none.sessions.length === 0, `no load, no resume: events ${J(none.events)}, sessions ${J(none.sessions)}`);
    check(J(failLoad.events) === J(["reconnecting", "reconnected", "restoring s2 session/load", "restored s2 session/load", "restoring s3 session/load", "lost s3 session/load", "done"]) && J(failLoad.sessions) === J(["s2"]), `a refused load: events ${J(failLoad.events)}, sessions ${J(failLoad.sessions)}`);
    check(off.events.length === 0 && off.seenByPage?.reconnecting === undefined && !off.renewed, `reconnect: false: events ${J(off.events)}, close ${J(off.seenByPage)}`);
    check(J(ticket.events) === J(["failed ticket spent"]) && ticket.seenByPage?.reconnecting === undefined && !ticket.renewed, `a spent ticket: events ${J(ticket.events)}, close ${J(ticket.seenByPage)}`);
    check(J(unreachable.events) === J(["reconnecting", "failed"]) && !unreachable.reconnecting, `unreachable: events ${J(unreachable.events)}`);
  });

  await run("unknown session/update kinds are ignored", async () => {
    const added = await page.evaluate(() => {
      const el = document.getElementById("transcript");
      const n = el.querySelectorAll(".msg, .tool, .plan, .notice").length;
      const t = window.acpgate.transcript;
      t.update({ sessionUpdate: "some_future_update", content: { type: "text", text: "<img src=x onerror=window.__xss=9>" } });
      t.update({ sessionUpdate: "available_commands_update", availableCommands: [{ name: "x" }] });
      t.update({ sessionUpdate: "current_mode_update", currentModeId: "code" });
      t.update({});
      t.update(null);
      return el.querySelectorAll(".msg, .tool, .plan, .notice").length - n;
    });
    check(added === 0, `unknown updates rendered ${added} elements`);
  });

  await run("add a file in the panel", async () => {
    await page.locator("#file-new").click();
    await page.locator("#file-path").fill("/tmp/x/notes.txt");
    await page.locator("#file-content").fill("alpha line\nbeta line\n");
    await page.locator("#file-form button[type=submit]").click();
    await page.waitForSelector('#file-list [data-path="/tmp/x/notes.txt"]');
  });

  await run("Shift+Enter makes a new line", async () => {
    await page.locator("#prompt").fill("line one");
    await page.locator("#prompt").press("Shift+Enter");
    await page.locator("#prompt").pressSequentially("line two");
    check((await page.locator("#prompt").inputValue()) === "line one\nline two", "Shift+Enter did not insert a newline");
    check((await turnEnds()) === 0, "Shift+Enter sent the prompt");
    await page.locator("#prompt").fill("");
  });

  await run("streamed reply arrives in order", async () => {
    await recordLastAgentMessage();
    await send(firstPrompt);
    const want = `You said: ${firstPrompt}`;
    check((await lastAgentText()).trim() === want, `reply: ${JSON.stringify(await lastAgentText())}`);
    log(`  ${await checkStreamed(want)} streamed states`);
    await page.waitForFunction((t) => document.getElementById("session-title").textContent === t, firstPrompt.slice(0, 40));
    await page.waitForSelector('#session-list [aria-current="true"]');
  });

  await run("markdown is rendered", async () => {
    await send("markdown");
    const last = page.locator("#transcript .msg.agent").last();
    check(await last.locator(".md-h1").count() === 1, "no heading");
    check(await last.locator("ul > li").count() === 3, "no list of 3 items");
    check((await last.locator("pre code").innerText()).includes("package main"), "no code block");
    check(await last.locator("strong").count() >= 1 && await last.locator("em").count() >= 1, "no bold/italic");
    check(await last.locator(":not(pre) > code").count() >= 1, "no inline code");
  });

  await run("thoughts are collapsed", async () => {
    await send("think");
    const th = page.locator("#transcript details.thought").last();
    check(!(await th.evaluate((d) => d.open)), "the thought is open");
    check((await th.textContent()).includes("The user wants me to think"), "thought text missing");
  });

  await run("plan entries with status", async () => {
    await send("plan");
    check(await page.locator("#transcript .plan").last().locator('li[data-status="completed"]').count() === 3, "plan entries not completed");
  });

  await run("permission request: Allow", async () => {
    const before = await send("permission", { wait: false });
    const allow = page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
    await allow.waitFor();
    check(await allow.evaluate((b) => b === document.activeElement), "the first option is not focused");
    check(await page.locator("#transcript .permission:not(.answered) button").count() === 2, "not one button per option");
    await shot("03-permission");
    await allow.click();
    await expectAgentText("Permission granted");
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#transcript .tool").last().getAttribute("data-status")) === "completed", "tool call not completed");
  });

  await run("permission request: Reject with the keyboard", async () => {
    await send("permission", { wait: false });
    await page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').waitFor();
    await page.keyboard.press("Tab"); // Allow -> Reject
    check(await page.evaluate(() => document.activeElement?.dataset.optionId) === "reject", "Tab did not reach Reject");
    await page.keyboard.press("Enter");
    await expectAgentText("Permission denied");
  });

  await run("file read refused while file access is off", async () => {
    if (await page.locator("#fs-allow").isChecked()) await page.locator("#fs-allow").uncheck();
    await send("read /tmp/x/notes.txt");
    await expectAgentText("I could not read /tmp/x/notes.txt");
    const notice = page.locator("#transcript .notice-warn").last();
    check((await notice.innerText()).includes("file access is off"), "no refusal notice");
    await notice.locator("button").click(); // "Allow file access"
    check(await page.locator("#fs-allow").isChecked(), "the notice's button did not allow file access");
  });

  await run("file read answered from the panel", async () => {
    await send("read /tmp/x/notes.txt");
    await expectAgentText('The first line is: "alpha line"');
    check((await page.locator("#transcript .tool").last().getAttribute("data-kind")) === "read", "no read tool call");
    await send("read /tmp/x/missing.txt");
    await expectAgentText("I could not read /tmp/x/missing.txt");
  });

  await run("file write after permission", async () => {
    await send("write /tmp/x/out.txt written by the agent", { wait: false });
    const allow = page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
    await allow.waitFor();
    const diff = page.locator("#transcript .tool").last().locator(".diff .diff-add");
    check((await diff.innerText()).includes("written by the agent"), "the diff does not show the new text");
    await allow.click();
    await expectAgentText("Wrote 20 bytes to /tmp/x/out.txt.");
    await page.waitForSelector('#file-list [data-path="/tmp/x/out.txt"]');
    check((await page.locator("#file-content").inputValue()) === "written by the agent", "the panel does not show the written file");
    check((await page.locator("#fs-log").innerText()).includes("Agent wrote /tmp/x/out.txt"), "write not logged");
    await page.locator("#transcript .diff").last().scrollIntoViewIfNeeded();
    await shot("04-files");
  });

  await run("cancel a long prompt", async () => {
    await send("slow", { wait: false });
    await expectAgentText("tick 3");
    await shot("02-streaming");
    check(await page.locator("#cancel-btn").isVisible(), "no Cancel button while the prompt runs");
    await page.locator("#cancel-btn").click();
    const end = page.locator('#transcript .turn-end[data-stop-reason="cancelled"]');
    await end.waitFor();
    check((await end.innerText()).includes("cancelled"), "stopReason cancelled not shown");
    check(!(await page.locator("#cancel-btn").isVisible()), "Cancel still visible after the turn");
  });

  await run("agent text is never HTML", async () => {
    const payload = "<img src=x onerror=window.__xss=1>";
    await send(payload);
    await expectAgentText(`You said: ${payload}`);
    await send("[click](javascript:window.__xss=2) <script>window.__xss=3</script> **<b>bold</b>**");
    await expectAgentText("You said: click <script>");
    check(await page.evaluate(() => window.__xss) === undefined, "window.__xss was set");
    check(await page.locator("#transcript img, #transcript script, #transcript b").count() === 0, "agent markup became elements");
    check(await page.locator('#transcript a[href^="javascript"]').count() === 0, "a javascript: link was rendered");
    check((await page.locator("#transcript .msg.user").last().innerText()).includes("<script>"), "the user's text was not shown as text");
  });

  await run("reconnect after a gateway restart (1001)", async () => {
    await harness("stop"); // SIGTERM: the gateway closes the socket with 1001
    await waitState("reconnecting");
    const detail = await page.locator("#conn-detail").innerText();
    check(detail.includes("code 1001"), `reconnecting detail: ${detail}`);
    // It keeps trying with backoff while the gateway is away.
    await page.waitForFunction(() => /attempt [2-9]/.test(document.getElementById("conn-detail").textContent), null, { timeout: 10000 });
    await shot("06-reconnecting");
    await harness("start");
    await waitState("connected", 30000);
    // The restarted gateway refuses the resume: acp.js connects anew,
    // initializes and loads the open session (the history is replayed).
    await waitReloaded();
    await expectAgentText(`You said: ${firstPrompt}`);
    check((await page.locator("#transcript .msg.user").first().innerText()).trim() === firstPrompt, "replayed history does not start with the first prompt");
    await checkReplayedOnce(firstPrompt);
    await send("after the restart");
    await expectAgentText("You said: after the restart");
  });

  await run("reconnect after a dropped connection (1006)", async () => {
    await harness("kill"); // SIGKILL: the socket just drops
    await waitState("reconnecting");
    const detail = await page.locator("#conn-detail").innerText();
    check(detail.includes("code 1006"), `reconnecting detail: ${detail}`);
    await harness("start");
    await waitState("connected", 30000);
    await waitReloaded();
    await expectAgentText("You said: after the restart");
    await checkReplayedOnce(firstPrompt);
    await checkReplayedOnce("after the restart");
  });

  await run("reload the page and load the session", async () => {
    await page.reload();
    await waitState("connected");
    const item = page.locator("#session-list .session-item", { hasText: firstPrompt.slice(0, 40) }).first();
    await item.waitFor();
    await item.getByRole("button", { name: /^Load/ }).click();
    await page.waitForFunction(() => /Session loaded/.test(document.getElementById("transcript").innerText));
    const users = await page.locator("#transcript .msg.user").allInnerTexts();
    check(users[0]?.trim() === firstPrompt, `first replayed user message: ${JSON.stringify(users[0])}`);
    check(users.some((u) => u.includes("after the restart")), "later user messages not replayed");
    await expectAgentText(`You said: ${firstPrompt}`);
    await expectAgentText("Permission granted");
    check((await page.locator("#session-title").textContent()) === firstPrompt.slice(0, 40), "title not restored");
    check(await page.locator("#transcript img").count() === 0, "replay produced an <img>");
    check(await page.evaluate(() => window.__xss) === undefined, "window.__xss set on replay");
    await send("after the reload");
    await expectAgentText("You said: after the reload");
  });

  await run("disconnect and connect", async () => {
    await disconnect({ code: "1000" });
    await page.locator("#connect-btn").click();
    await waitState("connected");
  });

  await run("overview screenshot and dark mode", async () => {
    // A fresh session with a short, representative conversation.
    await page.locator("#new-session-btn").click();
    await page.waitForFunction(() => !document.querySelector("#transcript .msg"));
    await page.locator("#fs-allow").check();
    await send("Set up a hello world in Go");
    await send("plan");
    const before = await send("write /tmp/x/hello.go package main", { wait: false });
    const allow = page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
    await allow.waitFor();
    await page.locator("#transcript").evaluate((t) => (t.scrollTop = t.scrollHeight));
    await shot("00-overview"); // docs/screenshot.png is a copy of this one
    await allow.click();
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#session-title").textContent()) === "Set up a hello world in Go", "title of the new session");
    for (let i = 0; i < 3 && (await page.locator("html").getAttribute("data-theme")) !== "dark"; i++) {
      await page.locator("#theme-toggle").click();
    }
    check((await page.locator("html").getAttribute("data-theme")) === "dark", "the toggle did not reach dark");
    const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    const [r, g, b] = bg.match(/\d+/g).map(Number);
    check(r + g + b < 150, `dark mode background is not dark: ${bg}`);
    await shot("05-dark");
    await page.reload();
    await waitState("connected");
    check((await page.locator("html").getAttribute("data-theme")) === "dark", "the theme was not remembered");
  });
}

async function tenantScenario() {
  const good = process.env.ACPGATE_GOOD_TOKEN || "good-token";

  await run("no token: refused", async () => {
    await page.goto(baseUrl);
    await waitState("refused");
    check((await page.locator("#conn-detail").innerText()).includes("check the token"), "no 'check the token' message");
  });

  await run("bad token: refused", async () => {
    check(await page.locator("#auth").evaluate((d) => d.open), "the authentication fields are not opened");
    await page.locator("#token").fill("bad-token");
    await page.locator("#connect-btn").click();
    await waitState("refused");
    const detail = await page.locator("#conn-detail").innerText();
    check(/^Refused: check the token/.test(detail), `refused detail: ${detail}`);
    await shot("07-refused");
  });

  await run("good token: connected via the subprotocol", async () => {
    await page.locator("#token").fill(good);
    await page.locator("#connect-btn").click();
    await waitState("connected");
    check((await page.locator("#conn-detail").innerText()).includes("bearer token"), "not connected with the token");
    check(wsUrls.length >= 3, `expected 3 WebSocket attempts, saw ${wsUrls.length}`);
    check(wsUrls.every((u) => !u.includes("token")), `a token went into a URL: ${wsUrls}`);
  });

  await run("a cwd outside the workspace is refused", async () => {
    await page.locator("#cwd").fill("/tmp");
    await page.locator("#new-session-btn").click();
    await page.waitForSelector("#cwd-error:not([hidden])");
    const err = await page.locator("#cwd-error").innerText();
    check(err.includes("outside the workspace"), `cwd error: ${err}`);
  });

  await run("session and file read under the virtual root", async () => {
    await page.locator("#cwd").fill("/workspace");
    await page.locator("#new-session-btn").click();
    await page.waitForFunction(() => document.getElementById("session-meta").textContent === "/workspace");
    await page.locator("#file-new").click();
    await page.locator("#file-path").fill("/workspace/notes.txt");
    await page.locator("#file-content").fill("tenant notes\n");
    await page.locator("#file-form button[type=submit]").click();
    await page.locator("#fs-allow").check();
    await send("hello tenant");
    await expectAgentText("You said: hello tenant");
    await send("read notes.txt"); // relative: resolved against the session's cwd
    await expectAgentText('The first line is: "tenant notes"');
    check((await page.locator("#transcript .tool .locations").last().innerText()).includes("/workspace/notes.txt"), "location not shown under /workspace");
  });

  await run("one-time ticket", async () => {
    const r = await fetch(new URL("/v1/tickets", baseUrl), { method: "POST", headers: { Authorization: `Bearer ${good}` } });
    check(r.status === 201, `POST /v1/tickets: ${r.status}`);
    const { ticket } = await r.json();
    await disconnect();
    await page.locator("#token").fill("");
    await page.locator("#ticket").fill(ticket);
    await page.locator("#connect-btn").click();
    await waitState("connected");
    check((await page.locator("#conn-detail").innerText()).includes("ticket"), "not connected with the ticket");
    check((await page.locator("#ticket").inputValue()) === "", "the spent ticket is still in the field");
    await disconnect();
    await page.locator("#ticket").fill(ticket); // a second use
    await page.locator("#connect-btn").click();
    await waitState("refused");
    check((await page.locator("#conn-detail").innerText()).includes("ticket"), "refusal does not mention the ticket");
  });
}

// The page through a proxy that the harness cuts ("cut": every TCP
// connection reset; "hold": refused until "release"). The gateway keeps the
// dropped connection, so the page resumes it: same transcript, no reload.
async function resumeScenario() {
  // Records every connection state and every WebSocket URL's query keys
  // (never the values: the resume token is a credential).
  const sawState = (s) => page.evaluate((s) => window.__states.includes(s), s);
  const resetStates = () => page.evaluate(() => (window.__states = []));
  const resumeUrls = () => wsUrls.filter((u) => new URL(u).searchParams.has("resume"));
  const noReload = async () => {
    const text = await page.locator("#transcript").innerText();
    check(!/Reconnected|history replayed|connection closed during the turn/i.test(text), `the page reloaded the session or failed the turn: ${JSON.stringify(text.slice(-300))}`);
    check(await page.locator("#transcript .notice-error").count() === 0, "an error notice in the transcript");
  };
  // Waits for the resume after a cut: "reconnecting" shown, then connected.
  const resumed = async () => {
    await page.waitForFunction(() => window.__states.includes("reconnecting"), null, { timeout: 10000 });
    await waitState("connected", 30000);
    check(/resumed after code 1006/.test(await page.locator("#conn-detail").innerText()), `detail after the resume: ${await page.locator("#conn-detail").innerText()}`);
  };

  await run("connect through the proxy", async () => {
    await page.goto(baseUrl);
    await waitState("connected");
    await recordStates();
    check(await page.locator('#conn-state[role="status"]').count() === 1, "the connection state is not a live region");
    check(await page.evaluate(() => !JSON.stringify(window.acpgate.app.acp.init).includes("resumeToken")), "the resume token is in the initialize result the page shows");
    check(wsUrls.length === 1 && resumeUrls().length === 0, `WebSocket URLs: ${wsUrls.length}`);
  });

  await run("a streamed turn survives two cuts", async () => {
    await recordLastAgentMessage();
    const started = Date.now();
    await send("slow", { wait: false });
    await expectAgentText("tick 5 ");
    await harness("cut");
    await resumed();
    await shot("08-resumed");
    await expectAgentText("tick 60 ", 20000);
    await resetStates();
    await harness("cut");
    await resumed();
    // The demo agent ends "slow" after 600 ticks of 100 ms.
    await page.waitForSelector('#transcript .turn-end[data-stop-reason="end_turn"]', { timeout: 120000 });
    log(`  the turn took ${((Date.now() - started) / 1000).toFixed(1)} s`);
    const want = Array.from({ length: 600 }, (_, i) => `tick ${i + 1}`).join(" ");
    const got = (await lastAgentText()).trim();
    check(got === want, `the reply is not every tick exactly once: ${got.length} chars, want ${want.length}; ${JSON.stringify(got.slice(0, 120))}…`);
    check(await page.locator("#transcript .msg.agent").count() === 1, "the reply is split over several messages");
    check(await page.locator("#transcript .msg.user").count() === 1, "the prompt is shown more than once");
    check(await page.locator("#transcript .turn-end").count() === 1, "more than one turn end");
    let prev = "";
    for (const snap of (await page.evaluate(() => window.__snapshots)).map((x) => x.trim())) {
      check(want.startsWith(snap), `a rendered state is not a prefix of the reply: …${JSON.stringify(snap.slice(-60))}`);
      check(snap.length >= prev.length, "the reply went backwards");
      prev = snap;
    }
    await noReload();
    check(resumeUrls().length === 2 && wsUrls.length === 3, `WebSocket URLs: ${wsUrls.length}, ${resumeUrls().length} resumes`);
    check(resumeUrls().every((u) => /^\d+$/.test(new URL(u).searchParams.get("received"))), "a resume URL without a received count");
  });

  await run("a pending permission request survives a cut", async () => {
    const before = await send("permission", { wait: false });
    const card = page.locator("#transcript .permission:not(.answered)");
    await card.locator('button[data-option-id="allow"]').waitFor();
    await resetStates();
    await harness("cut");
    await resumed();
    check(await card.count() === 1, "the permission card is gone or duplicated after the resume");
    check(await page.locator("#transcript .permission").count() === 1, "more than one permission card");
    await card.locator('button[data-option-id="allow"]').click();
    await expectAgentText("Permission granted");
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "end_turn", "the turn did not end normally");
    check((await page.locator("#transcript .tool").last().getAttribute("data-status")) === "completed", "tool call not completed");
    await noReload();
  });

  await run("an answer given while the gateway is unreachable goes out on resume", async () => {
    const before = await send("permission", { wait: false });
    const allow = page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
    await allow.waitFor();
    await harness("hold"); // connections reset, new ones refused
    await waitState("reconnecting", 10000);
    check((await page.locator("#conn-state").innerText()).trim() === "Reconnecting…", "the header does not say Reconnecting…");
    check(/Reconnecting/.test(await page.locator("#prompt-hint").innerText()), "the composer hint does not say Reconnecting…");
    check(await page.locator("#send-btn").isDisabled(), "Send is enabled while reconnecting");
    await shot("09-resuming");
    await allow.click(); // answered now, sent once the connection is back
    check((await page.locator("#transcript .permission").last().innerText()).includes("You chose"), "the answer is not shown");
    await page.waitForFunction(() => /attempt [2-9]/.test(document.getElementById("conn-detail").textContent), null, { timeout: 15000 });
    check(await state() === "reconnecting", "not reconnecting while the proxy refuses connections");
    await harness("release");
    await waitState("connected", 30000);
    await expectAgentText("Permission granted");
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#transcript .tool").last().getAttribute("data-status")) === "completed", "tool call not completed");
    await noReload();
    await send("after the resumes");
    await expectAgentText("You said: after the resumes");
  });

  await run("a reload resumes the connection", async () => {
    // A permission request is open when the page goes away: the reloaded
    // page, which cannot show it, answers it "cancelled" so the turn ends.
    await send("permission", { wait: false });
    await page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').waitFor();
    const n = wsUrls.length;
    const sentFrames = [];
    page.on("websocket", (ws) => ws.on("framesent", (f) => sentFrames.push(String(f.payload))));
    await page.reload();
    await waitState("connected");
    check(wsUrls.length === n + 1 && new URL(wsUrls[n]).searchParams.has("resume"), "the reloaded page did not resume");
    check((await page.locator("#conn-detail").innerText()).includes("resumed the connection from before the reload"), "no resume note");
    check((await page.locator("#agent-badge").innerText()).includes("acpgate-demo-agent"), "agent name missing after the reload");
    for (let i = 0; i < 50 && !sentFrames.some((f) => f.includes('"outcome":"cancelled"')); i++) await page.waitForTimeout(100);
    check(sentFrames.some((f) => f.includes('"outcome":"cancelled"')), "the reloaded page did not answer the open permission request");
    // The session of before the reload can be loaded and prompted again.
    const item = page.locator("#session-list .session-item", { hasText: "slow" }).first();
    await item.getByRole("button", { name: /^Load/ }).click();
    await page.waitForFunction(() => /Session loaded/.test(document.getElementById("transcript").innerText));
    await send("after the reload");
    await expectAgentText("You said: after the reload");
    check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "end_turn", "the prompt after the reload did not end normally");
  });
}

// -- Streamable HTTP -------------------------------------------------------------

// Every request the page makes to /acp: {method, url, headers}, the headers
// filled in as Playwright reports them (lower-case names).
function recordAcpRequests() {
  const out = [];
  const pending = [];
  page.on("request", (r) => {
    if (new URL(r.url()).pathname !== "/acp") return;
    // headers() is what the page set (Authorization included), known at
    // once; allHeaders() adds what the network stack did, later, and never
    // for a request cut before it was sent. Checks await out.settled().
    const entry = { method: r.method(), url: r.url(), headers: r.headers() };
    out.push(entry);
    pending.push(r.allHeaders().then((h) => (entry.headers = h), () => {}));
  });
  out.settled = () => Promise.all(pending);
  return out;
}

// Records every connection state the page shows (#conn-state's
// data-state) from now on in window.__states.
async function recordStates() {
  await page.evaluate(() => {
    window.__states = [];
    const el = document.getElementById("conn-state");
    new MutationObserver(() => window.__states.push(el.dataset.state)).observe(el, { attributes: true, attributeFilter: ["data-state"] });
  });
}

// Records every rendered state of the transcript's last agent message,
// whichever it is, from now on (a new observer each call).
async function recordLastAgentMessage() {
  await page.evaluate(() => {
    window.__snapshots = [];
    const t = document.getElementById("transcript");
    new MutationObserver(() => {
      const m = [...t.querySelectorAll(".msg.agent")].pop();
      if (m) window.__snapshots.push(m.innerText);
    }).observe(t, { childList: true, subtree: true, characterData: true });
  });
}

// Records every rendered state of the agent's next message (the messages
// there now are left out).
async function recordSnapshots() {
  await page.evaluate(() => {
    const t = document.getElementById("transcript");
    window.__snapshots = [];
    window.__snapshotsAfter = t.querySelectorAll(".msg.agent").length;
    if (window.__snapshotObserver) return;
    window.__snapshotObserver = new MutationObserver(() => {
      const all = t.querySelectorAll(".msg.agent");
      if (all.length > window.__snapshotsAfter) window.__snapshots.push(all[all.length - 1].innerText);
    });
    window.__snapshotObserver.observe(t, { childList: true, subtree: true, characterData: true });
  });
}

// Every rendered state of the reply was a prefix of want, never shrinking.
async function checkStreamed(want, { minStates = 2 } = {}) {
  const snaps = (await page.evaluate(() => window.__snapshots)).map((x) => x.trim()).filter(Boolean);
  const distinct = [...new Set(snaps)];
  check(distinct.length >= minStates, `the reply did not stream (states seen: ${JSON.stringify(distinct.slice(0, 5))})`);
  let prev = "";
  for (const snap of snaps) {
    check(want.startsWith(snap), `a rendered state is not a prefix of the reply: …${JSON.stringify(snap.slice(-60))}`);
    check(snap.length >= prev.length, "the reply went backwards");
    prev = snap;
  }
  return distinct.length;
}

// A turn whose reply is checked as it streams (minStates: how many distinct
// states it must show at least; a busy page may render several chunks at once).
async function streamedTurn(prompt, { minStates = 2 } = {}) {
  await recordSnapshots();
  await send(prompt);
  const want = `You said: ${prompt}`;
  check((await lastAgentText()).trim() === want, `reply: ${JSON.stringify(await lastAgentText())}`);
  log(`  ${await checkStreamed(want, { minStates })} streamed states`);
  check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "end_turn", "the turn did not end with end_turn");
}

async function permissionTurn() {
  const before = await send("permission", { wait: false });
  const allow = page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
  await allow.waitFor();
  check(await page.locator("#transcript .permission:not(.answered) button").count() === 2, "not one button per option");
  await allow.click();
  await expectAgentText("Permission granted");
  await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
  check((await page.locator("#transcript .tool").last().getAttribute("data-status")) === "completed", "tool call not completed");
  check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "end_turn", "the turn did not end with end_turn");
}

// The page on Streamable HTTP, forced by ?transport=http, with a tenant's
// token; the page goes through the TCP proxy that the harness cuts.
async function httpScenario() {
  const good = process.env.ACPGATE_GOOD_TOKEN || "good-token";
  const acp = recordAcpRequests();

  await run("HTTP without a token: refused", async () => {
    await page.goto(baseUrl);
    await waitState("refused");
    const detail = await page.locator("#conn-detail").innerText();
    check(detail.includes("check the token"), `refused detail: ${detail}`);
    check(acp.some((r) => r.method === "POST"), "no initialize POST");
    check(wsUrls.length === 0, `a WebSocket was opened: ${wsUrls}`);
  });

  await run("the event-stream parser", async () => {
    const got = await page.evaluate(async () => {
      const { EventStreamParser } = await import("/acp.js");
      const p = new EventStreamParser();
      const chunks = ["id: 1\r", "\ndata: {\"a\":1}\r\n\r", "\n:\n\n", "data: a\ndata:b\n\n", "id: 2\rdata: x\r\r",
        "event: e\nretry: 5\ndata: y", "\n\n", "data: not ended\n"];
      return chunks.flatMap((c) => p.push(c));
    });
    const want = [{ id: "1", data: '{"a":1}' }, { id: "1", data: "a\nb" }, { id: "2", data: "x" }, { id: "2", data: "y" }];
    check(JSON.stringify(got) === JSON.stringify(want), `events: ${JSON.stringify(got)}`);
  });

  await run("HTTP with the token: connected", async () => {
    await page.locator("#token").fill(good);
    await page.locator("#connect-btn").click();
    await waitState("connected");
    const detail = await page.locator("#conn-detail").innerText();
    check(/^http:\/\/.*\/acp · Streamable HTTP · bearer token$/.test(detail), `connection detail: ${detail}`);
    check((await page.locator("#agent-badge").innerText()).includes("acpgate-demo-agent"), "agent name missing from the header");
  });

  await run("a streamed turn over HTTP", async () => {
    await page.locator("#cwd").fill("/workspace");
    await page.locator("#new-session-btn").click();
    await page.waitForFunction(() => document.getElementById("session-meta").textContent === "/workspace");
    await streamedTurn("hello over Streamable HTTP, streaming in order");
  });

  await run("a permission card over HTTP", permissionTurn);

  await run("the token goes in a header, never in a URL", async () => {
    await acp.settled();
    const gets = acp.filter((r) => r.method === "GET");
    check(gets.some((r) => r.headers.accept === "text/event-stream" && r.headers["acp-connection-id"] && !r.headers["acp-session-id"]), "no GET of the connection's event stream");
    check(gets.some((r) => r.headers.accept === "text/event-stream" && r.headers["acp-session-id"]), "no GET of the session's event stream");
    check(acp.some((r) => r.method === "POST" && r.headers["acp-session-id"]), "no POST with Acp-Session-Id");
    const afterToken = acp.slice(acp.findIndex((r) => r.headers.authorization));
    check(afterToken.length > 4 && afterToken.every((r) => r.headers.authorization === `Bearer ${good}`), "a request without the token after it was given");
    check(acp.every((r) => !r.url.includes(good) && new URL(r.url).search === ""), `a URL with a query: ${acp.map((r) => r.url)}`);
  });

  await run("an event stream cut during a turn resumes with Last-Event-ID", async () => {
    await recordStates();
    await recordSnapshots();
    const messages = await page.locator("#transcript .msg.agent").count();
    await send("slow", { wait: false });
    await expectAgentText("tick 5 ");
    const n = acp.length;
    await harness("cut"); // every TCP connection through the proxy reset
    await page.waitForFunction(() => window.__states.includes("reconnecting"), null, { timeout: 10000 });
    await waitState("connected", 20000);
    const detail = await page.locator("#conn-detail").innerText();
    check(/Streamable HTTP .* resumed after code 1006/.test(detail), `detail after the resume: ${detail}`);
    await expectAgentText("tick 30 ", 20000);
    await page.locator("#cancel-btn").click();
    await page.locator('#transcript .turn-end[data-stop-reason="cancelled"]').waitFor();
    const got = (await lastAgentText()).trim();
    const k = got.split(" ").length / 2;
    const want = Array.from({ length: k }, (_, i) => `tick ${i + 1}`).join(" ");
    check(k >= 30 && got === want, `the reply is not every tick once, in order: ${JSON.stringify(got.slice(0, 80))}…${JSON.stringify(got.slice(-40))}`);
    await checkStreamed(want);
    check(await page.locator("#transcript .msg.agent").count() === messages + 1, "the reply is split over several messages");
    const resumed = acp.slice(n).filter((r) => r.method === "GET" && /^\d+$/.test(r.headers["last-event-id"] ?? ""));
    check(resumed.length >= 1, `no GET with Last-Event-ID after the cut: ${JSON.stringify(acp.slice(n).map((r) => [r.method, r.headers["last-event-id"]]))}`);
    const text = await page.locator("#transcript").innerText();
    check(!/Reconnected|history replayed|connection closed during the turn/i.test(text), "the page reloaded the session or failed the turn");
    await send("after the cut");
    await expectAgentText("You said: after the cut");
  });

  await run("Disconnect sends DELETE", async () => {
    await disconnect({ code: "1000" });
    for (let i = 0; i < 50 && !acp.some((r) => r.method === "DELETE"); i++) await page.waitForTimeout(100);
    check(acp.some((r) => r.method === "DELETE" && r.headers["acp-connection-id"]), "no DELETE with Acp-Connection-Id");
  });
}

// The page through a reverse proxy that answers 400 to WebSocket upgrades:
// the page falls back to Streamable HTTP on its own.
async function fallbackScenario() {
  const firstPrompt = "hello through a proxy that refuses WebSockets";
  const acp = recordAcpRequests();
  const fellBack = async () => {
    await waitState("connected");
    const detail = await page.locator("#conn-detail").innerText();
    check(/^http:\/\/.*\/acp · Streamable HTTP \(the WebSocket was refused\)$/.test(detail), `connection detail: ${detail}`);
  };

  await run("the WebSocket is refused: the page falls back to HTTP", async () => {
    await page.goto(baseUrl);
    await fellBack();
    check(wsUrls.length === 1, `WebSocket attempts: ${wsUrls.length}`);
    check(acp.some((r) => r.method === "POST") && acp.some((r) => r.method === "GET"), "no POST or GET on /acp");
    await shot("10-http-fallback");
  });

  await run("a streamed turn over the fallback", () => streamedTurn(firstPrompt));

  await run("a permission card over the fallback", permissionTurn);

  await run("load a session over HTTP: the replay comes before the answer", async () => {
    await page.locator("#new-session-btn").click();
    await page.waitForFunction(() => !document.querySelector("#transcript .msg"));
    const item = page.locator("#session-list .session-item", { hasText: firstPrompt.slice(0, 40) }).first();
    await item.getByRole("button", { name: /^Load/ }).click();
    await page.waitForFunction(() => /Session loaded/.test(document.getElementById("transcript").innerText));
    const order = await page.evaluate(() => [...document.querySelectorAll("#transcript .msg, #transcript .tool, #transcript .notice")]
      .map((e) => (e.classList.contains("notice-divider") ? "divider" : e.classList.contains("user") ? "user" : "other")));
    check(order.filter((x) => x === "user").length === 2 && order.at(-1) === "divider", `the transcript after the load: ${order}`);
    const users = await page.locator("#transcript .msg.user").allInnerTexts();
    check(users[0]?.trim() === firstPrompt, `first replayed user message: ${JSON.stringify(users[0])}`);
    await expectAgentText("Permission granted");
    await send("after the load");
    await expectAgentText("You said: after the load");
  });

  await run("a reload falls back again", async () => {
    await page.reload();
    await fellBack();
    check(wsUrls.length === 2, `WebSocket attempts: ${wsUrls.length}`);
    await streamedTurn("after the reload, over HTTP again", { minStates: 1 });
  });
}

// -- several agents --------------------------------------------------------------

// A gateway with three agents: demo (the built-in demo agent, the default),
// second (test/fakeagent: agentInfo.name "fakeagent", one-chunk replies, no
// session list) and broken (never ready). At the end the script tells the
// harness how many prompts it sent each agent, which the gateway's metrics
// must match.
async function agentsScenario() {
  const sent = { demo: 0, second: 0 };
  const demoPrompt = "hello demo agent, the default one";
  const secondPrompt = "hello second agent";
  const picker = page.locator("#agent");
  const sendTo = async (agent, text) => {
    await send(text);
    sent[agent]++;
    check((await lastAgentText()).trim() === `You said: ${text}`, `reply: ${JSON.stringify(await lastAgentText())}`);
    check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "end_turn", "the turn did not end with end_turn");
  };
  // Connected to /acp/<agent> (over a WebSocket, unless via says otherwise),
  // the header naming badge.
  const connectedTo = async (agent, badge, via = "WebSocket") => {
    await page.waitForFunction((re) => document.getElementById("conn-state").dataset.state === "connected"
      && new RegExp(re).test(document.getElementById("conn-detail").textContent), `/acp/${agent} · ${via}`, { timeout: 20000 });
    check((await picker.inputValue()) === agent, `the picker shows ${await picker.inputValue()}, connected to ${agent}`);
    await page.waitForFunction((b) => document.getElementById("agent-badge").textContent.includes(b), badge);
    check((await page.locator("#agent-info").innerText()).includes(`/acp/${agent}`), "the agent panel does not say where the agent is");
  };

  await run("the page lists the agents", async () => {
    await page.goto(baseUrl);
    await connectedTo("demo", "acpgate-demo-agent");
    check(await page.locator("#agent-field").isVisible(), "no agent picker");
    const labels = await picker.evaluate((el) => [...el.labels].map((l) => l.textContent.trim()));
    check(labels.includes("Agent"), `the picker's labels: ${labels}`);
    const opts = await page.locator("#agent option").evaluateAll((os) => os.map((o) => ({ value: o.value, text: o.textContent, ready: o.dataset.ready })));
    check(JSON.stringify(opts.map((o) => o.value)) === JSON.stringify(["broken", "demo", "second"]), `options: ${JSON.stringify(opts)}`);
    const by = Object.fromEntries(opts.map((o) => [o.value, o]));
    check(by.demo.text.includes("acpgate-demo-agent") && by.demo.text.includes("(default)") && !by.demo.text.includes("not ready"), `demo: ${by.demo.text}`);
    check(by.second.text.includes("fakeagent") && !by.second.text.includes("default") && !by.second.text.includes("not ready"), `second: ${by.second.text}`);
    check(by.broken.text.includes("not ready") && by.broken.ready === "false", `broken: ${by.broken.text}`);
    check(wsUrls.length === 1 && new URL(wsUrls[0]).pathname === "/acp/demo", `WebSocket URLs: ${wsUrls}`);
    const unlabeled = await page.evaluate(() => [...document.querySelectorAll("input, textarea, select")]
      .filter((el) => !(el.labels?.length || el.getAttribute("aria-label") || el.getAttribute("aria-labelledby")))
      .map((el) => el.id || el.outerHTML));
    check(unlabeled.length === 0, `unlabeled controls: ${unlabeled}`);
  });

  await run("a turn with the default agent", async () => {
    await sendTo("demo", demoPrompt);
    await page.waitForSelector('#session-list [aria-current="true"]');
  });

  await run("pick the second agent with the keyboard", async () => {
    const n = wsUrls.length;
    await picker.focus();
    await page.keyboard.press("ArrowDown"); // broken, demo, second: demo -> second
    await connectedTo("second", "fakeagent");
    check(await picker.evaluate((el) => el === document.activeElement), "the picker lost the focus");
    check(wsUrls.length === n + 1 && new URL(wsUrls[n]).pathname === "/acp/second", `WebSocket URLs: ${wsUrls.slice(n)}`);
    check(await page.locator("#transcript .msg").count() === 0, "the demo agent's conversation is still shown");
    check((await page.locator("#session-title").textContent()) === "New conversation", "the demo agent's session is still open");
    check((await page.evaluate(() => localStorage.getItem("acpgate.agent"))) === '"second"', "the pick is not remembered");
    await shot("11-agents");
  });

  await run("a turn with the second agent", async () => {
    await sendTo("second", secondPrompt);
    check((await page.locator("#agent-badge").innerText()).includes("fakeagent"), "the header does not name the second agent");
    const list = await page.locator("#session-list").innerText();
    check(list.includes("does not list sessions") && !list.includes(demoPrompt.slice(0, 20)), `the second agent's session list: ${list}`);
  });

  await run("a reload keeps the pick and resumes its connection", async () => {
    const n = wsUrls.length;
    await page.reload();
    await connectedTo("second", "fakeagent");
    check(wsUrls.length === n + 1 && new URL(wsUrls[n]).pathname === "/acp/second" && new URL(wsUrls[n]).searchParams.has("resume"),
      `after the reload: ${wsUrls.slice(n).map((u) => new URL(u).pathname)}`);
    check((await page.locator("#conn-detail").innerText()).includes("resumed the connection from before the reload"), "no resume note");
    await sendTo("second", "after the reload, still the second agent");
  });

  await run("switch back: sessions belong to their agent", async () => {
    await picker.selectOption("demo");
    await connectedTo("demo", "acpgate-demo-agent");
    const item = page.locator("#session-list .session-item", { hasText: demoPrompt.slice(0, 30) }).first();
    await item.waitFor();
    check(!(await page.locator("#session-list").innerText()).includes(secondPrompt), "the second agent's session is in the demo agent's list");
    await item.getByRole("button", { name: /^Load/ }).click();
    await page.waitForFunction(() => /Session loaded/.test(document.getElementById("transcript").innerText));
    check((await page.locator("#transcript .msg.user").first().innerText()).trim() === demoPrompt, "the demo session's history was not replayed");
    await sendTo("demo", "back with the demo agent");
  });

  await run("?agent= in the address picks one, and follows a pick", async () => {
    const u = new URL(baseUrl);
    u.searchParams.set("agent", "second");
    await page.goto(u.href);
    await connectedTo("second", "fakeagent");
    await picker.selectOption("demo");
    await connectedTo("demo", "acpgate-demo-agent");
    check(new URL(page.url()).searchParams.get("agent") === "demo", `the address after the pick: ${page.url()}`);
  });

  await run("an older gateway (GET /v1/agents 404): /acp, no picker", async () => {
    await page.route("**/v1/agents", (r) => r.fulfill({ status: 404, contentType: "text/plain", body: "404 page not found\n" }));
    const n = wsUrls.length;
    await page.reload();
    await page.waitForFunction(() => document.getElementById("conn-state").dataset.state === "connected"
      && / · WebSocket/.test(document.getElementById("conn-detail").textContent), null, { timeout: 20000 });
    check(!(await page.locator("#agent-field").isVisible()), "a picker without an agent list");
    check(wsUrls.length === n + 1 && new URL(wsUrls[n]).pathname === "/acp", `after the reload: ${wsUrls.slice(n).map((u) => new URL(u).pathname)}`);
    check(!(await page.locator("#agent-info").innerText()).includes("/acp/"), "the agent panel names an agent endpoint");
    await sendTo("demo", "hello the default agent at /acp"); // /acp is default_agent: demo
    await page.unroute("**/v1/agents");
  });

  await run("the HTTP fallback goes to the picked agent", async () => {
    const u = new URL(process.env.ACPGATE_FALLBACK_URL || baseUrl);
    u.searchParams.set("agent", "second"); // another origin (the proxy's port): nothing remembered there
    const paths = [];
    page.on("request", (r) => {
      const p = new URL(r.url()).pathname;
      if (p === "/acp" || p.startsWith("/acp/")) paths.push(`${r.method()} ${p}`);
    });
    await page.goto(u.href);
    await connectedTo("second", "fakeagent", "Streamable HTTP \\(the WebSocket was refused\\)");
    await sendTo("second", "hello second agent over Streamable HTTP");
    await disconnect();
    for (let i = 0; i < 50 && !paths.includes("DELETE /acp/second"); i++) await page.waitForTimeout(100);
    for (const want of ["POST /acp/second", "GET /acp/second", "DELETE /acp/second"]) check(paths.includes(want), `no ${want}: ${[...new Set(paths)]}`);
    check(paths.every((p) => p.endsWith("/acp/second")), `a request to another agent: ${[...new Set(paths)]}`);
  });

  await harness(`prompts demo=${sent.demo} second=${sent.second}`);
}

// Several pages on one session, through acpgate's session/attach (issue
// #22; TestBrowserAttach: the built-in demo agent, no authentication). Page
// A starts a session and copies its share link; A is the session's plain
// owner and gets only ACP v1 ($/cancel_request, user_message_chunk). Page B
// opens the link (attached, the history replayed); A's agent asks
// permission, B answers, and A's card collapses; a page C opened with the
// read-only link cannot send, cancel or answer. Then: presence; B cancels
// A's turn while its card is open (A's card is not "answered elsewhere");
// a page D joining while a request is pending is asked too; B reloaded
// while one is pending is asked again and answers; B disconnects and the
// others see it leave, and A's session goes on.
async function twoPagesAttach() {
  const pageOn = async (url) => {
    const p = await context.newPage();
    p.setDefaultTimeout(15000);
    p.on("pageerror", (err) => problems.push(`page error (second page): ${err.message}`));
    await p.goto(url);
    await p.waitForSelector('#conn-state[data-state="connected"]');
    return p;
  };
  const turnEndsOn = (p) => p.locator("#transcript .turn-end").count();
  const transcriptHas = (p, text) => p.waitForFunction((t) => document.getElementById("transcript").innerText.includes(t), text);
  let link = "";
  let B;
  let C;

  await run("attach: page A starts a session and shares it", async () => {
    await page.goto(baseUrl);
    await waitState("connected");
    check(await page.locator("#share-btn").isHidden(), "Share shown before a session is open");
    await send("hello before sharing");
    await page.locator("#share-btn").click();
    link = await page.locator("#share-link").inputValue();
    const u = new URL(link);
    check(u.search === "" && new URLSearchParams(u.hash.slice(1)).get("attach"), `the share link does not carry the session in its fragment: ${link}`);
    check(!new URLSearchParams(u.hash.slice(1)).has("ro"), `the link is read-only: ${link}`);
  });

  await run("attach: page B opens the link", async () => {
    B = await pageOn(link);
    await transcriptHas(B, "Attached to the shared session");
    const users = await B.locator("#transcript .msg.user").allInnerTexts();
    check(users.some((t) => t.trim() === "hello before sharing"), `B's replay lacks A's prompt: ${users}`);
    check(await B.locator("#transcript .msg.agent").filter({ hasText: "You said: hello before sharing" }).count() === 1, "B's replay lacks A's reply");
    check(await B.locator("#presence li").count() >= 2, `B's presence: ${await B.locator("#presence li").allInnerTexts()}`);
    check(await B.locator("#ro-badge").isHidden() && await B.locator("#prompt").isEnabled(), "B is read-only");
  });

  await run("attach: A's agent asks permission, B answers, A's card collapses", async () => {
    const before = await turnEnds();
    await send("permission", { wait: false });
    await page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').waitFor();
    const allowB = B.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
    await allowB.waitFor();
    await allowB.click();
    // A, the owner, hears who answered (permission_resolved), not only that
    // its card was withdrawn.
    await page.waitForFunction(() => /llowed by acpgate-web/.test(document.querySelector("#transcript .permission.collapsed")?.innerText ?? ""));
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#transcript .tool").last().getAttribute("data-status")) === "completed", "A's tool call did not complete");
    check((await B.locator("#transcript .permission").last().innerText()).includes("You chose"), "B's card does not show B's answer");
    // B saw A's prompt as A's, and the end of A's turn (turn_complete).
    await B.waitForFunction(() => [...document.querySelectorAll("#transcript .msg.user")].some((m) => /: permission$/.test(m.innerText.trim())));
    await B.waitForFunction(() => document.querySelector("#cancel-btn").hidden);
  });

  await run("attach: B prompts, A sees it", async () => {
    const before = await turnEndsOn(B);
    await B.locator("#prompt").fill("hello from page B");
    await B.locator("#prompt").press("Enter");
    await B.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    await page.waitForFunction(() => [...document.querySelectorAll("#transcript .msg.user")].some((m) => m.innerText.includes("hello from page B")));
    await expectAgentText("You said: hello from page B");
  });

  await run("attach: a read-only page C cannot send", async () => {
    const u = new URL(link);
    u.hash += "&ro=1";
    C = await pageOn(u.href);
    await transcriptHas(C, "Attached to the shared session");
    check(await C.locator("#ro-badge").isVisible(), "no read-only badge");
    check(await C.locator("#prompt").isDisabled() && await C.locator("#send-btn").isDisabled(), "C's prompt box or Send is enabled");
    const before = await turnEnds();
    await send("permission", { wait: false });
    await page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').waitFor();
    // The gateway does not ask a read-only client; if it shows a card, its buttons are disabled.
    check(await C.locator("#transcript .permission:not(.answered) button:enabled").count() === 0, "C can answer a permission request");
    check(await C.locator("#cancel-btn:enabled").count() === 0, "C can cancel");
    await page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').click();
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    await C.waitForFunction(() => [...document.querySelectorAll("#transcript .permission")].some((p) => p.innerText.includes("allowed by")));
    await B.waitForFunction(() => [...document.querySelectorAll("#transcript .permission")].some((p) => p.innerText.includes("llowed by")));
  });

  // Who each page lists (presence): the attached pages are told of each
  // other; A, the plain owner, gets only ACP v1 and lists itself.
  const presence = (p) => p.locator("#presence li").count();
  const waitPresence = (p, n) => p.waitForFunction((k) => document.querySelectorAll("#presence li").length === k, n);
  const openCard = (p) => p.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]');
  let D;

  await run("attach: presence", async () => {
    await waitPresence(B, 3); // A, B, C
    await waitPresence(C, 3);
    await waitPresence(page, 3); // the owner too: it asked for the multi-client updates (issue #32)
  });

  await run("attach: B cancels A's turn while its permission is pending", async () => {
    const before = await turnEnds();
    const cardsA = await page.locator("#transcript .permission").count();
    await send("permission", { wait: false });
    await openCard(page).waitFor();
    await openCard(B).waitFor();
    await B.locator("#cancel-btn").click();
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "cancelled", "A's turn did not end cancelled");
    const cardA = await page.locator("#transcript .permission").nth(cardsA).innerText();
    check(!/answered elsewhere/i.test(cardA) && /cancel/i.test(cardA), `A's card after B cancelled: ${JSON.stringify(cardA)}`);
    const cardB0 = await B.locator("#transcript .permission").last().innerText();
    check(/You cancelled the turn/.test(cardB0), `B's card does not say B cancelled: ${JSON.stringify(cardB0)}`);
    await B.waitForFunction(() => document.querySelector("#cancel-btn").hidden);
    await C.waitForFunction(() => document.querySelector("#cancel-btn").hidden);
    const cardB = await B.locator("#transcript .permission").last().innerText();
    check(!/answered elsewhere|allowed by/i.test(cardB), `B's card: ${JSON.stringify(cardB)}`);
  });

  await run("attach: a page D that joins while a permission is pending is asked too", async () => {
    const before = await turnEnds();
    await send("permission", { wait: false });
    await openCard(page).waitFor();
    await openCard(B).waitFor();
    D = await pageOn(link);
    await transcriptHas(D, "Attached to the shared session");
    await waitPresence(B, 4);
    await openCard(D).click();
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    // A's card collapses naming who answered (A hears permission_resolved).
    await page.waitForFunction(() => /llowed by/.test([...document.querySelectorAll("#transcript .permission")].pop()?.innerText ?? ""));
    await B.waitForFunction(() => /llowed by/.test(document.querySelector("#transcript .permission:last-of-type")?.innerText ?? ""));
    check(await openCard(B).count() === 0 && await openCard(page).count() === 0, "a card is still open");
    await B.screenshot({ path: join(outDir, "12-attached.png") });
  });

  await run("attach: B reloads while a permission is pending, and answers it", async () => {
    const before = await turnEnds();
    await send("permission", { wait: false });
    await openCard(page).waitFor();
    await openCard(B).waitFor();
    await B.reload();
    await B.waitForSelector('#conn-state[data-state="connected"]');
    await transcriptHas(B, "Attached to the shared session");
    await openCard(B).click();
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    check((await page.locator("#transcript .turn-end").last().getAttribute("data-stop-reason")) === "end_turn", "A's turn did not end normally");
    await D.waitForFunction(() => /llowed by/.test(document.querySelector("#transcript .permission:last-of-type")?.innerText ?? ""));
    await waitPresence(C, 4);
    await waitPresence(B, 4);
    const users = (await B.locator("#transcript .msg.user").allInnerTexts()).filter((t) => t.trim() === "hello before sharing").length;
    check(users === 1, `B's replay after the reload shows A's first prompt ${users} times`);
  });

  // Disconnect closes cleanly (1000): the others are told at once. (A
  // closed tab's socket is kept for a resume: it counts until the
  // gateway's detach_timeout.)
  await run("attach: B disconnects and leaves, A's session goes on", async () => {
    await B.locator("#disconnect-btn").click();
    await B.waitForSelector('#conn-state[data-state="disconnected"]');
    await waitPresence(C, 3);
    await waitPresence(D, 3);
    await B.close();
    await D.close();
    await C.close();
    await send("still here after B left");
    check((await lastAgentText()).includes("You said: still here after B left"), "A's session ended with B");
  });
}

// An attached page knows itself by the clientId the gateway answered, not by
// one a client may ask for (issue #30 item 6). Page A starts a session and
// shares it; page B opens the link; then a client of its own (a bare
// WebSocket, as any program could open) attaches asking for B's clientId,
// with B's clientInfo. The gateway gives it another ID; B lists it beside
// itself, shows its prompt as another client's (prompt_received) and its
// answer to a permission request as someone else's (permission_resolved),
// and still lists itself after it detaches (client_disconnected).
async function spoofedClientId() {
  const presence = (p) => p.locator("#presence li").allInnerTexts();
  const waitPresence = (p, n) => p.waitForFunction((k) => document.querySelectorAll("#presence li").length === k, n);
  let link = "";
  let sid = "";
  let B;
  let selfB = "";
  let spoofId = "";

  await run("spoof: page A shares a session, page B attaches", async () => {
    await page.goto(baseUrl);
    await waitState("connected");
    await send("hello before sharing");
    await page.locator("#share-btn").click();
    link = await page.locator("#share-link").inputValue();
    sid = new URLSearchParams(new URL(link).hash.slice(1)).get("attach");
    B = await context.newPage();
    B.setDefaultTimeout(15000);
    B.on("pageerror", (err) => problems.push(`page error (page B): ${err.message}`));
    await B.goto(link);
    await B.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
    await waitPresence(B, 2); // A and B
    selfB = (await B.locator("#presence li.self").getAttribute("data-client-id")) ?? "";
    check(selfB !== "", `B lists no clientId for itself: ${await presence(B)}`);
  });

  // The impostor: a bare WebSocket on the gateway's origin, driven from a
  // page that runs nothing else. It answers the requests the agent sends
  // it with "allow" when asked to (window.spoof.allow).
  const S = await context.newPage();
  S.setDefaultTimeout(15000);
  await run("spoof: a client attaches with B's clientId and clientInfo", async () => {
    await S.goto(new URL("/healthz", baseUrl).href);
    const res = await S.evaluate(async ({ sid, clientId }) => {
      const ws = new WebSocket(new URL("/acp", location.href).href.replace(/^http/, "ws"), "acp");
      await new Promise((ok, fail) => {
        ws.onopen = ok;
        ws.onerror = () => fail(new Error("the WebSocket failed"));
      });
      let n = 0;
      const answers = new Map();
      const spoof = { requests: [], allow: false };
      const answer = (m) => ws.send(JSON.stringify({ jsonrpc: "2.0", id: m.id, result: { outcome: { outcome: "selected", optionId: "allow" } } }));
      ws.onmessage = (e) => {
        const m = JSON.parse(e.data);
        if (m.method === undefined && answers.has(m.id)) {
          answers.get(m.id)(m);
          answers.delete(m.id);
        } else if (m.method === "session/request_permission" && m.id !== undefined) {
          spoof.requests.push(m);
          if (spoof.allow) answer(m);
        }
      };
      spoof.call = (method, params) => new Promise((ok) => {
        const id = ++n;
        answers.set(id, ok);
        ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
      });
      spoof.allowNow = () => {
        spoof.allow = true;
        for (const m of spoof.requests.splice(0)) answer(m);
      };
      window.spoof = spoof;
      const info = { name: "acpgate-web", version: "1.0.0" }; // what the page says it is
      const init = await spoof.call("initialize", { protocolVersion: 1, clientCapabilities: {}, clientInfo: info });
      if (init.error) return init;
      return spoof.call("session/attach", { sessionId: sid, historyPolicy: "none", clientId, clientInfo: info });
    }, { sid, clientId: selfB });
    check(!res.error && typeof res.result?.clientId === "string", `the impostor's attach: ${JSON.stringify(res)}`);
    spoofId = res.result.clientId;
    log(`B is ${selfB}; the client that asked for B's clientId was given ${spoofId}`);
  });

  await run("spoof: B shows the other client's prompt as theirs", async () => {
    const res = await S.evaluate((sid) => window.spoof.call("session/prompt", { sessionId: sid, prompt: [{ type: "text", text: "a prompt from the other client" }] }), sid);
    check(res.result?.stopReason === "end_turn", `the impostor's prompt: ${JSON.stringify(res)}`);
    await B.waitForFunction(() => [...document.querySelectorAll("#transcript .msg.user.from-other")].some((m) => m.innerText.includes("a prompt from the other client")));
    await B.waitForFunction(() => [...document.querySelectorAll("#transcript .msg.agent")].some((m) => m.innerText.includes("You said: a prompt from the other client")));
  });

  await run("spoof: B shows the other client's answer to a permission request as theirs", async () => {
    const before = await turnEnds();
    await send("permission", { wait: false });
    await page.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').waitFor();
    await B.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').waitFor();
    await S.evaluate(() => window.spoof.allowNow());
    await page.waitForFunction((n) => document.querySelectorAll("#transcript .turn-end").length > n, before);
    await B.waitForFunction(() => /llowed by acpgate-web/.test(document.querySelector("#transcript .permission:last-of-type")?.innerText ?? ""));
    check(await B.locator('#transcript .permission:not(.answered) button[data-option-id="allow"]').count() === 0, "B's card is still open");
  });

  await run("spoof: B lists the other client beside itself; it detaches, B still lists itself", async () => {
    await waitPresence(B, 3);
    check(await B.locator("#presence li.self").count() === 1, `B's presence: ${await presence(B)}`);
    const res = await S.evaluate((sid) => window.spoof.call("session/detach", { sessionId: sid }), sid);
    check(res.result?.status === "detached", `the impostor's detach: ${JSON.stringify(res)}`);
    await waitPresence(B, 2);
    check(await B.locator("#presence li.self").getAttribute("data-client-id") === selfB, `B's presence after the other client left: ${await presence(B)}`);
    await B.locator("#prompt").fill("B is still itself");
    await B.locator("#prompt").press("Enter");
    await expectAgentText("You said: B is still itself");
    await S.close();
    await B.close();
  });
}

// The share link carries the balancer's affinity cookie (issue #22 item 8).
// The gateway (sessions.affinity_cookie: ACPGATE_AFFINITY) gives the cookie
// its connection's opening request carried back in the initialize result;
// page A's requests carry it (set on its browser context), so its share
// link has it. A page in a fresh browser context (no cookies) opening the
// link sets it before it connects: its upgrade carries it, so the gateway
// gives it back to that page too; so does a page already connected without
// it when the link is opened in its tab. A link whose cookie is not plain
// tokens, or that names another cookie than the gateway's, sets nothing.
// The gateway's standing permission rules decide the demo agent's
// requests (issue #32): page A, which holds the session, is never asked
// and its turns go on; page B, attached, is told who decided: "allowed by
// the gateway's rule …" and "rejected by the gateway's rule …".
async function policyScenario() {
  let B;
  const policyLine = (p, verb) => p.waitForFunction((v) => [...document.querySelectorAll("#transcript .permission")]
    .some((el) => el.innerText.includes(`${v} by the gateway's rule permissions[`)), verb);
  await run("policy: page A starts a session, page B attaches", async () => {
    await page.goto(baseUrl);
    await waitState("connected");
    await send("hello");
    await page.locator("#share-btn").click();
    const link = await page.locator("#share-link").inputValue();
    B = await context.newPage();
    B.setDefaultTimeout(15000);
    B.on("pageerror", (err) => problems.push(`page error (page B): ${err.message}`));
    await B.goto(link);
    await B.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
  });
  await run("policy: an allow rule answers the agent; nobody is asked", async () => {
    await send("permission");
    await expectAgentText("Permission granted (allow).");
    // A, the owner, is never asked either, and sees the rule's decision
    // (it asked for the multi-client updates of its sessions).
    check(await page.locator("#transcript .permission button").count() === 0, "page A was asked");
    await policyLine(page, "allowed");
    await policyLine(B, "allowed");
    const line = await B.locator("#transcript .permission").last().innerText();
    check(line.includes('{kind: "execute", decide: allow}'), `B's line does not name the rule: ${line}`);
    check(await B.locator("#transcript .permission button").count() === 0, "page B was asked");
  });
  await run("policy: a deny rule rejects", async () => {
    await send("write notes.txt hello");
    await expectAgentText("Permission denied.");
    check(await page.locator("#transcript .permission button").count() === 0, "page A was asked");
    await policyLine(page, "rejected");
    await policyLine(B, "rejected");
    await shot("policy-attached");
  });
  await B.close();
}

async function affinityScenario() {
  const cookie = process.env.ACPGATE_AFFINITY || "ACPGATE_AFFINITY=replica-2";
  const [name, value] = [cookie.slice(0, cookie.indexOf("=")), cookie.slice(cookie.indexOf("=") + 1)];
  const initMeta = async (p) => JSON.parse(await p.locator("#agent-info details.raw pre").textContent())?._meta?.acpgate ?? {};
  const freshPage = async (url) => {
    const ctx = await browser.newContext({ viewport: { width: 1280, height: 720 }, reducedMotion: "reduce" });
    const p = await ctx.newPage();
    p.setDefaultTimeout(15000);
    p.on("pageerror", (err) => problems.push(`page error (fresh context): ${err.message}`));
    await p.goto(url);
    await p.waitForSelector('#conn-state[data-state="connected"]');
    return { ctx, p };
  };
  let link = "";

  await run("affinity: page A's connection carries the cookie, its share link too", async () => {
    await context.addCookies([{ name, value, url: baseUrl }]);
    await page.goto(baseUrl);
    await waitState("connected");
    check((await initMeta(page)).affinity === cookie, `A's initialize result: _meta.acpgate ${JSON.stringify(await initMeta(page))}`);
    await send("hello before sharing");
    await page.locator("#share-btn").click();
    link = await page.locator("#share-link").inputValue();
    const f = new URLSearchParams(new URL(link).hash.slice(1));
    check(f.get("attach") && f.get("affinity") === cookie, `the share link does not carry the affinity cookie: ${link}`);
  });

  await run("affinity: a fresh browser opening the link sends the cookie", async () => {
    const { ctx, p } = await freshPage(link);
    await p.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
    check((await initMeta(p)).affinity === cookie, `B's initialize result: _meta.acpgate ${JSON.stringify(await initMeta(p))}`);
    const set = (await ctx.cookies(baseUrl)).filter((c) => c.name === name);
    check(set.length === 1 && set[0].value === value && set[0].path === "/" && set[0].sameSite === "Lax", `B's cookies: ${JSON.stringify(set)}`);
    // B's own share link carries the cookie on.
    await p.locator("#share-btn").click();
    check(new URLSearchParams(new URL(await p.locator("#share-link").inputValue()).hash.slice(1)).get("affinity") === cookie, "B's share link lost the cookie");
    await ctx.close();
  });

  await run("affinity: a link opened in a tab connected without the cookie connects anew with it", async () => {
    const { ctx, p } = await freshPage(baseUrl);
    check(!(await initMeta(p)).affinity, "a fresh page's connection carried an affinity cookie");
    await p.evaluate((h) => (location.hash = h), new URL(link).hash);
    await p.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
    check((await initMeta(p)).affinity === cookie, `after the link: _meta.acpgate ${JSON.stringify(await initMeta(p))}`);
    await ctx.close();
  });

  await run("affinity: a link with a cookie that is not plain tokens sets none", async () => {
    // Only the cookie the gateway names (issue #30 item 7): not another
    // name, nor the name in another case, nor one attribute more.
    const others = ["session=evil", `${name.toLowerCase()}=1`, `${name}x=1`, `x${name}=1`, `Path=/`, `${name}=x;Path=/acp`, `${name}=x,session=evil`];
    for (const bad of [...others, `${name}=x; Domain=example.com`, `${name}=a b`, `${name}=a\tb`, `no-value`, `bad name=1`, `${name}=`, `${name}=${"v".repeat(257)}`]) {
      const u = new URL(link);
      const f = new URLSearchParams(u.hash.slice(1));
      f.set("affinity", bad);
      u.hash = f.toString();
      const { ctx, p } = await freshPage(u.href);
      await p.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
      const cookies = await ctx.cookies();
      check(cookies.length === 0, `the link's affinity ${JSON.stringify(bad)} set cookies: ${JSON.stringify(cookies)}`);
      check(!(await initMeta(p)).affinity, "the gateway saw an affinity cookie");
      await ctx.close();
    }
  });
}

// A gateway without sessions.affinity_cookie: its page sets no cookie from
// a share link, not even one the link names as the affinity cookie (issue
// #30 item 7).
async function affinityOffScenario() {
  let link = "";
  await run("affinity-off: page A shares a link without a cookie", async () => {
    await page.goto(baseUrl);
    await waitState("connected");
    await send("hello before sharing");
    await page.locator("#share-btn").click();
    link = await page.locator("#share-link").inputValue();
    check(!new URLSearchParams(new URL(link).hash.slice(1)).has("affinity"), `the share link carries a cookie: ${link}`);
  });

  await run("affinity-off: a link naming a cookie sets none", async () => {
    for (const named of ["ACPGATE_AFFINITY=replica-2", "session=evil"]) {
      const u = new URL(link);
      const f = new URLSearchParams(u.hash.slice(1));
      f.set("affinity", named);
      u.hash = f.toString();
      const ctx = await browser.newContext({ viewport: { width: 1280, height: 720 }, reducedMotion: "reduce" });
      const p = await ctx.newPage();
      p.setDefaultTimeout(15000);
      p.on("pageerror", (err) => problems.push(`page error (fresh context): ${err.message}`));
      await p.goto(u.href);
      await p.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
      const cookies = await ctx.cookies();
      check(cookies.length === 0, `the link's affinity ${JSON.stringify(named)} set cookies: ${JSON.stringify(cookies)}`);
      await ctx.close();
    }
  });
}

// A tenant with a 2 USD budget a day on test/fakeagent: the turn that
// crosses the cap is stopped by the gateway, and the next prompt refused;
// the page says which budget, how much is spent, and when it resets.
async function budgetScenario() {
  await run("budget: connect with the tenant's token", async () => {
    await page.goto(baseUrl);
    await waitState("refused");
    await page.locator("#token").fill(process.env.ACPGATE_GOOD_TOKEN);
    await page.locator("#connect-btn").click();
    await waitState("connected");
    await page.locator("#cwd").fill("/workspace");
    await page.locator("#new-session-btn").click();
    await page.waitForFunction(() => document.getElementById("session-meta").textContent === "/workspace");
  });

  const budgetLine = /the budget of t1 is spent: \d+\.\d\d of 2\.00 USD this day\. Prompts are refused until it resets, /;
  await run("budget: the turn that crosses the cap is stopped, and the page says why", async () => {
    await send("spend 0.5,1,2.5,3,4 every=100ms");
    const text = await page.locator("#transcript").innerText();
    check(/The gateway stopped this turn: /.test(text) && budgetLine.test(text), `no budget notice for the stopped turn: ${JSON.stringify(text.slice(-600))}`);
  });

  await run("budget: the next prompt is refused as a budget, with its reset", async () => {
    await send("hello after the cap");
    const notes = await page.locator("#transcript .notice").allInnerTexts();
    const last = notes[notes.length - 1] ?? "";
    check(/^Not sent: /.test(last) && budgetLine.test(last), `the refusal shows as ${JSON.stringify(last)}`);
    const resets = new Date(Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() + 1)).toLocaleString();
    check(last.includes(resets), `the reset time ${resets} is not in ${JSON.stringify(last)}`);
    check(!/The prompt failed/.test(last), "shown as a generic failure");
    await shot("budget-refused");
  });
}

async function subagentScenario() {
  await run("subagent: the transcript renders children as text, nested, by their IDs", async () => {
    await page.goto(baseUrl);
    const r = await page.evaluate(async () => {
      const { Transcript } = await import("/transcript.js");
      const el = document.createElement("div");
      document.body.append(el);
      const t = new Transcript(el);
      const evil = "<img src=x onerror=window.__xss=1>";
      t.update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "before" } });
      t.update({ sessionUpdate: "subagent_update", sessionId: "", title: "nobody" }); // the gateway could not name it
      t.update({ sessionUpdate: "subagent_update", sessionId: "c1", title: evil, state: { state: "running" } });
      const c1 = t.child("c1");
      c1.update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: evil } });
      c1.update({ sessionUpdate: "tool_call", toolCallId: "tc", title: evil, kind: "read", status: "in_progress" });
      c1.update({ sessionUpdate: "subagent_update", sessionId: "c2", title: null });
      t.child("c2")?.update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "grandchild" } });
      c1.update({ sessionUpdate: "state_update", state: "idle", stopReason: "cancelled" });
      t.update({ sessionUpdate: "subagent_update", sessionId: "c1", title: "renamed" });
      await new Promise((res) => setTimeout(res, 100)); // the streams render on the next frame
      const card = el.querySelector(":scope > .subagent");
      const out = {
        cards: el.querySelectorAll(":scope > .subagent").length,
        id: card?.dataset.sessionId,
        title: card?.querySelector(".subagent-title").textContent,
        state: card?.querySelector(".subagent-state").textContent,
        child: card?.querySelector(".subagent-log > .msg.agent")?.textContent,
        tool: card?.querySelector(".subagent-log > .tool .tool-title")?.textContent,
        nested: card?.querySelector(".subagent-log > .subagent")?.dataset.sessionId,
        nestedTitle: card?.querySelector(".subagent-log > .subagent .subagent-title")?.textContent,
        grandchild: card?.querySelector(".subagent-log > .subagent .msg.agent")?.textContent,
        elements: el.querySelectorAll("img, script").length,
        xss: window.__xss ?? null,
        order: el.firstElementChild?.classList.contains("msg") && el.lastElementChild === card,
        unknown: t.child("c3"),
      };
      el.remove();
      return out;
    });
    const J = JSON.stringify;
    check(r.cards === 1 && r.id === "c1" && r.order, `the child's card: ${J(r)}`);
    check(r.title === "renamed" && r.state === "idle (cancelled)", `title and state: ${J(r)}`);
    check(r.child === "<img src=x onerror=window.__xss=1>" && r.tool === r.child, `the child's message and tool call as text: ${J(r)}`);
    check(r.nested === "c2" && r.nestedTitle === "Subagent" && r.grandchild === "grandchild", `a child's child: ${J(r)}`);
    check(r.elements === 0 && r.xss === null && r.unknown === null, `markup or an unknown child: ${J(r)}`);
  });

  for (const [name, query] of [["websocket", ""], ["http", "?transport=http"]]) {
    await run(`subagent (${name}): connect, new session`, async () => {
      await page.goto(baseUrl + query);
      await waitState("connected");
      const detail = await page.locator("#conn-detail").innerText();
      check(detail.includes(name === "http" ? "Streamable HTTP" : "WebSocket"), `connection detail: ${detail}`);
      await page.locator("#cwd").fill(process.env.ACPGATE_CWD);
      await page.locator("#new-session-btn").click();
      await page.waitForFunction((cwd) => document.getElementById("session-meta").textContent === cwd, process.env.ACPGATE_CWD);
    });

    await run(`subagent (${name}): a v1 page on the v2-capable agent takes an ordinary turn`, async () => {
      await send("hello");
      await expectAgentText("tick 1");
      const end = await page.locator("#transcript > .turn-end").last().getAttribute("data-stop-reason");
      check(end === "end_turn", `the turn ended ${end}`);
      check(await page.locator("#transcript .subagent").count() === 0, "a subagent card for a plain turn");
    });

    await run(`subagent (${name}): the child shows as a nested transcript under its sealed ID`, async () => {
      await send("subagent");
      const card = page.locator("#transcript > .subagent");
      await page.waitForFunction(() => [...document.querySelectorAll("#transcript > .subagent .subagent-log > .msg.agent")].some((m) => m.innerText.includes("child ends")), null, { timeout: 15000 })
        .catch(async () => {
          throw new Failure(`no nested child transcript; the transcript reads ${JSON.stringify((await page.locator("#transcript").innerText()).slice(-600))}`);
        });
      check(await card.count() === 1, `${await card.count()} subagent cards, want 1`);
      const child = (await card.locator(".subagent-log .msg.agent").allInnerTexts()).join(" ");
      const m = /child says (\S+)/.exec(child);
      check(m, `the child's text is not in its transcript: ${JSON.stringify(child)}`);
      check(child.includes("child starts"), `the child's first message is missing: ${JSON.stringify(child)}`);
      const native = m[1]; // the agent's own child ID, which it wrote into its text
      const sealed = await card.getAttribute("data-session-id");
      check(sealed && sealed !== native && !sealed.includes(native), `the child's card carries ${JSON.stringify(sealed)}, the agent's own ID is ${native}`);
      // No attribute anywhere on the page names the agent's child ID (its
      // text does: the agent wrote it there).
      const leaks = await page.evaluate((id) => [...document.querySelectorAll("*")].flatMap((el) => [...el.attributes].filter((a) => a.value.includes(id)).map((a) => `${el.tagName}[${a.name}]`)), native);
      check(leaks.length === 0, `attributes carry the agent's child ID: ${leaks}`);
      // The parent's own reply is the parent's, after the card, not inside it.
      const parentText = (await page.locator("#transcript > .msg.agent").allInnerTexts()).join(" ");
      check(parentText.includes("parent done") && !parentText.includes("child says"), `the parent's messages: ${JSON.stringify(parentText)}`);
      check(!(await card.innerText()).includes("parent done"), "the parent's reply is inside the child's card");
      const after = await page.evaluate(() => {
        const c = document.querySelector("#transcript > .subagent");
        const done = [...document.querySelectorAll("#transcript > .msg.agent")].find((e) => e.innerText.includes("parent done"));
        return !!(c.compareDocumentPosition(done) & Node.DOCUMENT_POSITION_FOLLOWING);
      });
      check(after, "the child's card is not where it was announced (before the parent's last reply)");
      const title = await card.locator(".subagent-title").innerText();
      check(/^child of \S{8}$/.test(title), `the child's title shows as ${JSON.stringify(title)}`);
      const state = await card.locator(".subagent-state").innerText();
      check(state === "running", `the child's state shows as ${JSON.stringify(state)}`);
      const label = await card.locator(".subagent-log").getAttribute("aria-label");
      check(label === `Subagent transcript: ${title}` && (await card.locator(".subagent-log").getAttribute("role")) === "log", `the child's log is labelled ${JSON.stringify(label)}`);
      const end = await page.locator("#transcript > .turn-end").last().getAttribute("data-stop-reason");
      check(end === "end_turn", `the parent's turn ended ${end}`);
      await shot(`subagent-nested-${name}`);
    });

    await run(`subagent (${name}): the child's card folds with the keyboard`, async () => {
      const card = page.locator("#transcript > .subagent");
      await card.locator("summary").focus();
      await page.keyboard.press("Enter");
      check(!(await card.evaluate((d) => d.open)), "Enter on the summary did not fold the child's transcript");
      check(!(await card.locator(".subagent-log").isVisible()), "the folded child's transcript is still visible");
      await page.keyboard.press("Enter");
      check(await card.evaluate((d) => d.open), "Enter again did not unfold it");
    });

    if (name === "websocket") {
      await run("subagent (websocket): a page attached to the session gets the child, replayed and live", async () => {
        const sealed = await page.locator("#transcript > .subagent").first().getAttribute("data-session-id");
        await page.locator("#share-btn").click();
        const link = await page.locator("#share-link").inputValue();
        const B = await context.newPage();
        B.setDefaultTimeout(15000);
        B.on("pageerror", (err) => problems.push(`page error (attached page): ${err.message}`));
        try {
          await B.goto(link);
          await B.waitForFunction(() => document.getElementById("transcript").innerText.includes("Attached to the shared session"));
          const replayed = B.locator("#transcript > .subagent");
          check(await replayed.count() === 1 && (await replayed.getAttribute("data-session-id")) === sealed, `B's replay: ${await replayed.count()} child cards, ID ${await replayed.first().getAttribute("data-session-id").catch(() => "")}, A's ${sealed}`);
          check((await replayed.locator(".subagent-log").innerText()).includes("child says"), "B's replayed child has no text");
          await send("subagent");
          await B.waitForFunction(() => document.querySelectorAll("#transcript > .subagent").length === 2 &&
            document.querySelectorAll("#transcript > .subagent")[1].querySelector(".subagent-log").innerText.includes("child ends"));
          const [a2, b2] = [await page.locator("#transcript > .subagent").last().getAttribute("data-session-id"), await B.locator("#transcript > .subagent").last().getAttribute("data-session-id")];
          check(a2 && a2 === b2 && a2 !== sealed, `the live child's IDs: A ${a2}, B ${b2} (the first ${sealed})`);
        } finally {
          await B.close();
        }
      });
    }

    await run(`subagent (${name}): a child's permission request shows in the child's transcript`, async () => {
      const before = await send("subagent-permission", { wait: false });
      const card = page.locator("#transcript > .subagent").last();
      const perm = card.locator(".subagent-log > .permission");
      await perm.waitFor({ timeout: 15000 }).catch(async () => {
        throw new Failure(`no permission card in the child's transcript; the transcript reads ${JSON.stringify((await page.locator("#transcript").innerText()).slice(-600))}`);
      });
      check(await page.locator("#transcript > .permission").count() === 0, "the child's permission card is in the parent's transcript");
      check((await perm.innerText()).includes("touch a file in the child"), `the card reads ${JSON.stringify(await perm.innerText())}`);
      const focused = await page.evaluate(() => document.activeElement?.closest(".subagent .permission") != null && document.activeElement.dataset.optionId);
      check(focused === "allow", `the focus is not on the child's first option: ${focused}`);
      await shot(`subagent-permission-${name}`);
      await page.keyboard.press("Enter");
      await page.waitForFunction((n) => document.querySelectorAll("#transcript > .turn-end").length > n, before);
      const child = (await card.locator(".subagent-log .msg.agent").allInnerTexts()).join(" ");
      check(child.includes("child asks") && child.includes("child permission allow"), `the child's transcript reads ${JSON.stringify(child)}`);
      check((await card.locator(".subagent-title").innerText()) === "asking child", "the second child's title");
      const state = await card.locator(".subagent-state").innerText();
      check(state === "idle", `the child's state shows as ${JSON.stringify(state)} after its idle subagent_update`);
    });
  }
}

// -- main ----------------------------------------------------------------------
let code = 0;
try {
  if (scenario === "main") await mainScenario();
  else if (scenario === "tenant") await tenantScenario();
  else if (scenario === "resume") await resumeScenario();
  else if (scenario === "http") await httpScenario();
  else if (scenario === "fallback") await fallbackScenario();
  else if (scenario === "agents") await agentsScenario();
  else if (scenario === "attach") await twoPagesAttach();
  else if (scenario === "spoof") await spoofedClientId();
  else if (scenario === "affinity") await affinityScenario();
  else if (scenario === "policy") await policyScenario();
  else if (scenario === "affinity-off") await affinityOffScenario();
  else if (scenario === "budget") await budgetScenario();
  else if (scenario === "subagent") await subagentScenario();
  else throw new Failure(`unknown scenario ${scenario}`);
  check(problems.length === 0, problems.join("\n"));
  log(`PASS ${scenario}`);
} catch (err) {
  code = 1;
  console.error(`FAIL ${scenario} at step "${step}": ${err instanceof Failure ? err.message : err.stack}`);
  if (problems.length) console.error(problems.join("\n"));
  console.error("browser console:\n  " + consoleLines.slice(-40).join("\n  "));
  await page.screenshot({ path: join(outDir, `fail-${scenario}.png`) }).catch(() => {});
} finally {
  await browser.close().catch(() => {});
}
process.exit(code);
