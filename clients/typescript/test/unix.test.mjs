// The SDK against a real daemon on its Unix socket: capture with progress,
// crash-and-restore, typed errors, prune and sweep, request-id replay.
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  connect,
  deleteCheckpoints,
  EntryKind,
  restoreSandboxCheckpoint,
  SandboxCheckpointError,
  SandboxCheckpointInvalidArgumentError,
  SandboxCheckpointWriterConflictError,
  SandboxSnapshotError,
  ServingStatus,
  sweepSandboxBlobs,
} from "@checkpointd/client";
import { status } from "@grpc/grpc-js";

import { holdLease, startDaemon, writeTree } from "./daemon.mjs";

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

test("health and server info", async () => {
  const health = await client.health.check({});
  assert.equal(health.status, ServingStatus.SERVING);
  const info = await client.getServerInfo();
  assert.ok(info.protocolVersion >= 2, "SweepBlobs is a stream since protocol 2");
  assert.equal(info.capabilities.captureRequestId, true);
});

test("capture streams started, progress and done as typed events", async () => {
  writeTree(path.join(daemon.workspace, "progress"), { "a.txt": "alpha", "dir/b.txt": "beta" });
  const seen = [];
  for await (const { event } of client.capture({
    threadId: "t-progress",
    label: "first",
    workspaceSubdir: "progress",
  })) {
    seen.push(event);
  }
  assert.equal(seen[0].$case, "started");
  assert.ok(seen.some((event) => event.$case === "progress"), "at least one progress event");
  const done = seen.at(-1);
  assert.equal(done.$case, "done");
  assert.equal(done.value.checkpoint.id, seen[0].value.checkpointId);
  assert.equal(done.value.checkpoint.label, "first");
  assert.equal(done.value.checkpoint.reason, "named");
  assert.equal(typeof done.value.checkpoint.totalBytes, "bigint");
  assert.equal(done.value.checkpoint.totalBytes, 9n);
  assert.equal(typeof done.value.stats.phasesMs.scan, "bigint");

  const entries = [];
  for await (const chunk of client.listEntries({ checkpointId: done.value.checkpoint.id })) {
    entries.push(...chunk.entries);
  }
  const file = entries.find((entry) => entry.path === "a.txt");
  assert.equal(file.kind, EntryKind.ENTRY_KIND_FILE);
  assert.equal(typeof file.mtimeNs, "bigint");
  // Nanoseconds since the epoch do not fit in a double: bigint keeps every digit.
  assert.ok(file.mtimeNs > BigInt(Number.MAX_SAFE_INTEGER));
  assert.equal(await client.getHead({ threadId: "t-progress" }).then((r) => r.checkpointId),
    done.value.checkpoint.id);
});

test("crash and restore with the reference API's functions", async () => {
  const root = path.join(daemon.workspace, "crash");
  writeTree(root, { "main.py": "print('hi')\n", "src/lib.py": "x = 1\n" });
  assert.equal(
    await restoreSandboxCheckpoint({ client, threadId: "t-crash", workspaceSubdir: "crash" }),
    null,
    "a thread with no checkpoint restores nothing",
  );
  const progress = [];
  const saved = await captureSandboxCheckpoint({
    client,
    threadId: "t-crash",
    label: "before crash",
    conversation: [{ role: "user", content: "write main.py" }],
    workspaceSubdir: "crash",
    onProgress: (p) => progress.push(p.phase),
  });
  assert.ok(saved.id);
  assert.equal(saved.conversationCount, 1);
  assert.ok(progress.length > 0);

  rmSync(path.join(root, "src"), { recursive: true });
  writeTree(root, { "main.py": "garbage", "new.txt": "not in the checkpoint" });
  const restored = await restoreSandboxCheckpoint({
    client,
    threadId: "t-crash",
    workspaceSubdir: "crash",
  });
  assert.equal(restored.id, saved.id);
  assert.equal(readFileSync(path.join(root, "main.py"), "utf8"), "print('hi')\n");
  assert.equal(readFileSync(path.join(root, "src/lib.py"), "utf8"), "x = 1\n");
  assert.ok(!existsSync(path.join(root, "new.txt")));

  const detail = await client.getCheckpoint({ checkpointId: saved.id, includeConversation: true });
  assert.deepEqual(JSON.parse(detail.conversation[0]), { role: "user", content: "write main.py" });
});

