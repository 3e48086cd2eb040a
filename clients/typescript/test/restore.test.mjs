// Restore's whole surface against a real daemon: a dry run's plan (and that it
// changes nothing), secrets written back by position and by name, the files a
// restore left zeroed, and streams read to their end (no cancelled call logged).
import assert from "node:assert/strict";
import { lstatSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  connect,
  getHead,
  listCheckpoints,
  restoreSandboxCheckpoint,
  SandboxSnapshotError,
  undoRestore,
} from "@checkpointd/client";
import { status } from "@grpc/grpc-js";

import { startDaemon, writeTree } from "./daemon.mjs";

let daemon;
let client;

before(async () => {
  daemon = await startDaemon();
  client = await connect({ address: daemon.address });
});

after(async () => {
  client?.close();
  await daemon?.stop();
});

/** Every path below `root` with its kind, mode, mtime and content. */
function treeState(root) {
  const state = {};
  const walk = (dir) => {
    for (const name of readdirSync(dir).sort()) {
      const full = path.join(dir, name);
      const stat = lstatSync(full, { bigint: true });
      const key = path.relative(root, full);
      if (stat.isDirectory()) {
        state[key] = ["dir", stat.mode, stat.mtimeNs];
        walk(full);
      } else {
        state[key] = ["file", stat.mode, stat.mtimeNs, readFileSync(full, "base64")];
      }
    }
  };
  walk(root);
  return state;
}

test("a dry run returns the plan and changes nothing", async () => {
  const root = path.join(daemon.workspace, "dry");
  writeTree(root, { "keep.txt": "same", "edit.txt": "v1", "gone.txt": "will be deleted" });
  const saved = await captureSandboxCheckpoint({ client, threadId: "t-dry", workspaceSubdir: "dry" });
  writeTree(root, { "edit.txt": "v2, edited", "extra/new.txt": "not in the checkpoint" });
  rmSync(path.join(root, "gone.txt"));
  const before = treeState(root);

  const planned = await restoreSandboxCheckpoint({ client, threadId: "t-dry",
    workspaceSubdir: "dry", dryRun: true });
  assert.equal(planned.id, saved.id);
  assert.equal(planned.dryRun, true);
  assert.deepEqual(planned.plan.written.sort(), ["edit.txt", "gone.txt"]);
  assert.deepEqual(planned.plan.deleted.sort(), ["extra", "extra/new.txt"]);
  assert.equal(planned.plan.filesWritten, 2);
  assert.equal(planned.plan.pathsDeleted, 2);
  assert.equal(planned.plan.filesKept, 1);
  assert.equal(typeof planned.plan.bytesToFetch, "number");
  assert.deepEqual(treeState(root), before, "a dry run touches nothing");

  const restored = await restoreSandboxCheckpoint({ client, threadId: "t-dry", workspaceSubdir: "dry" });
  assert.equal(restored.dryRun, false);
  assert.equal(readFileSync(path.join(root, "edit.txt"), "utf8"), "v1");
  assert.equal(readFileSync(path.join(root, "gone.txt"), "utf8"), "will be deleted");
  const again = await restoreSandboxCheckpoint({ client, threadId: "t-dry", workspaceSubdir: "dry",
    dryRun: true });
  assert.deepEqual([again.plan.written, again.plan.deleted], [[], []], "nothing left to do");
  assert.equal(
    await restoreSandboxCheckpoint({ client, threadId: "t-dry-none", dryRun: true }),
    null,
    "a thread without checkpoints has nothing to plan",
  );
});

test("secrets are written back by position, and by name in any order", async () => {
  const root = path.join(daemon.workspace, "secret");
  const env = "OPENAI_API_KEY=sk-live-1234\nDB_PASSWORD=hunter2-db\n";
  writeTree(root, { "config.txt": env, "plain.txt": "no secret here" });
  const options = { client, workspaceSubdir: "secret", policy: { defaultExcludes: false } };

  await captureSandboxCheckpoint({ ...options, threadId: "t-secret-list",
    secrets: ["sk-live-1234", "hunter2-db"] });
  const detail = [];
  for await (const chunk of client.readFile({
    checkpointId: (await client.getHead({ threadId: "t-secret-list" })).checkpointId,
    path: "config.txt",
  })) detail.push(chunk.data);
  assert.ok(!Buffer.concat(detail).toString().includes("sk-live-1234"), "stored zeroed");

  writeFileSync(path.join(root, "config.txt"), "crashed");
  const byPosition = await restoreSandboxCheckpoint({ ...options, threadId: "t-secret-list",
    secrets: ["sk-live-1234", "hunter2-db"] });
  assert.equal(readFileSync(path.join(root, "config.txt"), "utf8"), env);
  assert.deepEqual(byPosition.unfilledSecretPaths, []);
  assert.equal(byPosition.unfilledSecretCount, 0);

  await captureSandboxCheckpoint({ ...options, threadId: "t-secret-named",
    secrets: { OPENAI_API_KEY: "sk-live-1234", DB_PASSWORD: Buffer.from("hunter2-db") } });
  writeFileSync(path.join(root, "config.txt"), "crashed");
  await restoreSandboxCheckpoint({ ...options, threadId: "t-secret-named",
    secrets: { DB_PASSWORD: "hunter2-db", OPENAI_API_KEY: "sk-live-1234" } });
  assert.equal(readFileSync(path.join(root, "config.txt"), "utf8"), env, "found by name");
});

