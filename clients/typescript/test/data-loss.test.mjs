// A blob that vanished from the bucket: restore fails with DATA_LOSS, decoded as
// SandboxSnapshotError SANDBOX_SNAPSHOT_MISSING_BLOB, and changes nothing.
import assert from "node:assert/strict";
import { existsSync, readdirSync, rmSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  connect,
  restoreSandboxCheckpoint,
  SandboxSnapshotError,
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

test("a missing blob is SandboxSnapshotError with code SANDBOX_SNAPSHOT_MISSING_BLOB", async () => {
  writeTree(daemon.workspace, { "a.txt": "precious bytes" });
  await captureSandboxCheckpoint({ client, threadId: "t-loss" });
  // Remove every object of the bucket (whatever its layout), then the file.
  for (const name of readdirSync(daemon.blobsDir)) {
    rmSync(path.join(daemon.blobsDir, name), { recursive: true, force: true });
  }
  rmSync(path.join(daemon.workspace, "a.txt"));
  await assert.rejects(restoreSandboxCheckpoint({ client, threadId: "t-loss" }), (error) => {
    assert.ok(error instanceof SandboxSnapshotError);
    assert.equal(error.code, "SANDBOX_SNAPSHOT_MISSING_BLOB");
    assert.equal(error.grpcCode, status.DATA_LOSS);
    assert.equal(error.cause.code, status.DATA_LOSS);
    assert.ok(Object.keys(error.metadata).length > 0, "the metadata names what is missing");
    return true;
  });
  assert.ok(!existsSync(path.join(daemon.workspace, "a.txt")), "a failed restore changes nothing");
});