test("an unknown checkpoint id is a SandboxSnapshotError MISSING_CHECKPOINT", async () => {
  await assert.rejects(
    restoreSandboxCheckpoint({ client, threadId: "t-crash", checkpointId: "nope",
      workspaceSubdir: "crash" }),
    (error) => {
      assert.ok(error instanceof SandboxSnapshotError);
      assert.equal(error.code, "SANDBOX_SNAPSHOT_MISSING_CHECKPOINT");
      assert.equal(error.grpcCode, status.NOT_FOUND);
      assert.equal(error.cause.code, status.NOT_FOUND);
      return true;
    },
  );
});

test("WRITER_CONFLICT is caught as SandboxCheckpointWriterConflictError", async () => {
  writeTree(path.join(daemon.workspace, "busy"), { "a.txt": "a" });
  const lease = await holdLease(daemon, "t-busy");
  try {
    const started = Date.now();
    await assert.rejects(
      captureSandboxCheckpoint({ client, threadId: "t-busy", workspaceSubdir: "busy" }),
      (error) => {
        assert.ok(error instanceof SandboxCheckpointWriterConflictError);
        assert.ok(error instanceof SandboxCheckpointError);
        assert.equal(error.code, "SANDBOX_SNAPSHOT_WRITER_CONFLICT");
        assert.equal(error.metadata.thread_id, "t-busy");
        assert.equal(error.cause.code, status.ABORTED);
        // The daemon says when the holder's lease (120 s) expires.
        assert.ok(error.retryAfterMs > 0 && error.retryAfterMs <= 120_000, `${error.retryAfterMs}`);
        assert.ok(Number(error.metadata.expires_at_ms) > Date.now());
        return true;
      },
    );
    assert.ok(Date.now() - started < 5_000, "a conflict fails fast, it is not retried");
  } finally {
    await lease.release();
  }
  const saved = await captureSandboxCheckpoint({ client, threadId: "t-busy",
    workspaceSubdir: "busy" });
  assert.ok(saved.id, "the capture succeeds once the lease is released");
});

test("a capture retried with the same request id returns the same checkpoint", async () => {
  writeTree(path.join(daemon.workspace, "replay"), { "a.txt": "a" });
  const first = await captureSandboxCheckpoint({ client, threadId: "t-replay",
    workspaceSubdir: "replay", requestId: "req-1" });
  const again = await captureSandboxCheckpoint({ client, threadId: "t-replay",
    workspaceSubdir: "replay", requestId: "req-1" });
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.equal(again.id, first.id);
  const list = await client.listCheckpoints({ threadId: "t-replay" });
  assert.equal(list.checkpoints.length, 1);
});

test("deleteCheckpoints keeps the newest, sweepSandboxBlobs reports", async () => {
  const root = path.join(daemon.workspace, "prune");
  const ids = [];
  for (let i = 0; i < 3; i++) {
    writeTree(root, { "n.txt": `version ${i}` });
    ids.push((await captureSandboxCheckpoint({ client, threadId: "t-prune",
      workspaceSubdir: "prune" })).id);
  }
  const dry = await deleteCheckpoints({ client, threadId: "t-prune", keep: 1, dryRun: true });
  assert.deepEqual(dry, { deleted: ids.slice(0, 2), deletedCount: 2, idsTruncated: false,
    dryRun: true });
  const { deleted } = await deleteCheckpoints({ client, threadId: "t-prune", keep: 1 });
  assert.deepEqual(deleted, ids.slice(0, 2));
  await assert.rejects(deleteCheckpoints({ client, threadId: "t-prune", keep: 0 }),
    SandboxCheckpointInvalidArgumentError);

  const swept = await sweepSandboxBlobs({ client, olderThanMs: 0, dryRun: true });
  assert.ok(Array.isArray(swept));
  assert.ok(swept.length >= 2, "the two pruned versions' blobs are unreferenced");
  // Blob keys, plus the pack objects left with no live blob (docs/packs.md).
  assert.ok(swept.every((key) => key.startsWith("sandbox-files/") || key.startsWith("sandbox-packs/")));
  assert.ok(swept.filter((key) => key.startsWith("sandbox-files/")).length >= 2);
  assert.equal(swept.dryRun, true);
  assert.ok(swept.kept.some((kept) => kept.reason === "referenced"));
  assert.equal(swept.summary.deletedCount, swept.length);
  assert.equal(swept.summary.olderThanMs, 0);
  const defaults = await sweepSandboxBlobs({ client, dryRun: true });
  assert.equal(defaults.summary.olderThanMs, 3_600_000, "unset is the daemon's default");
  assert.equal(defaults.length, 0, "nothing is an hour old yet");
  assert.equal(defaults.summary.repackBelowPercent, 50, "unset repacks below 50%");
  const never = await sweepSandboxBlobs({ client, dryRun: true, repackBelowPercent: 0 });
  assert.equal(never.summary.repackBelowPercent, 0);
  await assert.rejects(
    sweepSandboxBlobs({ client, dryRun: true, repackBelowPercent: 101 }),
    SandboxCheckpointInvalidArgumentError,
  );
  await assert.rejects(
    (async () => {
      for await (const _ of client.sweepBlobs({ dryRun: true, repackBelowPercent: 101 })) {
        // the daemon refuses before the first message
      }
    })(),
    (error) => error.code === "SANDBOX_SNAPSHOT_INVALID_ARGUMENT" &&
      error.metadata.field === "repack_below_percent",
  );
});