test("a restore without the secrets reports the files it left zeroed", async () => {
  const root = path.join(daemon.workspace, "unfilled");
  writeTree(root, { "a.env.txt": "TOKEN=tok-abcdef\n", "b.txt": "clean" });
  const options = { client, threadId: "t-unfilled", workspaceSubdir: "unfilled" };
  await captureSandboxCheckpoint({ ...options, secrets: ["tok-abcdef"] });
  rmSync(path.join(root, "a.env.txt"));

  const restored = await restoreSandboxCheckpoint(options);
  // Relative to the daemon's workspace root (a dry run's plan paths are
  // relative to the sub-root restored).
  assert.deepEqual(restored.unfilledSecretPaths, ["unfilled/a.env.txt"]);
  assert.equal(restored.unfilledSecretCount, 1);
  assert.equal(readFileSync(path.join(root, "a.env.txt"), "utf8"), "TOKEN=\0\0\0\0\0\0\0\0\0\0\n");

  rmSync(path.join(root, "a.env.txt"));
  await assert.rejects(restoreSandboxCheckpoint({ ...options, requireSecrets: true }), (error) => {
    assert.ok(error instanceof SandboxSnapshotError);
    assert.equal(error.code, "SANDBOX_SNAPSHOT_UNFILLED_SECRETS");
    assert.equal(error.grpcCode, status.FAILED_PRECONDITION);
    assert.equal(error.metadata.unfilled_secret_count, "1");
    assert.match(error.message, /a\.env\.txt/);
    return true;
  });
  const filled = await restoreSandboxCheckpoint({ ...options, requireSecrets: true,
    secrets: ["tok-abcdef"] });
  assert.equal(filled.unfilledSecretCount, 0);
  assert.equal(readFileSync(path.join(root, "a.env.txt"), "utf8"), "TOKEN=tok-abcdef\n");
});

test("successful captures and restores read their streams to the end", async () => {
  const root = path.join(daemon.workspace, "drain");
  for (let i = 0; i < 15; i++) {
    writeTree(root, { "n.txt": `round ${i}` });
    await captureSandboxCheckpoint({ client, threadId: "t-drain", workspaceSubdir: "drain" });
    await restoreSandboxCheckpoint({ client, threadId: "t-drain", workspaceSubdir: "drain" });
    // A caller that stops at done (the raw stream) does not cancel either.
    for await (const { event } of client.capture({ threadId: "t-drain", workspaceSubdir: "drain",
      skipIfUnchanged: true })) {
      if (event?.$case === "done") break;
    }
  }
  const cancelled = daemon.log().split("\n").filter((line) => line.includes("failed: CANCELLED"));
  assert.deepEqual(cancelled, [], "the daemon logged no failure for a success");
});

test("a restore stashes live changes; undoRestore brings them back; record moves the head", async () => {
  const root = path.join(daemon.workspace, "history");
  const options = { client, threadId: "t-history", workspaceSubdir: "history" };
  writeTree(root, { "a.txt": "v1" });
  const first = await captureSandboxCheckpoint(options);
  writeTree(root, { "a.txt": "an edit nobody captured" });

  const restored = await restoreSandboxCheckpoint(options);
  assert.equal(readFileSync(path.join(root, "a.txt"), "utf8"), "v1");
  const saved = restored.savedBeforeRestore;
  assert.ok(saved, "the live edit was saved before the restore overwrote it");
  assert.equal(saved.checkpoint.reason, "stash");
  assert.equal(saved.checkpoint.stashOfThreadId, "t-history");
  assert.equal(restored.recorded, null, "the head does not move unless asked");
  const stash = await listCheckpoints({ client, threadId: "t-history", stash: true }).toArray();
  assert.deepEqual(stash.map((entry) => entry.id), [saved.checkpoint.id]);

  const undone = await undoRestore(options);
  assert.equal(undone.id, saved.checkpoint.id);
  assert.equal(readFileSync(path.join(root, "a.txt"), "utf8"), "an edit nobody captured");
  await undoRestore(options); // an undo of an undo is a redo
  assert.equal(readFileSync(path.join(root, "a.txt"), "utf8"), "v1");

  writeTree(root, { "a.txt": "thrown away" });
  const discarded = await restoreSandboxCheckpoint({ ...options, discardLiveChanges: true });
  assert.equal(discarded.savedBeforeRestore, null);

  writeTree(root, { "a.txt": "v2" });
  const second = await captureSandboxCheckpoint(options);
  const back = await restoreSandboxCheckpoint({ ...options, checkpointId: first.id, record: true });
  assert.equal(back.recorded.reason, "restore");
  assert.equal(back.recorded.restoredFromCheckpointId, first.id);
  assert.equal(back.recorded.parentCheckpointId, second.id);
  assert.equal(await getHead({ client, threadId: "t-history" }), back.recorded.id);

  await assert.rejects(undoRestore({ client, threadId: "t-no-stash", workspaceSubdir: "history" }), (error) => {
    assert.ok(error instanceof SandboxSnapshotError);
    assert.equal(error.code, "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT");
    return true;
  });
});
