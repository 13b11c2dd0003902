// transcript.js: renders one ACP session as a conversation. It consumes
// session/update notifications (PROTOCOL.md §3.1) and the client's own
// events (the user's prompts, permission requests, turn ends).
//
// Every string from the agent reaches the page as a text node or through
// markdown.js (which builds text nodes too); nothing is parsed as HTML.

import { h, clear, nextFrame } from "./dom.js";
import { MarkdownView, safeHref } from "./markdown.js";

const KIND_LABEL = {
  read: "Read",
  edit: "Edit",
  delete: "Delete",
  move: "Move",
  search: "Search",
  execute: "Run",
  think: "Think",
  fetch: "Fetch",
  switch_mode: "Mode",
  other: "Tool",
};

const PLAN_MARK = { pending: "○", in_progress: "◐", completed: "●" };
const IMAGE_TYPES = /^image\/(png|jpeg|gif|webp)$/;

export class Transcript {
  /**
   * el: the log element. opts.onTitle(title) is called for
   * session_info_update; opts.announce(text) speaks through the aria-live
   * status region; opts.onState(update) is called for state_update.
   * opts.scroller: the element that scrolls (el itself, unless this is a
   * subagent's transcript nested in its parent's).
   */
  constructor(el, { onTitle = () => {}, announce = () => {}, onUsage = () => {}, onState = () => {}, scroller = el, who = "agent" } = {}) {
    this.el = el;
    this.who = who; // "agent", or "subagent" in a child's transcript
    this.scroller = scroller;
    this.onTitle = onTitle;
    this.announce = announce;
    this.onUsage = onUsage;
    this.onState = onState;
    this.readOnly = false; // a read-only attach: permission requests are shown, not answered
    this.shared = false; // the gateway shares sessions: a withdrawn request may have been answered elsewhere
    this.member = false; // the page attached to the session: a request answered elsewhere comes with permission_resolved
    this.clear();
  }

  clear() {
    clear(this.el);
    this.stream = null; // {kind, view|text, node, messageId, pending}
    this.tools = new Map(); // toolCallId -> {el, data}
    this.plan = null; // the plan card of the current turn
    this.permissions = new Set(); // open permission cards: {cancel, withdraw, resolved}
    this.cards = new Map(); // toolCallId -> the permission card's entry, open or answered
    this.live = false; // a prompt of ours is running
    this.remote = false; // a turn another client of the session started is running
    this.echo = null; // {text, pos}: a prompt shown from prompt_received, whose user_message_chunk copy is dropped
    this.elsewhere = []; // cards of this turn withdrawn as "answered elsewhere" (a plain client of a shared session)
    this.children = new Map(); // a subagent's child session ID (as the gateway sealed it) -> Subagent
  }

  /**
   * The transcript of the child session sessionId, announced here or in a
   * child's transcript (a subagent's subagent), or null.
   */
  child(sessionId) {
    if (!sessionId) return null;
    for (const [id, c] of this.children) {
      if (id === sessionId) return c.transcript;
      const t = c.transcript.child(sessionId);
      if (t) return t;
    }
    return null;
  }

  get isEmpty() {
    return !this.el.querySelector(".msg, .tool, .plan, .permission, .notice");
  }

