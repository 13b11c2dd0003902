// files.js: the in-browser workspace that answers the agent's
// fs/read_text_file and fs/write_text_file requests. It is a map from
// absolute path to text, kept in localStorage, with a panel to edit it.
// When "Allow file access" is off, the agent's requests are refused.

import { h, clear } from "./dom.js";
import { AcpError, ErrorCode } from "./acp.js";

/** Cleans an absolute POSIX path (//, ., ..). Returns null if it is not absolute. */
export function normalizePath(p) {
  if (typeof p !== "string" || !p.startsWith("/")) return null;
  const out = [];
  for (const part of p.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") out.pop();
    else out.push(part);
  }
  return "/" + out.join("/");
}

/** path -> content, persisted in localStorage. Fires "change" events. */
export class VirtualFiles extends EventTarget {
  constructor(storageKey = "acpgate.files") {
    super();
    this.key = storageKey;
    this.map = new Map();
    try {
      const saved = JSON.parse(localStorage.getItem(this.key) ?? "null");
      if (saved && typeof saved === "object") {
        for (const [k, v] of Object.entries(saved)) if (typeof v === "string") this.map.set(k, v);
      }
    } catch {
      // unreadable storage: start empty
    }
  }

  #save() {
    try {
      localStorage.setItem(this.key, JSON.stringify(Object.fromEntries(this.map)));
    } catch {
      // full or disabled storage: keep the files in memory only
    }
  }

  has(path) {
    return this.map.has(normalizePath(path));
  }
  get(path) {
    return this.map.get(normalizePath(path));
  }
  paths() {
    return [...this.map.keys()].sort();
  }
  set(path, content, by = "user") {
    const p = normalizePath(path);
    if (!p) throw new TypeError("the path must be absolute, like /tmp/notes.txt");
    const created = !this.map.has(p);
    this.map.set(p, content);
    this.#save();
    this.dispatchEvent(new CustomEvent("change", { detail: { path: p, by, created } }));
    return p;
  }
  delete(path) {
    const p = normalizePath(path);
    if (this.map.delete(p)) {
      this.#save();
      this.dispatchEvent(new CustomEvent("change", { detail: { path: p, by: "user", deleted: true } }));
    }
  }
}

/**
 * The panel: the file list, an editor, the "Allow file access" switch and
 * a log of what the agent read and wrote. Also the fs/* request handlers.
 */
