// The examples of TanStack AI's `@tanstack/ai-sandbox` documents ("Checkpoint at
// Any Time", "Store Checkpoints"), ported to this SDK and run against a real
// daemon. Where the reference passes a sandbox handle and two stores, the port
// passes `client`: the daemon holds the workspace, the checkpoints and the blobs.
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  connect,
  deleteCheckpoints,
  deleteHead,
  getCheckpoint,
  getHead,
  listCheckpoints,
  restoreSandboxCheckpoint,
  SandboxCheckpointInvalidIdError,
  SandboxCheckpointNotHeadError,
  SandboxCheckpointWriterConflictError,
  SandboxSnapshotError,
  sweepSandboxBlobs,
} from "@checkpointd/client";

import { holdLease, startDaemon, writeTree } from "./daemon.mjs";

let daemon;
let client;
let log;

before(async () => {
  daemon = await startDaemon();
  // The sandbox names its workspace /workspace; here it is the daemon's own path.
  client = await connect({ address: daemon.address, workspaceRoot: daemon.workspace });
});

after(async () => {
  client?.close();
  await daemon?.stop();
});

// ---------------------------------------------------------------- the ported examples

// workspace.ts: restore the newest checkpoint before the agent runs.
async function startWorkspace(threadId, root) {
  const restored = await restoreSandboxCheckpoint({ client, threadId, workspaceRoot: root });
  // `null`: the thread has no checkpoint yet, so the sandbox stays as it is.
  log.push(restored === null ? "New thread" : `Restored ${restored.id}`);
}

// checkpoint.ts: a second capture of the same thread is skipped.
async function checkpoint(threadId, root) {
  try {
    const saved = await captureSandboxCheckpoint({ client, threadId, workspaceRoot: root });
    return saved.id;
  } catch (error) {
    if (error instanceof SandboxCheckpointWriterConflictError) return null;
    throw error;
  }
}

// checkpointEveryMinute, every `ms` here; stopping also waits for a capture
// still running, so the test's next step does not race it.
function checkpointEvery(ms, threadId, root, errors) {
  const running = new Set();
  const timer = setInterval(() => {
    const capture = checkpoint(threadId, root).catch((error) => errors.push(error));
    running.add(capture);
    capture.finally(() => running.delete(capture));
  }, ms);
  return async () => {
    clearInterval(timer);
    await Promise.all(running);
  };
}

// prune.ts: keep the head and the newest checkpoints before it.
async function keepNewest(threadId, keep) {
  const { deleted } = await deleteCheckpoints({ client, threadId, keep });
  return deleted;
}

function folder(name) {
  const root = path.join(daemon.workspace, name);
  mkdirSync(root, { recursive: true });
  return root;
}

// ---------------------------------------------------------------- Checkpoint at Any Time

test("add checkpoints to an agent loop: the file is back after the sandbox is gone", async () => {
  log = [];
  const root = folder("loop");
  await startWorkspace("t-loop", root);
  assert.deepEqual(log, ["New thread"]);
  const errors = [];
  const stop = checkpointEvery(40, "t-loop", root, errors);
  writeTree(root, { "notes.md": "the agent wrote this" });
  await new Promise((resolve) => setTimeout(resolve, 400));
  await stop();
  assert.deepEqual(errors, [], "a busy tick is skipped, never an error");
  const head = await getHead({ client, threadId: "t-loop" });
  assert.ok(head, "the timer saved checkpoints");

  rmSync(root, { recursive: true }); // the container is removed
  mkdirSync(root);
  await startWorkspace("t-loop", root);
  assert.equal(log.at(-1), `Restored ${head}`);
  assert.equal(readFileSync(path.join(root, "notes.md"), "utf8"), "the agent wrote this");
});

test("a second capture while one runs throws SandboxCheckpointWriterConflictError: skip it", async () => {
  const root = folder("busy");
  writeTree(root, { "a.txt": "a" });
  const lease = await holdLease(daemon, "t-busy");
  try {
    assert.equal(await checkpoint("t-busy", root), null);
  } finally {
    await lease.release();
  }
  assert.ok(await checkpoint("t-busy", root), "the next one saves the files");
});

test("the options: label, policy, secrets, conversation, workspaceRoot", async () => {
  const root = folder("options");
  writeTree(root, { "app.js": "key=sk-test-9999", "build/out.js": "generated", "keep.txt": "k" });
  const policy = { exclude: ["build/"] };
  const saved = await captureSandboxCheckpoint({
    client,
    threadId: "t-options",
    workspaceRoot: root,
    label: "before refactor",
    policy,
    secrets: ["sk-test-9999"],
  });
  assert.equal(saved.reason, "named");
  assert.equal(saved.label, "before refactor");
  assert.equal(saved.fileCount, 2, "build/ is excluded");
  assert.equal(saved.conversationCount, 0, "the conversation defaults to []");
  const detail = await getCheckpoint({ client, checkpointId: saved.id, includeConversation: true });
  assert.deepEqual(detail.conversation, []);
  const stored = [];
  for await (const chunk of client.readFile({ checkpointId: saved.id, path: "app.js" })) stored.push(chunk.data);
  assert.equal(Buffer.concat(stored).toString(), "key=\0\0\0\0\0\0\0\0\0\0\0\0", "the secret is zero bytes");

  // Pass the same policy to the restore: build/ is not the checkpoint's to manage.
  writeTree(root, { "keep.txt": "changed", "build/out.js": "rebuilt" });
  await restoreSandboxCheckpoint({ client, threadId: "t-options", workspaceRoot: root, policy,
    secrets: ["sk-test-9999"] });
  assert.equal(readFileSync(path.join(root, "keep.txt"), "utf8"), "k");
  assert.equal(readFileSync(path.join(root, "build/out.js"), "utf8"), "rebuilt");
  assert.equal(readFileSync(path.join(root, "app.js"), "utf8"), "key=sk-test-9999");
});

