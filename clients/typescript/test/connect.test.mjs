// connect(): the environment the CLI reads, failures that come at once with
// their cause, deadlines per call kind, and cancelled calls as AbortErrors.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import {
  captureSandboxCheckpoint,
  CheckpointdCancelledError,
  CheckpointdDeadlineError,
  CheckpointdUnauthenticatedError,
  CheckpointdUnavailableError,
  connect,
} from "@checkpointd/client";
import { status } from "@grpc/grpc-js";

import { freePort, startDaemon, writeTree } from "./daemon.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const TOKEN = "tok-connect-123";
let daemon;
let scratch;

before(async () => {
  daemon = await startDaemon({ tcp: true, token: TOKEN });
  scratch = mkdtempSync("/tmp/cpd-ts-connect-");
});

after(async () => {
  await daemon?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

/** Runs `connect(options)`, which must fail in under a second, and returns its error. */
async function failsFast(options) {
  const started = performance.now();
  const error = await connect(options).then(
    () => assert.fail("connect succeeded"),
    (caught) => caught,
  );
  const elapsed = performance.now() - started;
  assert.ok(elapsed < 1_000, `failed after ${elapsed.toFixed(0)} ms, not at once`);
  return error;
}

test("no socket at the address: fails at once, naming the path", async () => {
  const socket = path.join(scratch, "missing.sock");
  const error = await failsFast({ address: `unix://${socket}` });
  assert.ok(error instanceof CheckpointdUnavailableError);
  assert.equal(error.code, "SANDBOX_SNAPSHOT_UNAVAILABLE");
  assert.equal(error.grpcCode, status.UNAVAILABLE);
  assert.match(error.message, /ENOENT/);
  assert.ok(error.message.includes(socket), error.message);
});

test("a refused connection fails at once, naming the cause", async () => {
  const port = await freePort();
  const error = await failsFast({ address: `tcp://127.0.0.1:${port}`, token: TOKEN });
  assert.ok(error instanceof CheckpointdUnavailableError);
  assert.match(error.message, /ECONNREFUSED/);
  assert.ok(error.message.includes(`127.0.0.1:${port}`), error.message);
});

test("TLS against a daemon without it fails at once, naming TLS", async () => {
  const error = await failsFast({ address: daemon.address, token: TOKEN, tls: true });
  assert.ok(error instanceof CheckpointdUnavailableError);
  assert.match(error.message, /wrong version number/);
  assert.match(error.message, /the daemon does not answer TLS there/);
});

test("waitForReady waits for a daemon that comes up late", async () => {
  const port = await freePort();
  const late = net.createServer((socket) => socket.destroy());
  setTimeout(() => late.listen(port, "127.0.0.1"), 300);
  try {
    // Something listens after 300 ms but never speaks gRPC: still unavailable,
    // only after the time given.
    const started = performance.now();
    await assert.rejects(
      connect({ address: `127.0.0.1:${port}`, token: TOKEN, waitForReady: true, connectTimeoutMs: 800 }),
      CheckpointdUnavailableError,
    );
    assert.ok(performance.now() - started >= 750, "it waited out connectTimeoutMs");
  } finally {
    late.close();
  }
});

test("connect's signal stops a wait for the daemon", async () => {
  const started = performance.now();
  await assert.rejects(
    connect({ address: `127.0.0.1:${await freePort()}`, token: TOKEN, waitForReady: true,
      connectTimeoutMs: 30_000, signal: AbortSignal.timeout(200) }),
    { name: "AbortError" },
  );
  assert.ok(performance.now() - started < 1_000, "the wait stopped when the signal fired");
});

test("address and token come from CHECKPOINTD_ADDRESS and CHECKPOINTD_TOKEN", async () => {
  const client = await connect({ env: { CHECKPOINTD_ADDRESS: daemon.address, CHECKPOINTD_TOKEN: TOKEN } });
  try {
    assert.equal(client.address, daemon.address);
    assert.equal((await client.getServerInfo()).capabilities.authMode, "bearer-token");
  } finally {
    client.close();
  }
  const wrong = await connect({ env: { CHECKPOINTD_ADDRESS: daemon.address, CHECKPOINTD_TOKEN: "nope" } })
    .catch((error) => error);
  assert.ok(wrong instanceof CheckpointdUnauthenticatedError);
  assert.equal(wrong.code, "SANDBOX_SNAPSHOT_UNAUTHENTICATED");
  // The options win over the environment.
  const error = await failsFast({ address: `unix://${scratch}/none.sock`,
    env: { CHECKPOINTD_ADDRESS: daemon.address, CHECKPOINTD_TOKEN: TOKEN } });
  assert.ok(error.message.includes("none.sock"));
});

test("connect() with no options reads the process environment", () => {
  const script = [
    'import { connect } from "@checkpointd/client";',
    "const client = await connect();",
    "console.log((await client.getServerInfo()).protocolVersion);",
    "client.close();",
  ].join("\n");
  const result = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
    cwd: here,
    env: { ...process.env, CHECKPOINTD_ADDRESS: daemon.address, CHECKPOINTD_TOKEN: TOKEN },
    encoding: "utf8",
    timeout: 30_000,
  });
  assert.equal(result.status, 0, result.stderr);
  assert.ok(Number(result.stdout) >= 2, result.stdout);
});