  /** Appends a node, keeping the view pinned to the bottom if it was. */
  #append(node) {
    const pinned = this.#nearBottom();
    this.el.querySelector(".empty")?.remove();
    this.el.appendChild(node);
    if (pinned) this.#scroll();
    return node;
  }

  #nearBottom() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 80;
  }

  #scroll() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  /** Shows node (e.g. the demo's suggestions) while the transcript is empty. */
  showEmpty(node) {
    this.el.querySelector(".empty")?.remove();
    if (this.isEmpty) this.el.appendChild(h("div", { class: "empty" }, node));
  }

  // -- the user's side ------------------------------------------------------

  /** The user's prompt, shown at once (the agent does not echo it live). */
  addUser(text) {
    this.#endStream();
    this.plan = null;
    this.#append(h("div", { class: "msg user" }, h("div", { class: "bubble" }, text)));
    this.#scroll();
  }

  /**
   * A prompt another client of the session sent (prompt_received): a user
   * message "<name>: …". The user_message_chunk copy of it that may
   * follow is dropped.
   */
  addPromptFrom(name, blocks) {
    this.#endStream();
    this.plan = null;
    const list = Array.isArray(blocks) ? blocks : [];
    const text = list.filter((b) => b?.type === "text").map((b) => String(b.text ?? "")).join("");
    const extras = list.filter((b) => b && typeof b === "object" && b.type !== "text").map((b) => renderContentBlock(b));
    this.#append(h("div", { class: "msg user from-other", dataset: { from: name } },
      h("div", { class: "bubble" }, h("span", { class: "msg-from" }, `${name}: `), text),
      extras.length ? h("div", { class: "extras" }, extras) : null));
    this.echo = { text, pos: 0 };
    this.announce(`${name} sent a prompt`);
  }

  /**
   * A prompt is running: announce the reply only when it is done. remote:
   * another client of the session started it (its prompt_received).
   */
  beginTurn({ remote = false } = {}) {
    if (remote) this.remote = true;
    else this.live = true;
    this.elsewhere = [];
    this.el.setAttribute("aria-busy", "true");
  }

  /** No turn is followed any more (the connection closed, the session was left). */
  idle() {
    this.live = false;
    this.remote = false;
    this.el.setAttribute("aria-busy", "false");
  }

  /** The session/prompt response: shows the stop reason. */
  endTurn(stopReason, ms) {
    this.#endStream();
    this.live = false;
    this.remote = false;
    this.echo = null;
    this.el.setAttribute("aria-busy", "false");
    for (const c of this.children.values()) c.transcript.settle();
    for (const p of this.permissions) p.cancel("The turn ended.");
    // A withdrawn card of a turn that ended cancelled was not answered
    // elsewhere: the agent withdrew it (another client cancelled the turn).
    if (stopReason === "cancelled") for (const e of this.elsewhere) e.collapse("Withdrawn: the turn was cancelled.");
    this.elsewhere = [];
    const labels = {
      end_turn: "Done",
      cancelled: "Cancelled",
      max_tokens: "Stopped: token limit",
      max_turn_requests: "Stopped: request limit",
      refusal: "The agent refused",
      error: "Failed",
    };
    const secs = ms != null ? ` · ${(ms / 1000).toFixed(1)} s` : "";
    this.#append(h("div", { class: "turn-end", dataset: { stopReason } },
      h("span", { class: "turn-end-label" }, labels[stopReason] ?? "Stopped"),
      h("span", { class: "turn-end-detail" }, ` · stopReason: ${stopReason}${secs}`)));
    const last = [...this.el.querySelectorAll(":scope > .msg.agent")].pop();
    this.announce(stopReason === "end_turn" ? "Reply complete. " + (last?.textContent ?? "").slice(0, 400) : labels[stopReason] ?? stopReason);
  }

  /**
   * Ends the message being streamed (the turn that wrote it is over: a
   * subagent's parent ended its turn, or the child went idle), here and in
   * this transcript's own children.
   */
  settle() {
    this.#endStream();
    for (const c of this.children.values()) c.transcript.settle();
  }

  /** A line of status or error in the conversation. kind: info|error|warn. */
  notice(text, kind = "info", ...extra) {
    this.#endStream();
    return this.#append(h("div", { class: `notice notice-${kind}`, role: kind === "error" ? "alert" : null }, text, ...extra));
  }

  // -- session/update -------------------------------------------------------

  /** Renders one session/update. Unknown kinds are ignored. */
  update(u) {
    if (!u || typeof u !== "object") return;
    if (u.sessionUpdate !== "user_message_chunk") this.echo = null;
    switch (u.sessionUpdate) {
      case "user_message_chunk":
        // Live prompts of ours are already shown by addUser; the agent's copy
        // is for replays (session/load), so only show it when no prompt of
        // ours runs. Another client's prompt (acpgate sends it so to the
        // session's other clients) shows, unless prompt_received showed it.
        if (!this.live && !this.#isEcho(u.content)) this.#chunk("user", u);
        break;
      case "agent_message_chunk":
        this.#chunk("agent", u);
        break;
      case "agent_thought_chunk":
        this.#chunk("thought", u);
        break;
      case "tool_call":
        this.#endStream();
        this.#tool(u, true);
        break;
      case "tool_call_update":
        this.#tool(u, false);
        break;
      case "plan":
        this.#endStream();
        this.#plan(u.entries ?? []);
        break;
      case "session_info_update":
        if (typeof u.title === "string") this.onTitle(u.title);
        break;
      case "usage_update":
        this.onUsage(u);
        break;
      case "subagent_update":
        this.#subagent(u);
        break;
      case "state_update":
        this.onState(u);
        break;
      default:
        // available_commands_update, current_mode_update, config_option_update
        // and kinds added by newer protocol versions: nothing to show.
        break;
    }
  }

  // Whether a user_message_chunk repeats the prompt addPromptFrom showed
  // last (nothing else came since): it is then dropped.
  #isEcho(block) {
    const e = this.echo;
    if (!e || !block || typeof block !== "object") return false;
    if (block.type !== "text") return true; // an image or resource of that prompt
    const t = String(block.text ?? "");
    if (!e.text.startsWith(t, e.pos)) {
      this.echo = null;
      return false;
    }
    e.pos += t.length;
    return true;
  }

  // Streams a chunk into the open message of the same kind (and messageId),
  // or starts a new one.
  #chunk(kind, u) {
    const block = u.content;
    if (!block || typeof block !== "object") return;
    const messageId = typeof u.messageId === "string" ? u.messageId : null;
    let s = this.stream;
    if (!s || s.kind !== kind || (messageId && s.messageId && messageId !== s.messageId)) {
      this.#endStream();
      s = this.stream = this.#startStream(kind, messageId);
    }
    if (block.type === "text") {
      s.text += typeof block.text === "string" ? block.text : "";
      this.#scheduleRender(s);
    } else {
      s.extras.appendChild(renderContentBlock(block));
    }
  }

  #startStream(kind, messageId) {
    let node, body;
    if (kind === "thought") {
      body = h("div", { class: "thought-body" });
      node = h("details", { class: "thought" }, h("summary", {}, "Thinking"), body);
    } else if (kind === "user") {
      body = h("div", { class: "bubble" });
      node = h("div", { class: "msg user", dataset: { replayed: "true" } }, body);
    } else {
      body = h("div", { class: "md" });
      node = h("div", { class: "msg agent" }, body);
    }
    const extras = h("div", { class: "extras" });
    node.appendChild(extras);
    this.#append(node);
    const view = kind === "user" ? null : new MarkdownView(body);
    return { kind, messageId, node, body, view, extras, text: "", scheduled: false };
  }

  #scheduleRender(s) {
    if (s.scheduled) return;
    s.scheduled = true;
    nextFrame(() => this.#render(s));
  }

  #render(s) {
    s.scheduled = false;
    const pinned = this.#nearBottom();
    if (s.view) s.view.update(s.text);
    else s.body.textContent = s.text;
    s.node.classList.toggle("streaming", this.stream === s);
    if (pinned) this.#scroll();
  }

  #endStream() {
    const s = this.stream;
    if (!s) return;
    this.stream = null;
    this.#render(s); // flush what is left, synchronously
    if (s.kind === "thought") s.node.querySelector("summary").textContent = "Thought";
  }

  // -- tool calls -----------------------------------------------------------

  #tool(u, isNew) {
    const id = String(u.toolCallId ?? "");
    let t = this.tools.get(id);
    if (!t) {
      if (!isNew) this.#endStream();
      t = { data: { toolCallId: id }, el: null };
      this.tools.set(id, t);
    }
    // tool_call_update: only the fields present change; content and
    // locations replace their lists.
    for (const k of ["title", "kind", "status", "content", "locations", "rawInput", "rawOutput"]) {
      if (u[k] !== undefined) t.data[k] = u[k];
    }
    const el = renderTool(t.data);
    if (t.el) t.el.replaceWith(el);
    else this.#append(el);
    t.el = el;
  }

  // -- subagents --------------------------------------------------------------

  // A subagent_update: the agent announces (or updates) a child session.
  // Its transcript nests here, where it was announced, as a collapsible
  // card with the child's title and state; the child's own session/update
  // messages and requests go to it (child()), rendered by this same class.
  // sessionId is the gateway's sealed ID of the child ("" when the gateway
  // could not name it: nothing to show).
  #subagent(u) {
    const id = typeof u.sessionId === "string" ? u.sessionId : "";
    if (!id) return;
    let c = this.children.get(id);
    if (!c) {
      this.#endStream();
      c = new Subagent(id, this);
      this.children.set(id, c);
      this.#append(c.el);
    }
    c.update(u);
  }

  // -- plan ----------------------------------------------------------------

  #plan(entries) {
    const list = h("ol", { class: "plan-entries" });
    let done = 0;
    for (const e of entries) {
      const status = ["pending", "in_progress", "completed"].includes(e?.status) ? e.status : "pending";
      if (status === "completed") done++;
      list.appendChild(h("li", { dataset: { status } },
        h("span", { class: "plan-mark", "aria-hidden": "true" }, PLAN_MARK[status]),
        h("span", { class: "plan-text" }, String(e?.content ?? "")),
        h("span", { class: "visually-hidden" }, ` (${status.replace("_", " ")})`),
        e?.priority && e.priority !== "medium" ? h("span", { class: `plan-prio prio-${e.priority}` }, String(e.priority)) : null));
    }
    const card = h("section", { class: "plan", "aria-label": "Plan" },
      h("header", {}, h("span", { class: "card-kind" }, "Plan"), h("span", { class: "plan-progress" }, `${done} of ${entries.length} done`)),
      list);
    // A plan update replaces the whole plan; keep one card per turn.
    if (this.plan?.isConnected) this.plan.replaceWith(card);
    else this.#append(card);
    this.plan = card;
  }

  // -- permission ------------------------------------------------------------

  /**
   * Shows a session/request_permission and resolves with its outcome when
   * the user picks an option, or {outcome: "cancelled"} if the turn is
   * cancelled, the agent withdraws the request (signal), or another client
   * of a shared session answers it (permissionResolved, or acpgate's
   * $/cancel_request: signal.reason.withdrawn). Read-only, the options are
   * shown but cannot be picked.
   */
  askPermission(params, signal) {
    this.#endStream();
    const tc = params.toolCall ?? {};
    const toolCallId = String(tc.toolCallId ?? "");
    const known = this.tools.get(toolCallId)?.data ?? {};
    const title = tc.title ?? known.title ?? "a tool call";
    const kind = tc.kind ?? known.kind;
    const options = Array.isArray(params.options) ? params.options : [];
    const headingId = "perm-" + Math.random().toString(36).slice(2);
    const buttons = h("div", { class: "perm-options" });
    const outcomeEl = h("p", { class: "perm-outcome", hidden: true });
    const card = h("section", { class: "permission", role: "group", "aria-labelledby": headingId, dataset: { toolCallId } },
      h("header", {}, h("span", { class: "card-kind" }, "Permission"),
        h("span", { id: headingId, class: "perm-title" }, `The ${this.who} asks to: `, h("strong", {}, String(title)))),
      kind ? h("p", { class: "perm-detail" }, `Tool kind: ${kind}`) : null,
      this.readOnly ? h("p", { class: "perm-detail perm-readonly" }, "Read-only: a client that may write answers this.") : null,
      buttons, outcomeEl);

    return new Promise((resolve) => {
      const entry = { card, options, mine: false };
      const show = (text) => {
        outcomeEl.hidden = false;
        outcomeEl.textContent = text;
      };
      const finish = (outcome, text) => {
        if (!this.permissions.has(entry)) return false;
        this.permissions.delete(entry);
        for (const b of buttons.querySelectorAll("button")) b.disabled = true;
        card.classList.add("answered");
        show(text);
        resolve(outcome);
        return true;
      };
      // Answered by another client: the card shrinks to one line.
      entry.collapse = (text) => {
        finish({ outcome: "cancelled" }, text);
        card.classList.add("collapsed");
        show(text);
      };
      entry.cancel = (why) => finish({ outcome: "cancelled" }, `Cancelled. ${why ?? ""}`.trim());
      this.permissions.add(entry);
      if (toolCallId) this.cards.set(toolCallId, entry);
      // A withdrawal ($/cancel_request) is the agent's (after a
      // session/cancel), or acpgate's when another client of a shared
      // session answered first. A page that attached is told which
      // (permission_resolved follows; permissionResolved relabels the
      // card). A plain client is not: "answered elsewhere", unless the turn
      // then ends cancelled (endTurn).
      signal?.addEventListener("abort", () => {
        if (signal.reason?.withdrawn && this.shared && !this.member) {
          entry.collapse("Answered elsewhere");
          this.elsewhere.push(entry);
          this.announce(`Permission for ${title} answered elsewhere`);
        } else {
          entry.cancel("The agent withdrew the request.");
        }
      }, { once: true });

      for (const o of options) {
        const allow = String(o.kind ?? "").startsWith("allow");
        buttons.appendChild(h("button", {
          type: "button",
          class: allow ? "btn btn-primary" : "btn btn-danger",
          disabled: this.readOnly,
          dataset: { optionId: String(o.optionId), kind: String(o.kind ?? "") },
          onclick: () => {
            entry.mine = true;
            finish({ outcome: "selected", optionId: o.optionId }, `You chose: ${o.name ?? o.optionId}`);
            this.#focusAfterPermission();
          },
        }, String(o.name ?? o.optionId)));
      }
      if (!options.length) entry.cancel("The request offered no options.");
      this.#append(card);
      this.#scroll();
      this.announce(`Permission needed: ${title}`);
      if (!this.readOnly) buttons.querySelector("button")?.focus({ preventScroll: true });
    });
  }

  /**
   * A permission request of the session was settled (acpgate's
   * permission_resolved, sent to attached clients): its card, open here
   * or withdrawn, collapses to "allowed by <name>", "rejected by <name>"
   * or "cancelled"; without a card (a read-only client is not asked, and
   * nobody is when the gateway's rule decides: "allowed by the gateway's
   * rule …"), the line is added. selfId: this client's ID (its own answer shows as it is).
   */
  permissionResolved(u, selfId = "") {
    const toolCallId = String(u.toolCallId ?? "");
    const by = u.resolvedBy;
    if (by?.clientId && by.clientId === selfId) return;
    const entry = this.cards.get(toolCallId);
    // Cancelled (by the gateway, in the clients' place) when this card was
    // already settled here (this page cancelled the turn): nothing new.
    if (entry && u.outcome?.outcome !== "selected" && !this.permissions.has(entry)) return;
    const option = entry?.options.find((o) => o?.optionId === u.outcome?.optionId);
    let text = u.policy ? policyText(u.outcome, u.policy) : resolvedText(u.outcome, option, by);
    if (entry?.mine) text += " (your answer came second)";
    const title = this.tools.get(toolCallId)?.data.title;
    if (entry) {
      entry.collapse(text[0].toUpperCase() + text.slice(1));
    } else {
      this.#append(h("div", { class: "permission answered collapsed", dataset: { toolCallId } },
        h("span", { class: "card-kind" }, "Permission"),
        h("p", { class: "perm-outcome" }, title ? `${String(title)}: ${text}` : text)));
    }
    this.announce(`Permission${title ? ` for ${title}` : ""} ${text}`);
  }
  #focusAfterPermission() {
    const next = this.el.querySelector(".permission:not(.answered) button");
    if (next) next.focus();
    else document.getElementById("prompt")?.focus();
  }

  /** Answers every open permission request with "cancelled" (session/cancel). */
  cancelPermissions(why) {
    for (const p of [...this.permissions]) p.cancel(why);
    for (const c of this.children.values()) c.transcript.cancelPermissions(why);
  }
}

