// dom.js: the one way this client builds DOM. Text goes in through text
// nodes only; there is no innerHTML anywhere in the client, so nothing an
// agent sends can become markup.

/**
 * h("button", {class: "btn", type: "button", onclick: fn}, "Text", child…)
 * Attribute names are always written by this code; values may be data.
 * on* keys add event listeners; strings and numbers become text nodes.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2), v);
    } else if (k === "class") {
      el.className = v;
    } else if (k === "dataset") {
      Object.assign(el.dataset, v);
    } else if (k === "text") {
      el.textContent = v;
    } else if (k === "href" || k === "src" || /^on/i.test(k) || k === "style" || k === "srcdoc") {
      throw new Error(`h(): set ${k} explicitly after checking it`);
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Removes all children. */
export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
}

/** Replaces the children of el. */
export function replace(el, ...children) {
  clear(el);
  append(el, children);
}

/** Runs fn on the next frame (or soon, if the page is hidden and frames stop). */
export function nextFrame(fn) {
  if (document.hidden) setTimeout(fn, 16);
  else requestAnimationFrame(fn);
}

/** "3 s ago", "5 min ago", or a date. */
export function relativeTime(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 5) return "just now";
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}