test("no address anywhere: the default data dir's socket, as the CLI finds it", async () => {
  const error = await failsFast({ env: { HOME: scratch } });
  assert.ok(error instanceof CheckpointdUnavailableError);
  const socket = `${scratch}/.local/state/checkpointd/checkpointd.sock`;
  assert.ok(error.message.includes(socket), error.message);
  await assert.rejects(connect({ adress: daemon.address, env: {} }), (error) => {
    assert.equal(error.code, "SANDBOX_SNAPSHOT_INVALID_ARGUMENT");
    assert.match(error.message, /unknown option `adress`: did you mean `address`\?/);
    return true;
  });
});

test("each call kind has its default deadline; timeoutMs overrides it", async () => {
  const client = await connect({ address: daemon.address, token: TOKEN, deadlines: { unary: 1 } });
  try {
    // Stopped, the daemon cannot answer within the 1 ms (a running one sometimes can).
    daemon.pause();
    try {
      await assert.rejects(client.listThreads({}), (error) => {
        assert.ok(error instanceof CheckpointdDeadlineError);
        assert.equal(error.code, "SANDBOX_SNAPSHOT_DEADLINE_EXCEEDED");
        assert.equal(error.grpcCode, status.DEADLINE_EXCEEDED);
        return true;
      });
    } finally {
      daemon.resume();
    }
    await client.listThreads({}, { timeoutMs: Infinity });
    writeTree(daemon.workspace, { "deadline/a.txt": "a" });
    // A capture is an operation, not a unary call: the 1 ms does not apply.
    await captureSandboxCheckpoint({ client, threadId: "t-deadline", workspaceSubdir: "deadline" });
  } finally {
    client.close();
  }
});

test("an aborted call rejects with an AbortError and frees the thread", async () => {
  const client = await connect({ address: daemon.address, token: TOKEN });
  try {
    writeTree(daemon.workspace, Object.fromEntries(
      Array.from({ length: 300 }, (_, i) => [`abort/f${i}.txt`, `file ${i}`]),
    ));
    const controller = new AbortController();
    await assert.rejects(
      captureSandboxCheckpoint({ client, threadId: "t-abort", workspaceSubdir: "abort",
        signal: controller.signal, onProgress: () => controller.abort() }),
      (error) => {
        assert.equal(error.name, "AbortError");
        assert.ok(error instanceof CheckpointdCancelledError);
        assert.equal(error.code, "SANDBOX_SNAPSHOT_CANCELLED");
        assert.equal(error.grpcCode, status.CANCELLED);
        return true;
      },
    );
    const aborted = new AbortController();
    aborted.abort();
    await assert.rejects(client.listThreads({}, { signal: aborted.signal }), { name: "AbortError" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-abort", workspaceSubdir: "abort" });
    assert.equal(saved.fileCount, 300, "the cancelled capture released the lease");
  } finally {
    client.close();
  }
});