const STATE_LABEL = { running: "running", idle: "idle", requires_action: "waiting for you", unknown: "unknown" };

// A subagent's child session shown inside its parent's transcript: a
// <details> card (keyboard-usable as it is: Enter or Space on its summary
// folds it) whose summary names the child (its title, or "Subagent") and
// its state, and whose body is the child's own Transcript.
class Subagent {
  constructor(sessionId, parent) {
    this.titleEl = h("span", { class: "subagent-title" }, "Subagent");
    this.stateEl = h("span", { class: "badge subagent-state", dataset: { state: "unknown" } }, "state not reported");
    const log = h("div", { class: "subagent-log", role: "log", "aria-label": "Subagent transcript" });
    this.el = h("details", { class: "subagent", open: true, dataset: { sessionId } },
      h("summary", {}, h("span", { class: "card-kind" }, "Subagent"), this.titleEl, this.stateEl),
      log);
    this.log = log;
    this.transcript = new Transcript(log, {
      scroller: parent.scroller,
      who: "subagent",
      announce: parent.announce,
      onTitle: (title) => this.#title(title),
      onState: (s) => this.#state(s),
    });
    this.transcript.readOnly = parent.readOnly;
    this.transcript.shared = parent.shared;
    this.transcript.member = parent.member;
    // A permission request of the child opens its card.
    const ask = this.transcript.askPermission.bind(this.transcript);
    this.transcript.askPermission = (params, signal) => {
      this.el.open = true;
      return ask(params, signal);
    };
  }

