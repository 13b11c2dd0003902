// launch.mjs: what the browser scripts (test/browser/e2e.mjs,
// test/scale/browser.mjs) share: Debian's chromium started headless by the
// playwright-core that test/browser installs (cd test/browser && npm ci),
// a timestamped log, failures, and the requests to the Go harness
// (chromium.go): the script prints "@@harness <action>" and waits for "ok"
// (or "error") on stdin.
//
// Environment:
//   ACPGATE_CHROMIUM   the browser (default /usr/bin/chromium)

import { createRequire } from "node:module";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const here = dirname(fileURLToPath(import.meta.url));
const { chromium } = createRequire(join(here, "..", "..", "browser", "package.json"))("playwright-core");

const t0 = Date.now();

// log prints its arguments after the seconds since the script started.
export const log = (...a) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s]`, ...a);

// Failure is a failed check (reported without its stack).
export class Failure extends Error {}

export function check(cond, msg) {
  if (!cond) throw new Failure(msg);
}

const stdinLines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// harness asks the Go test to carry out action and waits for its "ok".
export async function harness(action) {
  console.log(`@@harness ${action}`);
  const { value, done } = await stdinLines.next();
  check(!done && value.trim() === "ok", `harness ${action}: got ${done ? "EOF" : JSON.stringify(value)}`);
}

// launch starts the browser.
export function launch() {
  return chromium.launch({
    executablePath: process.env.ACPGATE_CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
}
