/**
 * The checks every function's options go through, so that a plain JavaScript
 * caller learns at run time what TypeScript would have told it: an unknown
 * option (a typo, or a name of TanStack AI's `@tanstack/ai-sandbox` API that
 * means something else here) is INVALID_ARGUMENT, never silently ignored.
 */
import path from "node:path";

import type { CallOptions } from "./client.js";
import { invalidArgument } from "./errors.js";

/** The options every call takes (see `CallOptions`). */
export const CALL_OPTION_KEYS = ["timeoutMs", "signal", "waitForReady", "metadata"] as const;

/** What the reference API's own option names mean with a daemon. */
const REFERENCE_HINTS: Readonly<Record<string, string>> = {
  handle: "the daemon holds the sandbox's workspace: pass `client` (from connect()) instead",
  checkpoints: "the daemon holds the checkpoint store: pass `client` (from connect()) instead",
  blobs: "the daemon holds the blobs: pass `client` (from connect()) instead",
};

/**
 * Throws INVALID_ARGUMENT when `options` is not an object or holds a key
 * outside `allowed` (and, unless `call` is false, the call options).
 */
export function checkOptions(fn: string, options: unknown, allowed: readonly string[], call = true): void {
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    throw invalidArgument(`${fn}: options must be an object, not ${describe(options)}`, {
      field: "options",
    });
  }
  const known = [...allowed, ...(call ? CALL_OPTION_KEYS : [])];
  for (const [key, value] of Object.entries(options)) {
    checkText(fn, key, value);
    if (known.includes(key)) continue;
    const near = known.find((name) => editDistance(name.toLowerCase(), key.toLowerCase()) <= 2);
    const hint = REFERENCE_HINTS[key] ?? (near ? `did you mean \`${near}\`?` : `known: ${known.join(", ")}`);
    throw invalidArgument(`${fn}: unknown option \`${key}\`: ${hint}`, { field: key });
  }
}

// A lone UTF-16 surrogate: UTF-8 cannot carry it, so the wire would silently
// turn it into U+FFFD and name another thread or checkpoint.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * An id option (`threadId`, `checkpointId`, `sourceThreadId`, ...) must be a
 * string, and every string option well-formed Unicode: else INVALID_ID for an
 * id, INVALID_ARGUMENT for anything else, naming the option.
 */
function checkText(fn: string, key: string, value: unknown): void {
  const isId = /Id$/.test(key) && key !== "requestId";
  const code = isId ? "SANDBOX_SNAPSHOT_INVALID_ID" : "SANDBOX_SNAPSHOT_INVALID_ARGUMENT";
  if (isId && value !== undefined && typeof value !== "string") {
    throw invalidArgument(`${fn}: ${key} must be a string, not ${describe(value)}`, { field: key }, code);
  }
  if (typeof value === "string" && LONE_SURROGATE.test(value)) {
    throw invalidArgument(`${fn}: ${key} is not well-formed Unicode (a lone surrogate)`, { field: key }, code);
  }
}

/** Levenshtein distance, for "did you mean" (option names are short). */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const substitution = previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1);
      current.push(Math.min(previous[j]! + 1, current[j - 1]! + 1, substitution));
    }
    previous = current;
  }
  return previous[b.length]!;
}

function describe(value: unknown): string {
  if (value === null) return "null";
  return Array.isArray(value) ? "an array" : typeof value;
}

/** The call options of a function's options object. */
export function callOptions(options: CallOptions): CallOptions {
  return {
    timeoutMs: options.timeoutMs,
    signal: options.signal,
    waitForReady: options.waitForReady,
    metadata: options.metadata,
  };
}

/**
 * The request's `workspace_subdir` for a call given `workspaceRoot` (an absolute
 * path, as the reference API takes it) or `workspaceSubdir` (relative to the
 * daemon's workspace). `workspaceRoot` must lie within `daemonRoot`, the
 * daemon's workspace as the caller names it (`connect({ workspaceRoot })`);
 * the daemon's root itself is `"."`, the whole workspace.
 */
export function workspaceSubdir(
  options: { workspaceRoot?: string; workspaceSubdir?: string },
  daemonRoot: string,
): string {
  const { workspaceRoot, workspaceSubdir: subdir } = options;
  if (workspaceRoot === undefined) return subdir ?? "";
  if (subdir !== undefined) {
    throw invalidArgument("give workspaceRoot or workspaceSubdir, not both", { field: "workspaceRoot" });
  }
  if (typeof workspaceRoot !== "string" || !path.posix.isAbsolute(workspaceRoot)) {
    throw invalidArgument(
      `workspaceRoot must be an absolute path within ${daemonRoot}, not ${JSON.stringify(workspaceRoot)} ` +
        "(a path relative to the daemon's workspace is workspaceSubdir)",
      { field: "workspaceRoot", path: String(workspaceRoot) },
      "SANDBOX_SNAPSHOT_INVALID_PATH",
    );
  }
  const relative = path.posix.relative(path.posix.normalize(daemonRoot), path.posix.normalize(workspaceRoot));
  if (relative === "..") return outside(workspaceRoot, daemonRoot);
  if (relative.startsWith("../") || path.posix.isAbsolute(relative)) return outside(workspaceRoot, daemonRoot);
  return relative === "" ? "." : relative;
}

function outside(workspaceRoot: string, daemonRoot: string): never {
  throw invalidArgument(
    `workspaceRoot ${workspaceRoot} is outside the daemon's workspace ${daemonRoot} ` +
      "(connect({ workspaceRoot }) names where the daemon's workspace is)",
    { field: "workspaceRoot", path: workspaceRoot, workspace_root: daemonRoot },
    "SANDBOX_SNAPSHOT_INVALID_PATH",
  );
}

/**
 * Secret values: a list (matched by position with the capture's list) or an
 * object of named values (`{ OPENAI_API_KEY: "sk-..." }`), matched by name, so
 * a restore finds them whatever their order. Strings are sent as UTF-8.
 */
export type SandboxSecrets = Array<string | Uint8Array> | Record<string, string | Uint8Array>;

function secretBytes(secret: unknown, where: string): Uint8Array {
  if (typeof secret === "string") return Buffer.from(secret, "utf8");
  if (secret instanceof Uint8Array) return secret;
  throw invalidArgument(`${where} must be a string or bytes, not ${describe(secret)}`, { field: where });
}

/** The request fields of a list or of named secrets. */
export function secretFields(secrets: SandboxSecrets | undefined): {
  secrets: Uint8Array[];
  secretNames: string[];
} {
  if (secrets === undefined) return { secrets: [], secretNames: [] };
  if (Array.isArray(secrets)) {
    return { secrets: secrets.map((value, i) => secretBytes(value, `secrets[${i}]`)), secretNames: [] };
  }
  if (typeof secrets !== "object" || secrets === null) {
    throw invalidArgument(`secrets must be a list or an object of named values, not ${describe(secrets)}`, {
      field: "secrets",
    });
  }
  const names = Object.keys(secrets);
  return {
    secrets: names.map((name) => secretBytes(secrets[name], `secrets.${name}`)),
    secretNames: names,
  };
}