  // subagent_update: only the fields present change (null clears).
  update(u) {
    if (u.title !== undefined) this.#title(u.title);
    if (u.state !== undefined) this.#state(u.state);
  }

  #title(title) {
    const t = typeof title === "string" && title ? title : "Subagent";
    this.titleEl.textContent = t;
    this.log.setAttribute("aria-label", `Subagent transcript: ${t}`);
  }

  // A state snapshot: a subagent_update's {state: "running"|…} or the
  // child's own state_update.
  #state(s) {
    const state = typeof s?.state === "string" ? s.state : "unknown";
    const why = state === "idle" && typeof s.stopReason === "string" && s.stopReason !== "end_turn" ? ` (${s.stopReason})` : "";
    this.stateEl.dataset.state = state;
    if (state === "idle") this.transcript.settle();
    this.stateEl.textContent = (s == null ? "state not reported" : STATE_LABEL[state] ?? state) + why;
  }
}

// ---------------------------------------------------------------------------
// Pieces

// "allowed by <name> (Allow once)", "rejected by …", "cancelled": the
// outcome of a permission_resolved. option: the card's
// option with that optionId, if the card is here (its kind tells allow from
// reject; without it, the optionId's name does).
function resolvedText(outcome, option, by) {
  if (outcome?.outcome !== "selected") return "cancelled";
  const kind = String(option?.kind ?? outcome.optionId ?? "");
  const verb = kind.startsWith("allow") ? "allowed" : kind.startsWith("reject") ? "rejected" : "answered";
  const who = by?.name ? ` by ${by.name}` : "";
  const what = String(option?.name ?? outcome.optionId ?? "");
  return `${verb}${who}${what ? ` (${what})` : ""}`;
}