export class FilePanel {
  constructor(files, els, { announce = () => {}, onRefused = () => {} } = {}) {
    this.files = files;
    this.els = els; // {allow, list, form, path, content, newBtn, deleteBtn, status, log}
    this.announce = announce;
    this.onRefused = onRefused;
    this.selected = null;
    this.dirty = false;

    els.allow.checked = localStorage.getItem("acpgate.fsAllow") === "1";
    els.allow.addEventListener("change", () => {
      localStorage.setItem("acpgate.fsAllow", els.allow.checked ? "1" : "0");
      this.#status(els.allow.checked ? "The agent may read and write these files." : "File access is off: the agent's requests are refused.");
    });
    els.form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.save();
    });
    els.content.addEventListener("input", () => {
      this.dirty = true;
    });
    els.newBtn.addEventListener("click", () => this.select(null, { focus: true }));
    els.deleteBtn.addEventListener("click", () => {
      if (!this.selected) return;
      const p = this.selected;
      this.files.delete(p);
      this.select(null);
      this.#status(`Deleted ${p}.`);
    });
    files.addEventListener("change", (ev) => this.#changed(ev.detail));
    this.renderList();
    this.select(files.paths()[0] ?? null);
  }

  get allowed() {
    return this.els.allow.checked;
  }

  setAllowed(on) {
    this.els.allow.checked = on;
    this.els.allow.dispatchEvent(new Event("change"));
  }

  renderList() {
    const { list } = this.els;
    clear(list);
    const paths = this.files.paths();
    if (!paths.length) {
      list.appendChild(h("li", { class: "muted" }, "No files yet. Add one below."));
      return;
    }
    for (const p of paths) {
      const size = new TextEncoder().encode(this.files.get(p)).length;
      list.appendChild(h("li", {},
        h("button", {
          type: "button",
          class: "file-item",
          "aria-current": p === this.selected ? "true" : null,
          dataset: { path: p },
          onclick: () => this.select(p, { focus: true }),
        }, h("span", { class: "file-name" }, p), h("span", { class: "file-size" }, `${size} B`))));
    }
  }

  select(path, { focus = false } = {}) {
    this.selected = path && this.files.has(path) ? path : null;
    this.els.path.value = this.selected ?? "";
    this.els.content.value = this.selected ? this.files.get(this.selected) : "";
    this.els.deleteBtn.disabled = !this.selected;
    this.dirty = false;
    this.renderList();
    if (focus) (this.selected ? this.els.content : this.els.path).focus();
  }

  save() {
    const raw = this.els.path.value.trim();
    const p = normalizePath(raw);
    if (!p || p === "/") {
      this.#status("The path must be absolute, like /tmp/notes.txt.", true);
      this.els.path.focus();
      return;
    }
    if (this.selected && this.selected !== p) this.files.delete(this.selected); // a rename
    this.files.set(p, this.els.content.value, "user");
    this.dirty = false;
    this.select(p);
    this.#status(`Saved ${p}.`);
  }

  #changed({ path, by, deleted }) {
    this.renderList();
    if (by === "agent" && !deleted) {
      if (path === this.selected && this.dirty) {
        this.#status(`The agent changed ${path} while you were editing it; your text is kept. Reopen the file to see the agent's version.`, true);
      } else if (path === this.selected || !this.dirty) {
        this.select(path);
      }
      this.els.list.querySelector(`[data-path="${CSS.escape(path)}"]`)?.classList.add("flash");
    }
  }

  #status(text, isError = false) {
    this.els.status.textContent = text;
    this.els.status.classList.toggle("error", isError);
  }

  #log(text, ok = true) {
    const { log } = this.els;
    log.prepend(h("li", { class: ok ? "" : "refused" }, h("time", {}, new Date().toLocaleTimeString()), " ", text));
    while (log.children.length > 6) log.lastChild.remove();
  }

  // -- the agent's requests (registered with AcpConnection.handle) ----------

  /** fs/read_text_file {path, line?, limit?} -> {content} */
  read(params) {
    const path = normalizePath(params.path);
    if (!this.allowed) return this.#refuse("read", params.path);
    if (!path || !this.files.has(path)) {
      this.#log(`Agent read ${params.path}: no such file`, false);
      throw new AcpError(ErrorCode.RESOURCE_NOT_FOUND, `file not found: ${params.path}`, { path: params.path });
    }
    let content = this.files.get(path);
    // line is 1-based; limit is a number of lines.
    if (Number.isInteger(params.line) || Number.isInteger(params.limit)) {
      const lines = content.split("\n");
      const from = Math.max(0, (params.line ?? 1) - 1);
      const to = Number.isInteger(params.limit) ? from + Math.max(0, params.limit) : lines.length;
      content = lines.slice(from, to).join("\n");
    }
    this.#log(`Agent read ${path}`);
    return { content };
  }

  /** fs/write_text_file {path, content} -> {} */
  write(params) {
    const path = normalizePath(params.path);
    if (!this.allowed) return this.#refuse("write", params.path);
    if (!path || typeof params.content !== "string") {
      throw new AcpError(ErrorCode.INVALID_PARAMS, "fs/write_text_file needs an absolute path and a content string");
    }
    this.files.set(path, params.content, "agent");
    this.#log(`Agent wrote ${path}`);
    this.announce(`The agent wrote ${path}`);
    return {};
  }

  #refuse(what, path) {
    this.#log(`Refused the agent's ${what} of ${path}: file access is off`, false);
    this.onRefused(what, path);
    throw new AcpError(ErrorCode.INTERNAL_ERROR, `file access is turned off in the client (${what} ${path} refused)`);
  }
}