test("restore rules: files the checkpoint lacks go, excluded paths stay, an unknown id throws", async () => {
  const root = folder("rules");
  writeTree(root, { "src/main.py": "print(1)" });
  const saved = await captureSandboxCheckpoint({ client, threadId: "t-rules", workspaceRoot: root });
  writeTree(root, { "stray.txt": "not in the checkpoint", "node_modules/pkg/index.js": "excluded" });
  const restored = await restoreSandboxCheckpoint({ client, threadId: "t-rules", workspaceRoot: root });
  assert.equal(restored.id, saved.id);
  assert.ok(!existsSync(path.join(root, "stray.txt")));
  assert.ok(existsSync(path.join(root, "node_modules/pkg/index.js")), "default excludes stay");
  await assert.rejects(
    restoreSandboxCheckpoint({ client, threadId: "t-rules", workspaceRoot: root, checkpointId: "not-on-this-thread" }),
    (error) => error instanceof SandboxSnapshotError && error.code === "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT",
  );
});

test("a link that leaves the workspace is UNSUPPORTED_ENTRY until it is excluded", async () => {
  const root = folder("links");
  writeTree(root, { "a.txt": "a" });
  symlinkSync("/etc/passwd", path.join(root, "escape"));
  await assert.rejects(
    captureSandboxCheckpoint({ client, threadId: "t-links", workspaceRoot: root }),
    (error) => error instanceof SandboxSnapshotError && error.code === "SANDBOX_SNAPSHOT_UNSUPPORTED_ENTRY",
  );
  const saved = await captureSandboxCheckpoint({ client, threadId: "t-links", workspaceRoot: root,
    policy: { exclude: ["escape"] } });
  assert.equal(saved.fileCount, 1);
});

// ---------------------------------------------------------------- Store Checkpoints

test("the store's rules: a chain, get returns null, list is sorted, ids are valid", async () => {
  const root = folder("store");
  const ids = [];
  for (const version of ["1", "2", "3"]) {
    writeTree(root, { "v.txt": version });
    ids.push(await checkpoint("t-store", root));
  }
  const list = await listCheckpoints({ client, threadId: "t-store" }).toArray();
  assert.deepEqual(list.map((c) => c.id), ids, "sorted by createdAt, oldest first");
  assert.deepEqual(list.map((c) => c.parentCheckpointId), [null, ids[0], ids[1]], "a thread is a chain");
  assert.equal(await getHead({ client, threadId: "t-store" }), ids[2]);
  assert.deepEqual(await listCheckpoints({ client, threadId: "t-unknown" }).toArray(), []);
  assert.equal(await getHead({ client, threadId: "t-unknown" }), null);
  assert.equal(await getCheckpoint({ client, checkpointId: "missing" }), null, "a missing id does not throw");

  const read = await getCheckpoint({ client, checkpointId: ids[0] });
  read.label = "changed by the caller";
  assert.equal((await getCheckpoint({ client, checkpointId: ids[0] })).label, null, "reads return copies");

  for (const bad of ["", "\ud800"]) {
    await assert.rejects(getCheckpoint({ client, checkpointId: bad }), SandboxCheckpointInvalidIdError);
  }
  await assert.rejects(deleteHead({ client, threadId: "t-store", checkpointId: ids[0] }),
    SandboxCheckpointNotHeadError);
  assert.equal(await deleteHead({ client, threadId: "t-store", checkpointId: ids[2] }), ids[1]);
});

test("keepNewest and the nightly sweep", async () => {
  const root = folder("prune");
  const ids = [];
  for (const version of ["one", "two", "three"]) {
    writeTree(root, { "v.txt": version });
    ids.push(await checkpoint("t-prune", root));
  }
  assert.deepEqual(await keepNewest("t-prune", 1), ids.slice(0, 2));
  // Longer than your longest capture.
  const deleted = await sweepSandboxBlobs({ client, olderThanMs: 24 * 60 * 60 * 1000 });
  assert.equal(`Deleted ${deleted.length} blobs`, "Deleted 0 blobs", "nothing is a day old");
  const now = await sweepSandboxBlobs({ client, olderThanMs: 0 });
  assert.ok(now.length >= 2, "the pruned versions' blobs go");
  assert.ok(now.every((key) => typeof key === "string"));
});