// "allowed by the gateway's rule permissions[0] {…}", "rejected by …",
// "cancelled by …": a permission_resolved the gateway's standing rule
// settled (policy: {rule, decide}); no client was asked.
function policyText(outcome, policy) {
  const verb = outcome?.outcome !== "selected" ? "cancelled" : policy.decide === "allow" ? "allowed" : "rejected";
  return `${verb} by the gateway's rule ${String(policy.rule ?? "")}`.trim();
}

function renderTool(d) {
  const status = ["pending", "in_progress", "completed", "failed"].includes(d.status) ? d.status : "pending";
  const kind = typeof d.kind === "string" ? d.kind : "other";
  const el = h("article", { class: "tool", dataset: { toolCallId: d.toolCallId, status, kind } },
    h("header", {},
      h("span", { class: "card-kind" }, KIND_LABEL[kind] ?? kind),
      h("span", { class: "tool-title" }, String(d.title ?? "Tool call")),
      h("span", { class: `badge status-${status}` }, status.replace("_", " "))));

  if (Array.isArray(d.locations) && d.locations.length) {
    el.appendChild(h("ul", { class: "locations", "aria-label": "Locations" },
      d.locations.map((l) => h("li", {}, h("code", {}, String(l?.path ?? "") + (Number.isInteger(l?.line) ? `:${l.line}` : ""))))));
  }
  if (Array.isArray(d.content) && d.content.length) {
    const box = h("div", { class: "tool-content" });
    for (const c of d.content) {
      if (c?.type === "diff") box.appendChild(renderDiff(c));
      else if (c?.type === "content") box.appendChild(renderContentBlock(c.content, { pre: true }));
      else if (c?.type === "terminal") box.appendChild(h("p", { class: "muted" }, `Terminal ${String(c.terminalId ?? "")}`));
    }
    el.appendChild(box);
  }
  for (const [k, label] of [["rawInput", "Input"], ["rawOutput", "Output"]]) {
    if (d[k] !== undefined && d[k] !== null) {
      el.appendChild(h("details", { class: "raw" }, h("summary", {}, label),
        h("pre", { tabindex: "0" }, typeof d[k] === "string" ? d[k] : JSON.stringify(d[k], null, 2))));
    }
  }
  return el;
}

