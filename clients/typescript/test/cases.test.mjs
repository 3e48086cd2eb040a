// The table every checkpointd SDK runs (clients/shared/cases.json, schema in
// clients/shared/README.md), against a real daemon: the same inputs give the
// same results and error codes in every language.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { lstatSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  connect,
  deleteCheckpoints,
  deleteHead,
  forkCheckpoint,
  getCheckpoint,
  getHead,
  listCheckpoints,
  restoreSandboxCheckpoint,
  SandboxCheckpointError,
} from "@checkpointd/client";

import { startDaemon, writeTree } from "./daemon.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const table = JSON.parse(readFileSync(path.resolve(here, "..", "..", "shared", "cases.json"), "utf8"));

/** The SDK's function for each call of the table. */
const CALLS = {
  capture: (client, args) => captureSandboxCheckpoint({ client, ...args }),
  restore: (client, args) => restoreSandboxCheckpoint({ client, ...args }),
  get: (client, args) => getCheckpoint({ client, ...args }),
  list: (client, args) => listCheckpoints({ client, ...args }).toArray(),
  head: (client, args) => getHead({ client, ...args }),
  fork: (client, args) => forkCheckpoint({ client, ...args }),
  deleteHead: (client, args) => deleteHead({ client, ...args }),
  deleteCheckpoints: (client, args) => deleteCheckpoints({ client, ...args }),
};

let daemon;
let client;
const run = randomUUID().slice(0, 8);

before(async () => {
  daemon = await startDaemon();
  client = await connect({ address: daemon.address, workspaceRoot: daemon.workspace });
});

after(async () => {
  client?.close();
  await daemon?.stop();
});

/** Replaces the placeholders of every string in `value` (see the schema). */
function substitute(value, context) {
  if (typeof value === "string") {
    const pattern = /\$(\w+)(?:\.(\w+))?/g;
    const resolve = (name, field) => {
      if (name === "thread") return field === undefined ? context.thread : `${context.thread}.${field}`;
      if (name === "dir") return context.dir;
      if (name === "root") return daemon.workspace;
      assert.ok(name in context.saved, `no result saved as ${name}`);
      return context.saved[name]?.[field];
    };
    const whole = /^\$(\w+)(?:\.(\w+))?$/.exec(value);
    if (whole) return resolve(whole[1], whole[2]);
    return value.replace(pattern, (_, name, field) => String(resolve(name, field)));
  }
  if (Array.isArray(value)) return value.map((item) => substitute(item, context));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, context)]));
  }
  return value;
}

/** Does `actual` match `expected` (subset match for objects, see the schema)? */
function assertMatches(actual, expected, where) {
  if (expected === null) {
    assert.ok(actual === null || actual === undefined, `${where}: expected null, got ${JSON.stringify(actual)}`);
  } else if (Array.isArray(expected)) {
    assert.ok(Array.isArray(actual), `${where}: expected an array, got ${JSON.stringify(actual)}`);
    assert.equal(actual.length, expected.length, `${where}: length of ${JSON.stringify(actual)}`);
    expected.forEach((item, i) => assertMatches(actual[i], item, `${where}[${i}]`));
  } else if (typeof expected === "object") {
    assert.ok(actual !== null && typeof actual === "object", `${where}: expected an object, got ${actual}`);
    for (const [key, value] of Object.entries(expected)) assertMatches(actual[key], value, `${where}.${key}`);
  } else {
    assert.equal(actual, expected, where);
  }
}

function regularFiles(root) {
  const out = {};
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      const full = path.join(dir, name);
      if (lstatSync(full).isDirectory()) walk(full);
      else out[path.relative(root, full)] = readFileSync(full, "utf8");
    }
  };
  walk(root);
  return out;
}

async function runCall(step, context, where) {
  const args = substitute(step.args ?? {}, context);
  const expect = substitute(step.expect ?? {}, context);
  const call = CALLS[step.call];
  assert.ok(call, `${where}: unknown call ${step.call}`);
  if (expect.error !== undefined) {
    await assert.rejects(call(client, args), (error) => {
      assert.ok(error instanceof SandboxCheckpointError, `${where}: ${error}`);
      assert.deepEqual({ code: error.code, grpcCode: error.grpcCode }, expect.error, `${where}: ${error.message}`);
      return true;
    });
    return;
  }
  const result = await call(client, args);
  // What a test of the reference API compares: plain JSON.
  assert.deepEqual(JSON.parse(JSON.stringify(result ?? null)), result ?? null, `${where}: not plain JSON`);
  if ("result" in expect) assertMatches(result, expect.result, `${where} result`);
  if (step.save !== undefined) context.saved[step.save] = result;
}

for (const entry of table.cases) {
  test(`${entry.id}: ${entry.description}`, async () => {
    const dir = `cases/${entry.id}`;
    const root = path.join(daemon.workspace, dir);
    mkdirSync(root, { recursive: true });
    const context = { thread: `case-${entry.id}-${run}`, dir, saved: {} };
    for (const [index, step] of entry.steps.entries()) {
      const where = `${entry.id} step ${index + 1}`;
      if (step.write !== undefined) writeTree(root, step.write);
      else if (step.remove !== undefined) for (const file of step.remove) rmSync(path.join(root, file));
      else if (step.files !== undefined) assert.deepEqual(regularFiles(root), step.files, `${where}: files`);
      else await runCall(step, context, where);
    }
  });
}
