// The SDK over TLS: server-verified TLS with a token, and mutual TLS.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { after, before, test } from "node:test";

import { captureSandboxCheckpoint, connect, SandboxCheckpointError } from "@checkpointd/client";

import { makePki, startDaemon, writeTree } from "./daemon.mjs";

const TOKEN = "tok-tls-123";
let dir;
let pki;
const daemons = [];

before(() => {
  dir = mkdtempSync("/tmp/cpd-ts-pki-");
  pki = makePki(dir);
});

after(async () => {
  for (const daemon of daemons) await daemon.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("TLS with a token: capture and read back", async () => {
  const tls = { rootCerts: readFileSync(pki.ca) };
  const daemon = await startDaemon({
    tcp: true, token: TOKEN, tls,
    extra: ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey],
  });
  daemons.push(daemon);
  const client = await connect({ address: daemon.address, token: TOKEN, tls });
  try {
    writeTree(daemon.workspace, { "a.txt": "over TLS" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-tls" });
    assert.equal(saved.fileCount, 1);
    const info = await client.getServerInfo();
    assert.equal(info.capabilities.tls, true);
  } finally {
    client.close();
  }
  // The daemon's certificate is not trusted without the CA: connect fails.
  await assert.rejects(
    connect({ address: daemon.address, token: TOKEN, tls: true, connectTimeoutMs: 2_000 }),
    (error) => error instanceof SandboxCheckpointError && error.code === "SANDBOX_SNAPSHOT_UNAVAILABLE",
  );
});

test("mutual TLS: the client certificate is the credential", async () => {
  const tls = {
    rootCerts: readFileSync(pki.ca),
    certChain: readFileSync(pki.clientCert),
    privateKey: readFileSync(pki.clientKey),
  };
  const daemon = await startDaemon({
    tcp: true, tls,
    extra: ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--tls-client-ca", pki.ca],
  });
  daemons.push(daemon);
  const client = await connect({ address: daemon.address, tls });
  try {
    writeTree(daemon.workspace, { "m.txt": "mutual" });
    const saved = await captureSandboxCheckpoint({ client, threadId: "t-mtls" });
    assert.ok(saved.id);
    assert.equal((await client.getServerInfo()).capabilities.mutualTls, true);
  } finally {
    client.close();
  }
});