/** A ContentBlock (text, image, resource_link, resource…) as DOM. */
export function renderContentBlock(b, { pre = false } = {}) {
  switch (b?.type) {
    case "text":
      return pre ? h("pre", { class: "tool-text", tabindex: "0" }, String(b.text ?? "")) : h("p", {}, String(b.text ?? ""));
    case "image": {
      if (!IMAGE_TYPES.test(String(b.mimeType)) || typeof b.data !== "string" || !/^[A-Za-z0-9+/=\s]*$/.test(b.data)) {
        return h("p", { class: "muted" }, `[image: ${String(b.mimeType ?? "unknown type")}]`);
      }
      const img = h("img", { class: "content-image", alt: "Image from the agent" });
      img.src = `data:${b.mimeType};base64,${b.data.replace(/\s/g, "")}`;
      return img;
    }
    case "resource_link": {
      const label = String(b.title ?? b.name ?? b.uri ?? "resource");
      const href = safeHref(String(b.uri ?? ""));
      if (href) {
        const a = h("a", { target: "_blank", rel: "noopener noreferrer" }, label);
        a.href = href;
        return h("p", { class: "resource" }, "Link: ", a);
      }
      return h("p", { class: "resource" }, "Resource: ", h("code", {}, String(b.uri ?? label)));
    }
    case "resource": {
      const r = b.resource ?? {};
      return h("details", { class: "raw" }, h("summary", {}, `Embedded ${String(r.uri ?? "resource")}`),
        h("pre", { tabindex: "0" }, typeof r.text === "string" ? r.text : "[binary]"));
    }
    case "audio":
      return h("p", { class: "muted" }, "[audio]");
    default:
      return h("p", { class: "muted" }, `[${String(b?.type ?? "unknown")} content]`);
  }
}

