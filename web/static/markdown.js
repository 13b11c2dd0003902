// markdown.js: a small, safe Markdown renderer for agent output.
//
// Safety: the output is built from DOM nodes. Text is only ever set with
// createTextNode / textContent, never innerHTML, so raw HTML in the input
// (e.g. `<img src=x onerror=…>`) shows as the characters it is. The only
// attribute taken from the input is a link's href, and only for http: and
// https: URLs (links open in a new tab with rel="noopener noreferrer"); any
// other link shows as its text.
//
// Supported: ATX headings (#…######), paragraphs (a single newline is a line
// break, as in chat), bullet and ordered lists (nested by indentation),
// fenced code blocks (``` or ~~~, with a language label), block quotes,
// horizontal rules; inline code, **bold**, *italic*, ~~strike~~, [links](…),
// <https://autolinks> and bare https:// URLs, and backslash escapes.
//
// Streaming: MarkdownView.update(fullText) re-renders only the blocks that
// changed since the last call (usually just the last one), so a reply can be
// updated on every chunk; an unclosed code fence renders as a code block
// until its closing fence arrives.

/** Renders Markdown text into a DocumentFragment. */
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  for (const b of parseBlocks(text)) frag.appendChild(renderBlock(b));
  return frag;
}

/** Keeps a container in sync with a growing Markdown text. */
export class MarkdownView {
  constructor(container) {
    this.el = container;
    this.rendered = []; // [{key, node}]
    this.text = "";
  }

  update(text) {
    if (text === this.text) return;
    this.text = text;
    const blocks = parseBlocks(text);
    let same = 0;
    while (same < blocks.length && same < this.rendered.length && this.rendered[same].key === blocks[same].key) same++;
    for (const r of this.rendered.splice(same)) r.node.remove();
    for (const b of blocks.slice(same)) {
      const node = renderBlock(b);
      this.el.appendChild(node);
      this.rendered.push({ key: b.key, node });
    }
  }
}

// ---------------------------------------------------------------------------
// Blocks

