// The SDK over TCP with a bearer token, and the capture retry after a lost reply.
import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  connect,
  restoreSandboxCheckpoint,
  SandboxCheckpointError,
} from "@checkpointd/client";
import { status } from "@grpc/grpc-js";

import { startDaemon, startProxy, writeTree } from "./daemon.mjs";

const TOKEN = "tok-ts-123";
let daemon;

before(async () => {
  daemon = await startDaemon({ tcp: true, token: TOKEN });
});

after(async () => {
  await daemon?.stop();
});

test("connect without the token is UNAUTHENTICATED", async () => {
  for (const token of [undefined, "wrong"]) {
    await assert.rejects(connect({ address: daemon.address, token }), (error) => {
      assert.ok(error instanceof SandboxCheckpointError);
      assert.equal(error.code, "SANDBOX_SNAPSHOT_UNAUTHENTICATED");
      assert.equal(error.grpcCode, status.UNAUTHENTICATED);
      return true;
    });
  }
});

test("capture and restore over tcp:// with a token", async () => {
  const client = await connect({ address: daemon.address, token: TOKEN });
  try {
    writeTree(daemon.workspace, { "tcp/a.txt": "over tcp" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-tcp",
      workspaceSubdir: "tcp" });
    rmSync(path.join(daemon.workspace, "tcp", "a.txt"));
    const restored = await restoreSandboxCheckpoint({ client, threadId: "t-tcp",
      workspaceSubdir: "tcp" });
    assert.equal(restored.id, saved.id);
    assert.equal(readFileSync(path.join(daemon.workspace, "tcp", "a.txt"), "utf8"), "over tcp");
  } finally {
    client.close();
  }
});

test("a capture whose reply is lost after the commit is retried with its request id", async () => {
  const proxy = await startProxy(daemon.address.slice("tcp://".length));
  const client = await connect({ address: proxy.address, token: TOKEN });
  try {
    writeTree(daemon.workspace, { "lost/a.txt": "committed, then the reply was lost" });
    // The label is in the done event only: the daemon has appended by then.
    proxy.loseReplyContaining("label-only-in-done");
    const started = [];
    let done;
    for await (const { event } of client.capture({ threadId: "t-lost",
      label: "label-only-in-done", workspaceSubdir: "lost" })) {
      if (event.$case === "started") started.push(event.value.checkpointId);
      if (event.$case === "done") done = event.value;
    }
    assert.equal(proxy.cuts, 1, "the first reply was lost");
    assert.equal(started.length, 2, "the retry starts again");
    assert.equal(started[0], started[1], "with the same checkpoint id");
    assert.equal(done.replayed, true, "the daemon returned the committed checkpoint");
    assert.equal(done.checkpoint.id, started[0]);
    const list = await client.listCheckpoints({ threadId: "t-lost" });
    assert.deepEqual(list.checkpoints.map((c) => c.id), [started[0]], "one checkpoint, not two");
  } finally {
    client.close();
    await proxy.close();
  }
});