// ---------------------------------------------------------------------------
// Diffs

const CONTEXT = 3;
const MAX_LCS = 4_000_000; // cells; bigger diffs show as remove-all/add-all

/** A line diff: [{op: " "|"-"|"+", text}]. */
export function diffLines(oldText, newText) {
  const a = oldText ? oldText.replace(/\n$/, "").split("\n") : [];
  const b = newText ? newText.replace(/\n$/, "").split("\n") : [];
  // Trim the common prefix and suffix, then LCS on the middle.
  let pre = 0;
  while (pre < a.length && pre < b.length && a[pre] === b[pre]) pre++;
  let suf = 0;
  while (suf < a.length - pre && suf < b.length - pre && a[a.length - 1 - suf] === b[b.length - 1 - suf]) suf++;
  const am = a.slice(pre, a.length - suf);
  const bm = b.slice(pre, b.length - suf);
  const out = a.slice(0, pre).map((t) => ({ op: " ", text: t }));
  if ((am.length + 1) * (bm.length + 1) > MAX_LCS) {
    out.push(...am.map((t) => ({ op: "-", text: t })), ...bm.map((t) => ({ op: "+", text: t })));
  } else {
    const n = am.length;
    const m = bm.length;
    const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        L[i][j] = am[i] === bm[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && am[i] === bm[j]) {
        out.push({ op: " ", text: am[i++] });
        j++;
      } else if (j < m && (i >= n || L[i][j + 1] >= L[i + 1][j])) {
        out.push({ op: "+", text: bm[j++] });
      } else {
        out.push({ op: "-", text: am[i++] });
      }
    }
  }
  out.push(...a.slice(a.length - suf).map((t) => ({ op: " ", text: t })));
  return out;
}