test("bad input is a typed INVALID_ARGUMENT error from the daemon", async () => {
  await assert.rejects(
    captureSandboxCheckpoint({ client, threadId: "t-bad", secrets: ["abc"] }),
    (error) => error instanceof SandboxCheckpointInvalidArgumentError &&
      error.grpcCode === status.INVALID_ARGUMENT,
  );
  await assert.rejects(
    client.getCheckpoint({ checkpointId: "" }),
    (error) => error.code === "SANDBOX_SNAPSHOT_INVALID_ID",
  );
});

test("artifacts: upload, capture with them, read them back", async () => {
  writeTree(path.join(daemon.workspace, "art"), { "a.txt": "a" });
  const big = Buffer.alloc(600 * 1024, 7); // several upload chunks
  const artifact = await client.uploadArtifactBytes("report.bin", "application/octet-stream", big);
  assert.equal(artifact.size, BigInt(big.length));
  assert.ok(artifact.blobKey.startsWith("sandbox-artifacts/blake3/"));
  const saved = await captureSandboxCheckpoint({ client, threadId: "t-art", workspaceSubdir: "art",
    artifacts: [artifact] });
  assert.equal(saved.artifactCount, 1);
  const detail = await client.getCheckpoint({ checkpointId: saved.id });
  assert.equal(detail.artifacts[0].artifactId, artifact.artifactId);
  const parts = [];
  for await (const chunk of client.readArtifact({ blobKey: artifact.blobKey })) parts.push(chunk.data);
  assert.ok(Buffer.concat(parts).equals(big));
});

test("skipIfUnchanged appends nothing when nothing changed", async () => {
  writeTree(path.join(daemon.workspace, "skip"), { "a.txt": "same" });
  const options = { client, threadId: "t-skip", workspaceSubdir: "skip", skipIfUnchanged: true };
  const first = await captureSandboxCheckpoint(options);
  const again = await captureSandboxCheckpoint(options);
  assert.equal(first.unchanged, false);
  assert.equal(again.unchanged, true);
  assert.equal(again.id, first.id);
  writeTree(path.join(daemon.workspace, "skip"), { "a.txt": "changed" });
  const third = await captureSandboxCheckpoint(options);
  assert.equal(third.unchanged, false);
  assert.equal(third.parentCheckpointId, first.id);
  const threads = await client.listThreads({});
  assert.ok(threads.threads.some((t) => t.threadId === "t-skip" && t.checkpointCount === 2n));
});

test("captureSandboxCheckpoint's stats are plain numbers and say how the scan ran", async () => {
  writeTree(path.join(daemon.workspace, "stats"), { "a.txt": "a", "b.txt": "b" });
  const saved = await captureSandboxCheckpoint({ client, threadId: "t-stats", workspaceSubdir: "stats" });
  assert.equal(saved.stats.entries, 2);
  assert.equal(typeof saved.stats.durationMs, "number");
  assert.ok(Object.values(saved.stats.phasesMs).every((ms) => typeof ms === "number"));
  assert.ok(["journal", "full", ""].includes(saved.stats.scanMode), saved.stats.scanMode);
  assert.equal(typeof saved.stats.entriesExamined, "number");
  assert.deepEqual(JSON.parse(JSON.stringify(saved)), saved, "the whole result is plain JSON");
});