const RE = {
  fence: /^( {0,3})(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$/,
  heading: /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/,
  hr: /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/,
  quote: /^ {0,3}> ?(.*)$/,
  item: /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$/,
  blank: /^[ \t]*$/,
};

function isBlockStart(line) {
  return RE.fence.test(line) || RE.heading.test(line) || RE.hr.test(line) || RE.quote.test(line) || RE.item.test(line);
}

function leadingSpaces(line) {
  let n = 0;
  for (const c of line) {
    if (c === " ") n++;
    else if (c === "\t") n += 4;
    else break;
  }
  return n;
}

function dedent(line, n) {
  let i = 0;
  let cut = 0;
  while (i < line.length && cut < n && (line[i] === " " || line[i] === "\t")) {
    cut += line[i] === "\t" ? 4 : 1;
    i++;
  }
  return line.slice(i);
}

/**
 * Splits text into blocks: {type, key, …}. key identifies a block's type
 * and source, so unchanged blocks can be kept while streaming.
 */
export function parseBlocks(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let i = 0;
  const push = (b, from, to) => {
    b.key = b.type + "\u0000" + lines.slice(from, to).join("\n") + (b.open ? "\u0000open" : "");
    blocks.push(b);
  };

  while (i < lines.length) {
    const line = lines[i];
    const start = i;
    let m;

    if (RE.blank.test(line)) {
      i++;
      continue;
    }

    if ((m = RE.fence.exec(line))) {
      const indent = m[1].length;
      const fence = m[2];
      const lang = m[3] || "";
      const body = [];
      i++;
      let open = true;
      while (i < lines.length) {
        const l = lines[i];
        const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(l);
        if (close && close[1][0] === fence[0] && close[1].length >= fence.length) {
          open = false;
          i++;
          break;
        }
        body.push(dedent(l, indent));
        i++;
      }
      push({ type: "code", lang, code: body.join("\n"), open }, start, i);
      continue;
    }

    if ((m = RE.heading.exec(line))) {
      i++;
      push({ type: "heading", level: m[1].length, text: m[2] || "" }, start, i);
      continue;
    }

    if (RE.hr.test(line)) {
      i++;
      push({ type: "hr" }, start, i);
      continue;
    }

    if (RE.quote.test(line)) {
      const inner = [];
      while (i < lines.length && !RE.blank.test(lines[i])) {
        const q = RE.quote.exec(lines[i]);
        if (q) inner.push(q[1]);
        else if (isBlockStart(lines[i])) break;
        else inner.push(lines[i]); // lazy continuation
        i++;
      }
      push({ type: "quote", children: parseBlocks(inner.join("\n")) }, start, i);
      continue;
    }

    if ((m = RE.item.exec(line))) {
      const list = parseList(lines, i);
      i = list.end;
      push(list.block, start, i);
      continue;
    }

    // Paragraph: up to a blank line or the start of another block.
    const para = [line];
    i++;
    while (i < lines.length && !RE.blank.test(lines[i]) && !isBlockStart(lines[i])) {
      para.push(lines[i]);
      i++;
    }
    push({ type: "para", text: para.map((l) => l.trim()).join("\n") }, start, i);
  }
  return blocks;
}

function parseList(lines, i) {
  const first = RE.item.exec(lines[i]);
  const ordered = /\d/.test(first[2]);
  const startNum = ordered ? parseInt(first[2], 10) : 1;
  const baseIndent = first[1].length;
  const items = [];
  let cur = null;
  let blankBefore = false;

  while (i < lines.length) {
    const line = lines[i];
    if (RE.blank.test(line)) {
      blankBefore = true;
      if (cur) cur.lines.push("");
      i++;
      continue;
    }
    const m = RE.item.exec(line);
    const indent = leadingSpaces(line);
    if (m && indent <= baseIndent + 1 && /\d/.test(m[2]) === ordered && !RE.hr.test(line)) {
      // A sibling item.
      const markerWidth = m[1].length + m[2].length + 1;
      cur = { lines: [m[3] || ""], contentIndent: markerWidth };
      items.push(cur);
      blankBefore = false;
      i++;
      continue;
    }
    if (cur && indent >= Math.min(cur.contentIndent, baseIndent + 2)) {
      // Belongs to the current item (a continuation or a nested block).
      cur.lines.push(dedent(line, Math.min(indent, cur.contentIndent)));
      blankBefore = false;
      i++;
      continue;
    }
    if (cur && !blankBefore && !isBlockStart(line)) {
      cur.lines.push(line.trim()); // lazy paragraph continuation
      i++;
      continue;
    }
    break;
  }
  // Trailing blank lines belong to no item.
  for (const it of items) {
    while (it.lines.length > 1 && it.lines[it.lines.length - 1] === "") it.lines.pop();
  }
  const block = {
    type: "list",
    ordered,
    start: startNum,
    items: items.map((it) => parseBlocks(it.lines.join("\n"))),
  };
  return { block, end: i };
}

function renderBlock(b) {
  switch (b.type) {
    case "heading": {
      // Agent headings sit inside a message: shift them down so that they
      // never outrank the page's own headings (h1 -> h3, …, capped at h6).
      const el = document.createElement("h" + Math.min(6, b.level + 2));
      el.className = "md-h md-h" + b.level;
      el.append(...parseInline(b.text));
      return el;
    }
    case "hr":
      return document.createElement("hr");
    case "code":
      return renderCode(b);
    case "quote": {
      const el = document.createElement("blockquote");
      for (const c of b.children) el.appendChild(renderBlock(c));
      return el;
    }
    case "list": {
      const el = document.createElement(b.ordered ? "ol" : "ul");
      if (b.ordered && b.start !== 1) el.start = b.start;
      for (const itemBlocks of b.items) {
        const li = document.createElement("li");
        if (itemBlocks.length === 1 && itemBlocks[0].type === "para") {
          li.append(...parseInline(itemBlocks[0].text)); // a tight item: no <p>
        } else {
          for (const c of itemBlocks) li.appendChild(renderBlock(c));
        }
        el.appendChild(li);
      }
      return el;
    }
    default: {
      const p = document.createElement("p");
      p.append(...parseInline(b.text));
      return p;
    }
  }
}

function renderCode(b) {
  const fig = document.createElement("div");
  fig.className = "md-code";
  if (b.lang) {
    const label = document.createElement("span");
    label.className = "md-code-lang";
    label.textContent = b.lang;
    fig.appendChild(label);
  }
  const pre = document.createElement("pre");
  const code = document.createElement("code");
  if (/^[\w+#.-]{1,32}$/.test(b.lang)) code.className = "language-" + b.lang;
  code.textContent = b.code;
  pre.appendChild(code);
  pre.tabIndex = 0; // scrollable: reachable by keyboard
  fig.appendChild(pre);
  return fig;
}

// ---------------------------------------------------------------------------
// Inline

const PUNCT = /[!"#$%&'()*+,\-./:;<=>?@[\\\]^_`{|}~]/;
const ALNUM = /[\p{L}\p{N}]/u;
const AUTOLINK = /^<(https?:\/\/[^\s<>]+)>/;
const BARE_URL = /^https?:\/\/[^\s<>"]*[^\s<>"().,;:!?'\]]/;

/** Only http(s) URLs become links. Returns the normalized href, or "". */
export function safeHref(url) {
  try {
    const u = new URL(url);
    return u.protocol === "http:" || u.protocol === "https:" ? u.href : "";
  } catch {
    return "";
  }
}

function link(href, children) {
  const a = document.createElement("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  a.append(...children);
  return a;
}

// Finds the closing delimiter for an emphasis run starting at `from`,
// skipping escapes and code spans. Returns its index or -1.
function findClose(s, from, delim) {
  for (let j = from; j < s.length; j++) {
    const c = s[j];
    if (c === "\\") {
      j++;
      continue;
    }
    if (c === "`") {
      const run = /^`+/.exec(s.slice(j))[0];
      const end = s.indexOf(run, j + run.length);
      if (end > 0) {
        j = end + run.length - 1;
        continue;
      }
    }
    if (s.startsWith(delim, j) && j > from && !/\s/.test(s[j - 1])) {
      if (delim.length === 1 && s[j + 1] === delim) {
        // "**" inside "*…*": step over the pair.
        const close = findClose(s, j + 2, delim + delim);
        if (close > 0) {
          j = close + 1;
          continue;
        }
      }
      if (delim[0] === "_" && ALNUM.test(s[j + delim.length] || "")) continue; // intraword _
      return j;
    }
  }
  return -1;
}

/** Parses inline Markdown into an array of DOM nodes. */
export function parseInline(s) {
  const out = [];
  let text = "";
  const flush = () => {
    if (text) out.push(document.createTextNode(text));
    text = "";
  };

  let i = 0;
  while (i < s.length) {
    const c = s[i];
    const rest = () => s.slice(i); // only taken where a pattern must match here

    if (c === "\\" && i + 1 < s.length && PUNCT.test(s[i + 1])) {
      text += s[i + 1];
      i += 2;
      continue;
    }
    if (c === "\n") {
      flush();
      out.push(document.createElement("br"));
      i++;
      continue;
    }
    if (c === "`") {
      const run = /^`+/.exec(rest())[0];
      const end = s.indexOf(run, i + run.length);
      if (end > 0 && s[end + run.length] !== "`") {
        let code = s.slice(i + run.length, end).replace(/\n/g, " ");
        if (code.length > 2 && code.startsWith(" ") && code.endsWith(" ")) code = code.slice(1, -1);
        flush();
        const el = document.createElement("code");
        el.textContent = code;
        out.push(el);
        i = end + run.length;
        continue;
      }
      text += run;
      i += run.length;
      continue;
    }
    if (c === "[") {
      const m = matchLink(s, i);
      if (m) {
        flush();
        const children = parseInline(m.label);
        const href = safeHref(m.url);
        if (href) out.push(link(href, children));
        else out.push(...children); // not http(s): just the text
        i = m.end;
        continue;
      }
    }
    // An autolink (<https://…>) or a bare URL: a link with the URL as its text.
    const auto =
      c === "<" ? AUTOLINK.exec(rest()) : c === "h" && (i === 0 || !ALNUM.test(s[i - 1])) ? BARE_URL.exec(rest()) : null;
    const url = auto && (auto[1] ?? auto[0]);
    const href = url && safeHref(url);
    if (href) {
      flush();
      out.push(link(href, [document.createTextNode(url)]));
      i += auto[0].length;
      continue;
    }
    if (c === "*" || c === "_" || c === "~") {
      const double = s[i + 1] === c;
      const delim = double ? c + c : c;
      const leftOk = c !== "_" || i === 0 || !ALNUM.test(s[i - 1]);
      const next = s[i + delim.length];
      if ((c !== "~" || double) && leftOk && next && !/\s/.test(next)) {
        const close = findClose(s, i + delim.length, delim);
        if (close > 0) {
          flush();
          const el = document.createElement(c === "~" ? "del" : double ? "strong" : "em");
          el.append(...parseInline(s.slice(i + delim.length, close)));
          out.push(el);
          i = close + delim.length;
          continue;
        }
      }
      // Not emphasis: the whole run is text (so "**" is never re-read as "*").
      const run = new RegExp("^\\" + c + "+").exec(rest())[0];
      text += run;
      i += run.length;
      continue;
    }
    text += c;
    i++;
  }
  flush();
  return out;
}

// [label](url "title") starting at s[i] === "[". Returns {label, url, end} or null.
function matchLink(s, i) {
  let depth = 0;
  let j = i;
  for (; j < s.length; j++) {
    if (s[j] === "\\") {
      j++;
      continue;
    }
    if (s[j] === "[") depth++;
    else if (s[j] === "]" && --depth === 0) break;
  }
  if (j >= s.length || s[j + 1] !== "(") return null;
  const m = /^\(\s*(<[^<>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+"[^"]*"|\s+'[^']*')?\s*\)/.exec(s.slice(j + 1));
  if (!m) return null;
  let url = m[1];
  if (url.startsWith("<")) url = url.slice(1, -1);
  return { label: s.slice(i + 1, j), url, end: j + 1 + m[0].length };
}