function renderDiff(c) {
  const lines = diffLines(typeof c.oldText === "string" ? c.oldText : "", typeof c.newText === "string" ? c.newText : "");
  const added = lines.filter((l) => l.op === "+").length;
  const removed = lines.filter((l) => l.op === "-").length;
  const body = h("pre", { class: "diff-body", tabindex: "0" });
  // Show changed lines with CONTEXT lines around them; fold the rest.
  const keep = lines.map(() => false);
  lines.forEach((l, i) => {
    if (l.op !== " ") for (let k = Math.max(0, i - CONTEXT); k <= Math.min(lines.length - 1, i + CONTEXT); k++) keep[k] = true;
  });
  let folded = 0;
  const flushFold = () => {
    if (folded) body.appendChild(h("span", { class: "diff-line diff-fold" }, `⋯ ${folded} unchanged line${folded === 1 ? "" : "s"}`));
    folded = 0;
  };
  lines.forEach((l, i) => {
    if (!keep[i]) {
      folded++;
      return;
    }
    flushFold();
    const cls = l.op === "+" ? "diff-add" : l.op === "-" ? "diff-del" : "diff-ctx";
    body.appendChild(h("span", { class: `diff-line ${cls}` }, h("span", { class: "diff-op" }, l.op), l.text));
  });
  flushFold();
  const isNew = c.oldText === null || c.oldText === undefined;
  return h("figure", { class: "diff" },
    h("figcaption", {},
      h("code", {}, String(c.path ?? "")),
      h("span", { class: "diff-stat" },
        isNew ? h("span", { class: "diff-newfile" }, "new file ") : null,
        h("span", { class: "diff-stat-add" }, `+${added}`), " ",
        h("span", { class: "diff-stat-del" }, `−${removed}`))),
    body);
}
